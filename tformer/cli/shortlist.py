"""``tformer shortlist``: build a lexical shortlist from a corpus's training pairs, for
``--shortlist`` in generate, evaluate, compare and serve."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from tformer.cli.app import app
from tformer.cli.console import console, err_console
from tformer.cli.data_options import checkpoint_family, data_of
from tformer.cli.options import (
    CHECKPOINT,
    CHECKPOINT_CHOICE,
    DATA,
    SOURCE_FIELD,
    TARGET_FIELD,
    load_chosen,
)
from tformer.data.prepare import text_splits
from tformer.decoding.shortlist import build_shortlist, check_sizes
from tformer.errors import DataError
from tformer.paths import check_output_file


@app.command("shortlist")
def shortlist_command(
    checkpoint: Path = CHECKPOINT,
    checkpoint_choice: str = CHECKPOINT_CHOICE,
    data: str | None = DATA,
    out: Path = typer.Option(..., "--out", "-o", help="The shortlist file to write."),
    source_field: str = SOURCE_FIELD,
    target_field: str = TARGET_FIELD,
    split: str = typer.Option("train", "--split", help="The split whose pairs are read."),
    per_word: int = typer.Option(
        50, "--per-word", help="Target tokens kept for each source token, the likeliest."
    ),
    frequent: int = typer.Option(
        100, "--frequent", help="The most frequent target tokens, always candidates."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out."),
) -> None:
    """Build a lexical shortlist: for each source token the target tokens it translates to
    (IBM Model 1 on the training pairs), and the most frequent target tokens.

    Decoding with --shortlist projects onto a batch's candidates instead of the whole target
    vocabulary: faster where the vocabulary-sized work dominates (large batches, small
    decoders; docs/distill.md).

    Example: tformer shortlist checkpoints/student --out checkpoints/student/shortlist.st
    """
    check_sizes(per_word, frequent)
    check_output_file(out, "--out", overwrite=overwrite)  # before any work
    checkpoint_family(checkpoint, "shortlist", "reads_source")
    data, source_field, target_field, _ = data_of(checkpoint, data, source_field, target_field)
    splits = text_splits(data, source_field=source_field, target_field=target_field)
    if split not in splits:
        raise DataError(
            f"--split {split}: not in --data {data} (splits: {', '.join(splits) or 'none'}; "
            "a prepared folder keeps no training text)"
        )
    pairs = splits[split]
    tokenizers = load_chosen(checkpoint, "cpu").tokenizers
    err_console.print(f"aligning {len(pairs):,} pairs of {escape(split)} …")
    sources = tokenizers.source.encode_batch([s for s, _ in pairs])
    targets = tokenizers.target.encode_batch([t for _, t in pairs])
    shortlist = build_shortlist(
        list(zip(sources, targets, strict=True)),
        tokenizers.source,
        tokenizers.target,
        per_word=per_word,
        frequent=frequent,
    )
    shortlist.save(out)
    console.print(
        f"wrote {escape(str(out))}: {per_word} target tokens per source token and the "
        f"{len(shortlist.frequent)} most frequent; decode with --shortlist {escape(str(out))}",
        soft_wrap=True,
    )
