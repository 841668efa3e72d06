"""A run's inputs: its tokenizers (given, trained, or shared across ranks) and encoded splits."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from tformer import checkpoint as ckpt
from tformer.config import ModelConfig
from tformer.data.pairs import EncodedSplit, encode_pairs
from tformer.data.sources import bundled_data_dir
from tformer.data.tokenizer import Tokenizer, train_tokenizer
from tformer.errors import CheckpointError, DataError
from tformer.training import distributed as dist_
from tformer.training.configs import TokenizerSpec
from tformer.training.distributed import World


def get_tokenizers(
    tokenizer_path: Path | None,
    texts: Sequence[tuple[str, str]],
    *,
    kind: str,
    vocab_size: int,
    shared: bool,
) -> ckpt.Tokenizers:
    """Load the given tokenizer, or train one on the training pairs."""
    if tokenizer_path is not None:
        tok = Tokenizer.load(tokenizer_path)
        return ckpt.Tokenizers(tok, tok)
    requested = {"kind": kind, "vocab_size": vocab_size, "shared": shared}
    if shared:
        tok = train_tokenizer((t for pair in texts for t in pair), kind=kind, vocab_size=vocab_size)
        return ckpt.Tokenizers(tok, tok, requested)
    source = train_tokenizer((s for s, _ in texts), kind=kind, vocab_size=vocab_size)
    target = train_tokenizer((t for _, t in texts), kind=kind, vocab_size=vocab_size)
    return ckpt.Tokenizers(source, target, requested)


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


def new_run_tokenizers(
    model: ModelConfig,
    spec: TokenizerSpec,
    path: Path | None,
    world: World,
    device: torch.device,
    pairs: Sequence[tuple[str, str]],
) -> tuple[ckpt.Tokenizers, ModelConfig]:
    """A new run's tokenizers (the one at ``path``, or trained on ``pairs`` as ``spec`` says)
    and its model config sized for them."""
    tokenizers = shared_tokenizers(
        world,
        device,
        lambda: get_tokenizers(
            path, pairs, kind=spec.kind, vocab_size=spec.vocab_size, shared=spec.shared
        ),
    )
    sized = dataclasses.replace(
        model,
        src_vocab_size=tokenizers.source.vocab_size,
        tgt_vocab_size=tokenizers.target.vocab_size,
        share_embeddings=model.share_embeddings and tokenizers.shared,
    )
    return tokenizers, sized


def check_same_tokenizer(path: Path, saved: ckpt.Checkpoint, option: str = "--resume") -> None:
    """A ``--tokenizer`` given on resume (or with ``--init-from``) must be the one the
    checkpoint was trained with: the data is never tokenised with another one."""
    given = Tokenizer.load(path).sha256()
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


def encode_splits(
    texts: Mapping[str, Sequence[tuple[str, str]]],
    tokenizers: ckpt.Tokenizers,
    max_len: int,
    data: str | None,
    *,
    strict: bool,
    cache_dir: Path | None = None,
    num_proc: int | None = None,
) -> dict[str, EncodedSplit]:
    """Every split as ids; pairs that do not fit are dropped and counted (refused if strict)."""
    where = f"--data {data or bundled_data_dir()}"
    splits = {
        name: encode_pairs(
            pairs,
            tokenizers.source,
            tokenizers.target,
            max_len,
            strict=strict,
            where=f"{where} ({name} split)",
            cache_dir=cache_dir,
            num_proc=num_proc,
            keep_texts=name != "train",  # only validation and test texts are read later
        )
        for name, pairs in texts.items()
    }
    train = splits["train"]
    if not train.pairs:
        if train.dropped_empty == train.dropped:
            raise DataError(
                f"{where}: every training pair ({train.dropped}) has an empty source or target; "
                "check --source-field / --target-field and the data"
            )
        too_long = train.dropped - train.dropped_empty
        raise DataError(
            f"{where}: no training pair fits --max-len {max_len}: {too_long} of "
            f"{train.dropped} are too long (the rest have an empty side); raise --max-len"
        )
    return splits
