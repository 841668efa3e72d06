"""``tformer export``: a checkpoint as a CTranslate2 or Hugging Face Marian folder."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from tformer.cli.app import app
from tformer.cli.console import console
from tformer.cli.options import CHECKPOINT, CHECKPOINT_CHOICE, say_chosen
from tformer.export import QUANTIZATIONS, TARGETS, export_checkpoint


@app.command("export")
def export_command(
    checkpoint: Path = CHECKPOINT,
    checkpoint_choice: str = CHECKPOINT_CHOICE,
    out: Path = typer.Argument(
        ..., help="The folder to create (absent or empty).", show_default=False
    ),
    to: str = typer.Option(
        ..., "--to", help=f"Target format: {' | '.join(TARGETS)}.", show_default=False
    ),
    quantization: str | None = typer.Option(
        None,
        "--quantization",
        help=f"CTranslate2 weights: {' | '.join(QUANTIZATIONS)} (default float32).",
        show_default=False,
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an earlier export in OUT (nothing else)."
    ),
) -> None:
    """Export a checkpoint for serving with CTranslate2 or Hugging Face transformers.

    OUT gets the model, the tokenizer file(s) and a README showing how to load and call it.
    The exported model behaves like tformer with no extra option: decoding starts from <bos>,
    and <pad> / <bos> are never predicted. Needs ctranslate2 or transformers (the "export"
    extra of tformer). See docs/export.md.

    Example: tformer export checkpoints/dates --to ctranslate2 exports/dates-ct2
    """
    folder = export_checkpoint(
        checkpoint, out, to=to, quantization=quantization, overwrite=overwrite
    )
    say_chosen()
    console.print(f"exported {escape(str(checkpoint))} --to {to} into {escape(str(folder))}")
