"""``tformer prepare``: tokenise a corpus ahead of training, with a progress bar."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from tformer.cli.app import app
from tformer.cli.console import console
from tformer.cli.options import (
    DATA,
    SEPARATE_VOCAB,
    SOURCE_FIELD,
    TARGET_FIELD,
    TOKENIZER_KIND,
    TOKENIZER_SAMPLE,
    VOCAB_SIZE,
    existing_file,
)
from tformer.cli.progress import TokenisingBar
from tformer.cli.train import MAX_PROCESSES
from tformer.data.prepare import prepare
from tformer.errors import ConfigError


@app.command("prepare")
def prepare_command(
    data: str | None = DATA,
    out: Path = typer.Option(..., "--out", "-o", help="The prepared folder to write."),
    source_field: str = SOURCE_FIELD,
    target_field: str = TARGET_FIELD,
    tokenizer: Path | None = typer.Option(
        None,
        "--tokenizer",
        help="tokenizer.json or SentencePiece model (.model / .spm) to use (default: train "
        "one on a sample).",
    ),
    tokenizer_kind: str = TOKENIZER_KIND,
    vocab_size: int = VOCAB_SIZE,
    separate_vocab: bool = SEPARATE_VOCAB,
    tokenizer_sample: int = TOKENIZER_SAMPLE,
    max_len: int = typer.Option(
        256, "--max-len", help="Drop pairs longer than this (train with the same or less)."
    ),
    strict: bool = typer.Option(False, "--strict", help="Refuse, not drop, pairs that do not fit."),
    streaming: bool = typer.Option(
        False,
        "--streaming",
        help="Read --data as a stream (a hub data set too large to download whole); the "
        "tokenizer is then trained on the first --tokenizer-sample pairs.",
    ),
    num_proc: int | None = typer.Option(
        None, "--num-proc", show_default=False, help="Worker processes that tokenise."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an earlier prepared folder at --out."
    ),
) -> None:
    """Tokenise a data set once into a folder that `tformer train --data DIR` memory-maps.

    Reads --data as train does, trains a tokenizer on a sample of the training pairs (or uses
    --tokenizer) and writes each split's token ids with a manifest of every file's SHA-256;
    training on the folder starts at once and holds only the pages a batch reads.
    Example: tformer prepare --data corpus --src-lang en --tgt-lang de --out corpus.prepared
    """
    existing_file(tokenizer, "--tokenizer")
    if num_proc is not None and not 1 <= num_proc <= MAX_PROCESSES:
        raise ConfigError(f"--num-proc {num_proc} must be from 1 to {MAX_PROCESSES}")
    with TokenisingBar() as bar:
        prepared = prepare(
            data,
            out,
            tokenizer=tokenizer,
            tokenizer_kind=tokenizer_kind,
            vocab_size=vocab_size,
            shared_vocab=not separate_vocab,
            tokenizer_sample=tokenizer_sample,
            max_len=max_len,
            strict=strict,
            overwrite=overwrite,
            source_field=source_field,
            target_field=target_field,
            progress=bar,
            num_proc=num_proc,
            streaming=streaming,
        )
    splits = prepared.manifest["splits"]
    counts = ", ".join(
        f"{name} {entry['pairs']:,}"
        + (f" ({entry['dropped']:,} dropped)" if entry["dropped"] else "")
        for name, entry in splits.items()
    )
    console.print(
        f"wrote {escape(str(out))}: {counts} pairs; vocabulary "
        f"{prepared.tokenizers[0].vocab_size:,}; train with --data {escape(str(out))}"
    )
