"""``tformer compare-runs``: training runs side by side, in one table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from tformer.analysis.run_plot import check_plot_path, plot_curves
from tformer.analysis.runs import Comparison, RunSummary, compare_runs
from tformer.cli.app import app
from tformer.cli.console import console, err_console
from tformer.cli.options import file_option
from tformer.metrics import perplexity_text

NONE = "-"


@app.command("compare-runs")
def compare_runs_command(
    runs: list[Path] = typer.Argument(
        ..., help="Run folders (or checkpoints inside them).", show_default=False
    ),
    plot: Path | None = typer.Option(
        None,
        "--plot",
        help="Draw the validation curves of all runs into this .png (.svg, .pdf).",
        show_default=False,
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the records as one JSON document instead of the table."
    ),
) -> None:
    """Compare training runs: architecture differences, size, speed, validation and test scores.

    One column per run. Only the architecture fields that differ between the runs are shown;
    tokens/s is the median of the logged training records; the best validation figures are the
    lowest loss and the highest BLEU / chrF over all evaluations; test scores come from the
    result cards `tformer evaluate` wrote into the run; the KV cache is the decoder's
    self-attention keys and values per generated token, in float32.

    Example: tformer compare-runs checkpoints/base checkpoints/pre-norm --plot curves.png
    """
    if plot is not None:
        check_plot_path(file_option(plot, "--plot"))
    comparison = compare_runs(runs)
    if plot is not None:
        plot_curves(comparison, plot)
    if as_json:
        typer.echo(json.dumps(comparison.to_json(), indent=2, ensure_ascii=False))
    else:
        console.print(runs_table(comparison))
    if plot is not None:
        err_console.print(f"wrote {escape(str(plot))}")


def runs_table(comparison: Comparison) -> Table:
    """One column per run, one row per figure (rows no run has a value for are left out)."""
    runs = comparison.runs
    table = Table(title=f"{len(runs)} runs", title_justify="left")
    table.add_column("", no_wrap=True)
    for run in runs:
        table.add_column(escape(run.name), justify="right")
    for name in comparison.differing:
        table.add_row(f"[bold]{name}[/]", *(_text(comparison.differences(r)[name]) for r in runs))
    for label, values in _figure_rows(runs):
        if any(v is not None for v in values):
            table.add_row(label, *(NONE if v is None else v for v in values))
    same = _same_count(runs, comparison.differing)
    table.caption = (
        f"{same} architecture fields the same in every run are not shown"
        if len(runs) > 1
        else "one run: no architecture differences to show"
    )
    return table


def _figure_rows(runs: list[RunSummary]) -> list[tuple[str, list[str | None]]]:
    rows: list[tuple[str, list[str | None]]] = [
        ("parameters", [f"{r.parameters:,}" for r in runs]),
        ("steps", [f"{r.steps:,}" for r in runs]),
        ("tokens/s (median)", [_fmt(r.tokens_per_s, ",.0f") for r in runs]),
        ("best val loss", [_best_loss(r) for r in runs]),
        ("best val BLEU", [_fmt(r.best_val_bleu, ".2f") for r in runs]),
        ("best val chrF", [_fmt(r.best_val_chrf, ".2f") for r in runs]),
        ("val exact match", [_fmt(r.exact_match, ".1%") for r in runs]),
    ]
    splits = sorted({s for r in runs for s in r.results})
    for split in splits:
        cards = [r.results.get(split, {}) for r in runs]
        rows += [
            (f"{split} BLEU", [_fmt(c.get("bleu"), ".2f") for c in cards]),
            (f"{split} chrF", [_fmt(c.get("chrf"), ".2f") for c in cards]),
            (f"{split} loss", [_fmt(c.get("loss"), ".4f") for c in cards]),
            (f"{split} perplexity", [_perplexity(c.get("perplexity")) for c in cards]),
            (f"{split} bits/char", [_fmt(c.get("bits_per_char"), ".4f") for c in cards]),
            (f"{split} masked acc.", [_fmt(c.get("masked_accuracy"), ".1%") for c in cards]),
            (f"{split} card step", [_fmt(c.get("step"), ",d") for c in cards]),
        ]
    kv = [_fmt(r.kv_cache_bytes_per_token, ",d") for r in runs]
    rows.append(("KV cache B/token", kv))
    return rows


def _best_loss(run: RunSummary) -> str | None:
    if run.best_val_loss is None:
        return None
    return f"{run.best_val_loss:.4f} (step {run.best_val_loss_step:,})"


def _perplexity(value: Any) -> str | None:
    return None if value is None else perplexity_text(value)


def _fmt(value: Any, spec: str) -> str | None:
    if value is None:
        return None
    if spec.endswith("d"):
        value = int(value)
    return format(value, spec)


def _text(value: Any) -> str:
    return NONE if value is None else escape(str(value))


def _same_count(runs: list[RunSummary], differing: list[str]) -> int:
    keys = {k for r in runs for k in r.architecture}
    return len(keys - set(differing))
