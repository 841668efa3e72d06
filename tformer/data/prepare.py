"""``prepare``: the job behind ``tformer prepare``, tokenising a corpus ahead of training.

Reads the data as ``train`` would, trains a tokenizer on a sample of the training pairs (or
takes the one given), then writes every split into a prepared folder (``tformer.data.prepared``)
that is renamed into place only when complete. ``tformer train --data DIR`` then starts at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tformer.data.columns import sample_rows
from tformer.data.fingerprint import FINGERPRINTED, fingerprint_of
from tformer.data.prepared import (
    PREPARED,
    Prepared,
    PrepareOptions,
    Progress,
    is_prepared,
    open_prepared,
    prepared_manifest,
    tokenizer_files,
    write_split,
)
from tformer.data.sources import SPLITS, TextPair, bundled_data_dir, load_text_pairs
from tformer.data.tokenizer import DEFAULT_TOKENIZER_SAMPLE, Tokenizer, train_tokenizer
from tformer.errors import ConfigError, DataError
from tformer.folders import written_files
from tformer.paths import file_sha256, inside


def tokenizers_for(
    pairs: Sequence[TextPair],
    *,
    kind: str = "bpe",
    vocab_size: int = 8000,
    shared: bool = True,
    sample: int = DEFAULT_TOKENIZER_SAMPLE,
    seed: int = 0,
) -> tuple[Tokenizer, Tokenizer]:
    """(source, target) tokenizers trained on ``sample`` pairs drawn from ``pairs`` (the same
    object twice when ``shared``)."""
    if sample < 1:
        raise ConfigError(f"--tokenizer-sample {sample} must be at least 1 pair")
    chosen = sample_rows(pairs, sample, seed)
    if shared:
        tok = train_tokenizer(
            (t for pair in chosen for t in pair), kind=kind, vocab_size=vocab_size
        )
        return tok, tok
    source = train_tokenizer((s for s, _ in chosen), kind=kind, vocab_size=vocab_size)
    target = train_tokenizer((t for _, t in chosen), kind=kind, vocab_size=vocab_size)
    return source, target


def prepare(
    data: str | None,
    out: Path,
    *,
    tokenizer: Path | None = None,
    tokenizer_kind: str = "bpe",
    vocab_size: int = 8000,
    shared_vocab: bool = True,
    tokenizer_sample: int = DEFAULT_TOKENIZER_SAMPLE,
    max_len: int = 256,
    strict: bool = False,
    overwrite: bool = False,
    source_field: str = "source",
    target_field: str = "target",
    progress: Progress | None = None,
) -> Prepared:
    """Tokenise ``data`` (as ``train --data`` reads it) into the prepared folder ``out``.

    Args:
        tokenizer: a tokenizer.json to use; else one is trained on ``tokenizer_sample``
            training pairs as ``tokenizer_kind``, ``vocab_size`` and ``shared_vocab`` say.
        max_len: pairs whose source, or target + <eos>, is longer are dropped (refused when
            ``strict``), as training drops them; train with the same ``--max-len`` or less.
        overwrite: replace an earlier prepared folder at ``out`` (nothing else is replaced).
        progress: called with (split, pairs done, pairs in split) as each slice is written.

    Raises:
        ConfigError: ``out`` cannot be written, or bad options.
        DataError: the data cannot be read, or no training pair fits ``max_len``.
    """
    if max_len < 2:
        raise ConfigError(f"--max-len {max_len} must be at least 2 (a token and <eos>)")
    _check_out(data, out, overwrite)
    texts = load_text_pairs(data, source_field=source_field, target_field=target_field)
    if tokenizer is not None:
        loaded = Tokenizer.load(tokenizer)
        tokenizers = (loaded, loaded)
    else:
        tokenizers = tokenizers_for(
            texts["train"],
            kind=tokenizer_kind,
            vocab_size=vocab_size,
            shared=shared_vocab,
            sample=tokenizer_sample,
        )
    where = f"--data {data or bundled_data_dir()}"
    with PREPARED.staging(out) as tmp:
        files = tokenizer_files(tokenizers)
        tokenizers[0].save(tmp / files["source"])
        if tokenizers[1] is not tokenizers[0]:
            tokenizers[1].save(tmp / files["target"])
        splits, hashes = {}, {}
        for name in SPLITS:
            if name not in texts:
                continue
            options = PrepareOptions(max_len, strict, f"{where} ({name} split)", progress)
            splits[name], written = write_split(tmp, name, texts[name], tokenizers, options)
            hashes.update(written)
            if name == "train" and not splits[name]["pairs"]:
                raise DataError(
                    f"{where}: no training pair fits --max-len {max_len} with both sides "
                    "non-empty; raise --max-len or check --source-field / --target-field"
                )
        fingerprint = fingerprint_of(
            data,
            {
                s: (splits[s]["text_pairs"], splits[s]["text_sha256"])
                for s in FINGERPRINTED
                if s in splits
            },
            source_field=source_field,
            target_field=target_field,
        )
        for name in set(files.values()):
            hashes[name] = _entry(tmp / name)
        manifest = prepared_manifest(
            data=data,
            fingerprint=fingerprint,
            max_len=max_len,
            tokenizers=tokenizers,
            splits=splits,
            hashes=hashes,
            fields={"source": source_field, "target": target_field},
        )
        (tmp / PREPARED.marker).write_text(
            PREPARED.marker_text(written_files(tmp), **manifest), encoding="utf-8"
        )
    return open_prepared(out, check_hashes=False)


def _entry(path: Path) -> dict[str, object]:
    return {"size": path.stat().st_size, "sha256": file_sha256(path)}


def _check_out(data: str | None, out: Path, overwrite: bool) -> None:
    if is_prepared(data):
        raise DataError(f"--data {data}: is already a prepared folder; train on it directly")
    PREPARED.check_out(out)
    if (
        data is not None
        and Path(data).expanduser().is_dir()
        and (inside(Path(data).expanduser(), out) or inside(out, Path(data).expanduser()))
    ):
        raise ConfigError(
            f"--out {out}: lies inside the data folder {data} (or holds it); choose a folder "
            "outside it"
        )
    PREPARED.check_replace(out, overwrite=overwrite)
