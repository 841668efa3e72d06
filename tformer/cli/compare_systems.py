"""``tformer compare-systems``: is B's translation of a test set significantly better than A's?"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from tformer.analysis.significance import (
    DEFAULT_SAMPLES,
    DEFAULT_SEED,
    MAX_SAMPLES,
    MIN_SAMPLES,
    PairedSignificance,
    SystemScore,
    compare_systems,
)
from tformer.cli.app import app
from tformer.cli.console import console
from tformer.errors import ConfigError

SYSTEM_HELP = (
    "a hypotheses file (one a line) or a folder `tformer evaluate` wrote (its hypotheses.txt, "
    "and the split its result.json names)"
)


@app.command("compare-systems")
def compare_systems_command(
    system_a: Path = typer.Argument(
        ..., metavar="A", help=f"The baseline: {SYSTEM_HELP}.", show_default=False
    ),
    system_b: Path = typer.Argument(
        ..., metavar="B", help="The system compared with it, given the same way.",
        show_default=False,
    ),
    references: Path | None = typer.Option(
        None,
        "--references",
        "-r",
        help="The references, one a line (default: the split an evaluate folder names, read "
        "from its data and checked against the card's data_sha256).",
        show_default=False,
    ),
    paired_bs: bool = typer.Option(
        False, "--paired-bs", help="Paired bootstrap resampling (Koehn 2004): the default."
    ),
    paired_ar: bool = typer.Option(
        False, "--paired-ar", help="Paired approximate randomisation (Riezler and Maxwell 2005)."
    ),
    n_samples: int | None = typer.Option(
        None,
        "--n-samples",
        help=f"Bootstrap resamples (default {DEFAULT_SAMPLES['bs']:,}) or randomisation trials "
        f"(default {DEFAULT_SAMPLES['ar']:,}), from {MIN_SAMPLES} to {MAX_SAMPLES:,}.",
        show_default=False,
    ),
    seed: int = typer.Option(
        DEFAULT_SEED, "--seed", help="Seed of the resampling (at least 1): the same figures again."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the result as one JSON document instead of the table."
    ),
) -> None:
    """Compare two systems' translations of one test set: BLEU and chrF of each (with their
    sacreBLEU signatures), the difference B - A, each score's 95% confidence interval and the
    p-value of sacreBLEU's paired test, then one line saying whether B differs significantly
    from A at p < 0.05.

    Examples:

      tformer compare-systems checkpoints/base/eval-test checkpoints/big/eval-test

      tformer compare-systems a.txt b.txt --references ref.txt --paired-ar --json
    """
    if paired_bs and paired_ar:
        raise ConfigError("give --paired-bs or --paired-ar, not both")
    result = compare_systems(
        system_a, system_b, references=references, test="ar" if paired_ar else "bs",
        n_samples=n_samples, seed=seed,
    )  # fmt: skip
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
        return
    console.print(significance_table(result))
    for m in result.metrics:
        console.print(f"{m.metric} signature: {escape(m.signature)}", soft_wrap=True)
    console.print(escape(result.verdict()), soft_wrap=True)


def significance_table(result: PairedSignificance) -> Table:
    """One row per metric: A, B (score and the bootstrap's mean +- half interval), B - A, p."""
    table = Table(
        title=escape(
            f"{result.method}, {result.n_samples:,} samples, seed {result.seed}, "
            f"{result.lines:,} lines of {result.references}"
        ),
        title_justify="left",
        caption=escape(f"A = {result.system_a}\nB = {result.system_b}"),
        caption_justify="left",
    )
    table.add_column("metric")
    table.add_column("A (μ ± 95% CI)", justify="right")
    table.add_column("B (μ ± 95% CI)", justify="right")
    table.add_column("B - A", justify="right")
    table.add_column("p-value", justify="right")
    for m in result.metrics:
        star = " *" if m.significant else ""
        table.add_row(
            m.metric, _score(m.a), _score(m.b), f"{m.difference:+.2f}", f"{m.p_value:.4f}{star}"
        )
    return table


def _score(score: SystemScore) -> str:
    return f"{score.score:.2f} ({score.mean:.2f} ± {score.ci:.2f})"
