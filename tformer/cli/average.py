"""``tformer average``: average the weights of several checkpoints of one run."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from tformer.checkpoint import average_checkpoints
from tformer.cli import app
from tformer.cli.console import console


@app.command("average")
def average_command(
    checkpoints: list[Path] = typer.Argument(
        ..., help="Checkpoint folders of one architecture.", show_default=False
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Run folder to write the average into.", show_default=False
    ),
) -> None:
    """Average model weights (Vaswani et al. average the last checkpoints; often +0.5 BLEU).

    Example: tformer average checkpoints/mt/step-009000 checkpoints/mt/step-010000 -o avg
    """
    folder = average_checkpoints(checkpoints, out)
    console.print(f"averaged {len(checkpoints)} checkpoints into {escape(str(folder))}")
