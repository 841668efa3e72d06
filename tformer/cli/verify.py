"""``tformer verify``: check a checkpoint's files, hashes, headers, config and tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from tformer.checkpoint.files import CONFIG, MANIFEST
from tformer.checkpoint.run_dir import BEST, is_checkpoint_dir, is_run_dir, step_dirs
from tformer.checkpoint.verify import Check, verify_checkpoint
from tformer.cli.app import app
from tformer.cli.console import console
from tformer.cli.options import CHECKPOINT
from tformer.errors import CheckpointError


@app.command("verify")
def verify_command(
    checkpoint: Path = CHECKPOINT,
    every: bool = typer.Option(
        False, "--all", help="Check every step-* checkpoint of a run folder (and best/)."
    ),
) -> None:
    """Check a checkpoint's files, hashes, headers, config and tokenizer; exit 4 on a problem.

    Nothing in the checkpoint is trusted: the manifest, each file's size and SHA-256, the
    config.json against the configuration recorded in the weights, the safetensors headers
    against config.json (names, shapes, float32 dtypes), the tokenizer binding (hash, special ids,
    vocabulary size against the embeddings), the training state, and a strict load. One row per
    check; exit 0 when all pass, 4 otherwise, with the first problem on stderr. With --all, a
    step-* folder in which tformer wrote nothing (only a user's files) is listed as skipped.

    Example: tformer verify checkpoints/dates --all
    """
    targets = _targets(checkpoint) if every else [checkpoint]
    failed: list[str] = []
    if every and targets and all(_not_a_checkpoint(t) for t in targets):
        raise CheckpointError(
            f"{checkpoint}: holds no tformer checkpoint (its step-* folders hold only files "
            "tformer did not write)"
        )
    for target in targets:
        if every and _not_a_checkpoint(target):
            console.print(
                f"{escape(str(target))}: [yellow]skipped[/]: not a tformer checkpoint (no "
                f"{MANIFEST}, no tformer {CONFIG}); it holds only files tformer did not write"
            )
            continue
        folder, checks = verify_checkpoint(target)
        console.print(_table(folder, checks))
        failed += [c.detail for c in checks if not c.ok]
    if failed:
        more = f" (and {len(failed) - 1} more problems)" if len(failed) > 1 else ""
        raise CheckpointError(f"{failed[0]}{more}")


def _not_a_checkpoint(folder: Path) -> bool:
    """A ``step-*`` or ``best`` folder in which tformer wrote nothing (what ``--overwrite`` or
    pruning left of a checkpoint: a user's files), as opposed to a damaged checkpoint."""
    if folder.is_symlink() or not folder.is_dir() or is_run_dir(folder):  # best/ is a run
        return False
    return not os.path.lexists(folder / MANIFEST) and not is_checkpoint_dir(folder)


def _targets(run: Path) -> list[Path]:
    found = step_dirs(run) if run.is_dir() else []
    best = run / BEST
    found += [best] if best.is_dir() else []
    return found or [run]


def _table(folder: Path, checks: list[Check]) -> Table:
    bad = sum(not c.ok for c in checks)
    verdict = "[green]ok[/]" if not bad else f"[red]{bad} problem{'s' * (bad > 1)}[/]"
    table = Table(title=f"{escape(str(folder))}: {verdict}", title_justify="left")
    table.add_column("check")
    table.add_column("", justify="center")
    table.add_column("detail", overflow="fold")
    for check in checks:
        mark = "[green]✓[/]" if check.ok else "[red]✗[/]"
        table.add_row(escape(check.name), mark, escape(check.detail))
    return table
