"""``tformer shrink``: a model with fewer layers, started from a checkpoint's own."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from tformer.checkpoint.shrinking import shrink_checkpoint
from tformer.cli.app import app
from tformer.cli.console import console


@app.command("shrink")
def shrink_command(
    checkpoint: Path = typer.Argument(
        ..., help="The checkpoint (or run folder's latest) to take layers from.",
        show_default=False,
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="A new run folder for the smaller model.", show_default=False
    ),
    n_encoder_layers: int | None = typer.Option(
        None, "--n-encoder-layers", help="Encoder layers to keep (default: all).",
        show_default=False,
    ),
    n_decoder_layers: int | None = typer.Option(
        None, "--n-decoder-layers", help="Decoder layers to keep (default: all).",
        show_default=False,
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace the tformer run in --out (only files tformer wrote)."
    ),
) -> None:
    """Start a smaller student from a teacher: keep a spread of its layers (the first, the
    last and evenly between), its embeddings, norms and tokenizer.

    Train the result on the teacher's translations with `train --init-from OUT`
    (docs/distill.md). Example: tformer shrink teacher --n-decoder-layers 1 -o student-init
    """
    folder = shrink_checkpoint(
        checkpoint,
        out,
        n_encoder_layers=n_encoder_layers,
        n_decoder_layers=n_decoder_layers,
        overwrite=overwrite,
    )
    console.print(f"wrote {escape(str(folder))}: train it with --init-from", soft_wrap=True)
