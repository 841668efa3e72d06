"""``tformer average``: average the weights of several checkpoints of one run."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from tformer.checkpoint.averaging import average_checkpoints
from tformer.cli.app import app
from tformer.cli.console import console


@app.command("average")
def average_command(
    checkpoints: list[Path] = typer.Argument(
        ..., help="Checkpoint folders of one architecture.", show_default=False
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="A new run folder to write the average into.", show_default=False
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace the tformer run in --out (only files tformer wrote)."
    ),
) -> None:
    """Average model weights (Vaswani et al. average the last checkpoints; often +0.5 BLEU).

    --out must be new or empty: the average never writes over a run's checkpoints.
    Example: tformer average checkpoints/mt/step-009000 checkpoints/mt/step-010000 -o avg
    """
    folder = average_checkpoints(checkpoints, out, overwrite=overwrite)
    console.print(f"averaged {len(checkpoints)} checkpoints into {escape(str(folder))}")
