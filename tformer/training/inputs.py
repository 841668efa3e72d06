"""A run's inputs: its tokenizers (given, trained, or shared across ranks) and encoded splits."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tformer import checkpoint as ckpt
from tformer.config import MASK, MASK_ID, ModelConfig, TrainConfig, family_record
from tformer.data.fingerprint import fingerprint
from tformer.data.lm import bundled_text_dir, lm_examples, load_texts
from tformer.data.pairs import EncodedSplit, encode_pairs, no_training_pairs
from tformer.data.prepare import (
    TextSource,
    TokenizerRequest,
    cached_prepared,
    streamed_prepared,
    tokenizers_for,
)
from tformer.data.prepared import PREPARED, Prepared, Progress, is_prepared, open_prepared
from tformer.data.prepared_write import PrepareOptions
from tformer.data.sources import bundled_data_dir, load_text_pairs
from tformer.data.spm import load_tokenizer
from tformer.data.store import as_store
from tformer.data.tokenizer import DEFAULT_TOKENIZER_SAMPLE, Tokenizer
from tformer.errors import CheckpointError, ConfigError, DataError
from tformer.training import distributed as dist_
from tformer.training.configs import TokenizerSpec
from tformer.training.distributed import World
from tformer.training.launch import RunOptions


def get_tokenizers(
    tokenizer_path: Path | None,
    texts: Sequence[tuple[str, str]],
    *,
    kind: str,
    vocab_size: int,
    shared: bool,
    sample: int = DEFAULT_TOKENIZER_SAMPLE,
    specials: tuple[str, ...] = (),
) -> ckpt.Tokenizers:
    """Load the given tokenizer, or train one on (a sample of ``sample``) training pairs
    (with ``specials`` after tformer's four, e.g. a masked LM's <mask>)."""
    if tokenizer_path is not None:
        tok = load_tokenizer(tokenizer_path)
        return ckpt.Tokenizers(tok, tok)
    requested = {"kind": kind, "vocab_size": vocab_size, "shared": shared}
    source, target = tokenizers_for(
        texts, kind=kind, vocab_size=vocab_size, shared=shared, sample=sample, specials=specials
    )
    return ckpt.Tokenizers(source, target, requested)


@dataclass(frozen=True)
class RunData:
    """The data of a run: text pairs read from ``--data``, or a prepared folder."""

    texts: Mapping[str, Sequence[tuple[str, str]]] | None
    prepared: Prepared | None
    fingerprint: dict[str, Any]  # saved with each checkpoint; compared on resume


def load_data(
    cfg: TrainConfig,
    options: RunOptions,
    spec: TokenizerSpec,
    base: ckpt.Checkpoint | None,
    max_len: int,
    progress: Progress | None = None,
    arch: str = "encoder-decoder",
) -> RunData:
    """Read ``--data``: a prepared folder is checked file by file; a stream (``--streaming``)
    is prepared into the id cache as it is read (with the tokenizers of ``base``, else
    trained on its first pairs as ``spec`` says); anything else is loaded. A language model
    (``arch`` decoder-only or encoder-only) reads documents, kept as (text, "") pairs."""
    if family_record(arch).reads == "documents":
        return _load_documents(cfg, arch, max_len)
    if cfg.block_size is not None:
        raise ConfigError(
            "--block-size cuts a language model's text into blocks; a translation model reads "
            "pairs: leave it out (or train --arch decoder-only / encoder-only)"
        )
    if is_prepared(cfg.data):
        assert cfg.data is not None
        prepared = open_prepared(cfg.data)
        return RunData(None, prepared, prepared.fingerprint())
    source = TextSource(cfg.data, cfg.source_field, cfg.target_field)
    if cfg.streaming:
        if options.tokenized_cache is None:
            raise ConfigError("--streaming tokenises into the id cache; leave out --no-cache")
        given = None
        if base is not None:
            given = (base.tokenizers.source, base.tokenizers.target)
        elif options.tokenizer is not None:
            given = (load_tokenizer(options.tokenizer),) * 2
        request = TokenizerRequest(spec.kind, spec.vocab_size, spec.shared, spec.sample)
        opts = PrepareOptions(max_len, progress=progress, num_proc=options.num_proc)
        prepared = streamed_prepared(
            options.tokenized_cache, source, opts, given=given, spec=request
        )
        return RunData(None, prepared, prepared.fingerprint())
    fields = {"source_field": cfg.source_field, "target_field": cfg.target_field}
    texts = load_text_pairs(cfg.data, **fields)
    return RunData(texts, None, fingerprint(cfg.data, texts, **fields))


def check_prepared_options(
    train: TrainConfig, spec: TokenizerSpec, num_proc: int | None, given: Sequence[str] = ()
) -> None:
    """Refuse, when ``--data`` is a prepared folder, the options it makes meaningless: a way
    to train the tokenizer other than the folder's, a way to read or tokenise the text, and
    fields other than those it was prepared from. ``given``: the tokenizer flags given
    explicitly, which are checked even at their default value; values that agree with how
    the folder was prepared are accepted.

    Raises:
        ConfigError: naming the folder and every such option.
    """
    if not is_prepared(train.data):
        return
    assert train.data is not None
    marker = PREPARED.read_marker(Path(train.data).expanduser()) or {}
    found = marker.get("tokenizer_request")
    asked: dict[str, Any] = found if isinstance(found, dict) else {}
    default = TokenizerSpec()
    wrong = []
    for name, option in TOKENIZER_FLAGS.items():
        value = getattr(spec, name)
        if (value == getattr(default, name) and option not in given) or asked.get(name) == value:
            continue
        if name == "shared":  # the flag is --separate-vocab: shared False
            wrong.append(option)
        else:
            was = f" (it was prepared with {asked[name]})" if name in asked else ""
            wrong.append(f"{option} {value}{was}")
    if train.streaming:
        wrong.append("--streaming")
    if num_proc is not None:
        wrong.append("--num-proc")
    named = marker.get("fields")
    fields: dict[str, Any] = named if isinstance(named, dict) else {}
    for side, value, alias in (
        ("source", train.source_field, "--src-lang"),
        ("target", train.target_field, "--tgt-lang"),
    ):
        if value not in (side, fields.get(side)):
            was = f" (it was prepared with {fields[side]})" if side in fields else ""
            wrong.append(f"--{side}-field ({alias}) {value}{was}")
    if wrong:
        them = "it" if len(wrong) == 1 else "them"
        raise ConfigError(
            f"--data {train.data} is a prepared folder: its tokenizer, fields and ids were fixed "
            f"by `tformer prepare`, so {'; '.join(wrong)} would do nothing; leave {them} out, "
            f"or prepare the data again with {them}"
        )


# How each way of training a tokenizer is asked for on the command line.
TOKENIZER_FLAGS = {
    "kind": "--tokenizer-kind",
    "vocab_size": "--vocab-size",
    "shared": "--separate-vocab",
    "sample": "--tokenizer-sample",
}


def _load_documents(cfg: TrainConfig, arch: str, max_len: int) -> RunData:
    if cfg.block_size is not None and cfg.block_size > max_len:
        raise ConfigError(
            f"--block-size {cfg.block_size} is larger than --max-len {max_len}: the model has "
            "no positions past --max-len; lower --block-size or raise --max-len"
        )
    if cfg.streaming or is_prepared(cfg.data):
        what = "--streaming" if cfg.streaming else f"--data {cfg.data} (a prepared folder)"
        raise ConfigError(
            f"{what} holds translation pairs; a --arch {arch} model reads text: give a .txt "
            "file or folder, a JSONL/CSV/Parquet file with --text-field, or a hub data set"
        )
    if cfg.val_bleu:
        raise ConfigError(
            f"--val-bleu translates validation pairs; a --arch {arch} model has none (its "
            "validation loss and perplexity are reported): leave out --val-bleu"
        )
    docs = load_texts(cfg.data, cfg.text_field)
    texts = {name: [(doc, "") for doc in rows] for name, rows in docs.items()}
    spec = cfg.data if cfg.data is not None else str(bundled_text_dir())
    return RunData(texts, None, fingerprint(spec, texts, source_field=cfg.text_field))


def lm_splits(
    texts: Mapping[str, Sequence[tuple[str, str]]],
    tokenizer: Tokenizer,
    config: ModelConfig,
    *,
    pack: bool,
    data: str | None,
    block_size: int | None = None,
) -> dict[str, EncodedSplit]:
    """A language model's splits: each document tokenised, then made into examples of
    ``config.arch`` (packed into blocks of ``block_size`` or ``max_len``, or one a row)."""
    splits: dict[str, EncodedSplit] = {}
    block = block_size or config.max_len
    for name, rows in texts.items():
        docs = tokenizer.encode_batch([doc for doc, _ in rows])
        examples = lm_examples(
            docs, config.arch, block, pack=pack, document_bos=config.document_bos
        )
        splits[name] = EncodedSplit(as_store(examples), [], 0)
    if not splits["train"].pairs:
        where = f"--data {data}" if data else "the bundled text"
        raise DataError(f"{where}: the train split has no tokens to learn from")
    return splits


def prepared_tokenizers(
    prepared: Prepared, *, given: Path | None, base: ckpt.Checkpoint | None, option: str
) -> ckpt.Tokenizers:
    """The tokenizers a prepared folder was made with, which a ``--tokenizer`` given and the
    checkpoint continued from (``option``: --resume or --init-from) must be: ids are never
    read with another tokenizer than the one that made them."""
    source, target = prepared.tokenizers
    if given is not None and load_tokenizer(given).sha256() not in (source.sha256(),):
        raise DataError(
            f"--tokenizer {given} is not the tokenizer {prepared.folder} was prepared with; "
            "leave out --tokenizer (the folder's is used) or prepare again with it"
        )
    if base is not None:
        theirs = (base.tokenizers.source.sha256(), base.tokenizers.target.sha256())
        if theirs != (source.sha256(), target.sha256()):
            raise DataError(
                f"--data {prepared.folder} was prepared with another tokenizer than the "
                f"checkpoint of {option} ({base.path}); prepare it again with "
                f"--tokenizer {base.path / base.tokenizers.files()['source']}"
            )
        return base.tokenizers
    return ckpt.Tokenizers(source, source if target is source else target)


def shared_tokenizers(
    world: World, device: torch.device, make: Callable[[], ckpt.Tokenizers]
) -> ckpt.Tokenizers:
    """The tokenizers, made once on rank 0 and sent to the other ranks as JSON text."""
    if not world.distributed:
        return make()
    made = make() if world.is_main else None
    source = dist_.broadcast_text(made.source.to_str() if made else None, world, device)
    shared = dist_.broadcast_text(
        ("shared" if made.shared else made.target.to_str()) if made else None, world, device
    )
    if made is not None:
        return made
    src = Tokenizer.from_str(source)
    return ckpt.Tokenizers(src, src if shared == "shared" else Tokenizer.from_str(shared))


def run_tokenizers(
    spec: TokenizerSpec,
    path: Path | None,
    world: World,
    device: torch.device,
    texts: Mapping[str, Sequence[tuple[str, str]]],
    specials: tuple[str, ...] = (),
) -> ckpt.Tokenizers:
    """A new run's tokenizers: the one at ``path``, or trained on the training pairs as
    ``spec`` says (once, on rank 0)."""
    return shared_tokenizers(
        world,
        device,
        lambda: get_tokenizers(
            path,
            texts["train"],
            kind=spec.kind,
            vocab_size=spec.vocab_size,
            shared=spec.shared,
            sample=spec.sample,
            specials=specials,
        ),
    )


def check_mask_token(tokenizer: Tokenizer, path: Path | None) -> None:
    """A masked language model needs <mask> at id 4 (tformer trains it there for one)."""
    if tokenizer.inner.token_to_id(MASK) != MASK_ID:
        where = f"--tokenizer {path}" if path else "the tokenizer"
        raise ConfigError(
            f"{where} has no {MASK} token at id {MASK_ID}, which --arch encoder-only needs; "
            "leave out --tokenizer to train one with it"
        )


def sized_for(model: ModelConfig, tokenizers: ckpt.Tokenizers) -> ModelConfig:
    """``model`` with the vocabulary sizes (and sharing) of ``tokenizers``."""
    return dataclasses.replace(
        model,
        src_vocab_size=tokenizers.source.vocab_size,
        tgt_vocab_size=tokenizers.target.vocab_size,
        share_embeddings=model.share_embeddings and tokenizers.shared,
    )


def check_same_tokenizer(path: Path, saved: ckpt.Checkpoint, option: str = "--resume") -> None:
    """A ``--tokenizer`` given on resume (or with ``--init-from``) must be the one the
    checkpoint was trained with: the data is never tokenised with another one."""
    given = load_tokenizer(path).sha256()
    files = saved.tokenizers.files()
    for side, tok in (("source", saved.tokenizers.source), ("target", saved.tokenizers.target)):
        if given != tok.sha256():
            fix = (
                "resume with the saved one"
                if option == "--resume"
                else "tokenise the data with the checkpoint's own"
            )
            raise CheckpointError(
                f"--tokenizer {path} differs from {saved.path / files[side]}, which the "
                f"checkpoint of {option} was trained with; drop --tokenizer to {fix}"
            )


def prepared_splits(
    prepared: Prepared, max_len: int, *, strict: bool
) -> dict[str, EncodedSplit]:
    """A prepared folder's splits, memory-mapped; pairs over ``max_len`` are dropped."""
    splits = {name: prepared.split(name, max_len, strict=strict) for name in prepared.splits}
    train = splits["train"]
    if not train.pairs:
        raise no_training_pairs(
            f"--data {prepared.folder}", train.dropped, train.dropped_empty, max_len
        )
    return splits


def encode_splits(
    texts: Mapping[str, Sequence[tuple[str, str]]],
    tokenizers: ckpt.Tokenizers,
    max_len: int,
    data: str | None,
    *,
    strict: bool,
    cache_dir: Path | None = None,
    num_proc: int | None = None,
    known: Mapping[str, tuple[int, str]] | None = None,
    progress: Progress | None = None,
) -> dict[str, EncodedSplit]:
    """Every split as ids; pairs that do not fit are dropped and counted (refused if strict).

    With ``cache_dir`` the splits are prepared there once (``tformer.data.prepare``: keyed by
    every text, the tokenizers and ``max_len``) and memory-mapped; ``known`` gives the (pairs,
    SHA-256) of splits the run has hashed already. ``strict`` tokenises in memory, so that a
    pair that does not fit is named.
    """
    where = f"--data {data or bundled_data_dir()}"
    if cache_dir is not None and not strict:
        prepared = cached_prepared(
            cache_dir,
            texts,
            (tokenizers.source, tokenizers.target),
            TextSource(data),
            PrepareOptions(max_len, where=where, progress=progress, num_proc=num_proc),
            known,
        )
        return prepared_splits(prepared, max_len, strict=False)
    splits = {
        name: encode_pairs(
            pairs,
            tokenizers.source,
            tokenizers.target,
            max_len,
            strict=strict,
            where=f"{where} ({name} split)",
            keep_texts=name != "train",  # only validation and test texts are read later
        )
        for name, pairs in texts.items()
    }
    train = splits["train"]
    if not train.pairs:
        raise no_training_pairs(where, train.dropped, train.dropped_empty, max_len)
    return splits
