"""A run's inputs: its tokenizers (given, trained, or shared across ranks) and encoded splits."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from tformer import checkpoint as ckpt
from tformer.data.pairs import EncodedSplit, encode_pairs
from tformer.data.sources import bundled_data_dir
from tformer.data.tokenizer import Tokenizer, train_tokenizer
from tformer.errors import CheckpointError, DataError
from tformer.training import distributed as dist_
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


def check_same_tokenizer(path: Path, resumed: ckpt.Checkpoint) -> None:
    """A ``--tokenizer`` given on resume must be the one the run was trained with."""
    given = Tokenizer.load(path)
    saved = resumed.tokenizers.source
    if given.sha256() != saved.sha256():
        name = resumed.tokenizers.files()["source"]
        raise CheckpointError(
            f"--tokenizer {path} differs from {resumed.path / name}, which the run was trained "
            "with; drop --tokenizer to resume with the saved one"
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
