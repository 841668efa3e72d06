"""``tformer ablate``: rank attention heads by what masking each one costs, and prune."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.style import Style
from rich.table import Table
from rich.text import Text

from tformer.analysis.ablate import METRICS, Ablation
from tformer.analysis.measures import Examples, ablate, check_ablation_metric
from tformer.analysis.run_plot import PLOT_SUFFIXES, check_plot_path
from tformer.checkpoint.files import write_text_atomic
from tformer.checkpoint.store import Checkpoint
from tformer.cli.app import app
from tformer.cli.console import console, err_console
from tformer.cli.data_options import (
    LIMIT,
    TEXT_FIELD,
    check_limit,
    checkpoint_family,
    data_of,
    split_examples,
)
from tformer.cli.decoding_options import decoding_config, decoding_parameters
from tformer.cli.options import (
    BATCH_SIZE,
    CHECKPOINT,
    CHECKPOINT_CHOICE,
    DATA,
    DEVICE,
    SOURCE_FIELD,
    TARGET_FIELD,
    check_batch_size,
    file_option,
    load_chosen,
    with_parameters,
)
from tformer.cli.render import weight_color
from tformer.config.families import family_record
from tformer.decoding.settings import DecodingConfig
from tformer.errors import CheckpointError, ConfigError
from tformer.model.heads import PARTS, all_heads
from tformer.paths import check_replaceable

SAVE_SUFFIXES = (*PLOT_SUFFIXES, ".json")


@app.command("ablate")
@with_parameters(decoding_parameters("max_new_tokens"), after="as_json")
def ablate_command(
    checkpoint: Path = CHECKPOINT,
    checkpoint_choice: str = CHECKPOINT_CHOICE,
    data: str | None = DATA,
    source_field: str = SOURCE_FIELD,
    target_field: str = TARGET_FIELD,
    text_field: str = TEXT_FIELD,
    split: str = typer.Option(
        "validation", "--split", help="train, validation or test (choose heads on held-out data)."
    ),
    limit: int | None = LIMIT,
    metric: str = typer.Option(
        "loss",
        "--metric",
        help="loss: teacher-forced loss increase. bleu: sacreBLEU drop of greedy translations "
        "(slower: one translation of the split per head; use --limit).",
    ),
    prune: bool = typer.Option(
        False, "--prune-curve", help="Also prune the least important heads greedily, step by step."
    ),
    prune_step: float = typer.Option(
        0.1, "--prune-step", help="Share of all heads removed per pruning step."
    ),
    top: int = typer.Option(20, "--top", help="Rows of the ranking table (0: every head)."),
    save: Path | None = typer.Option(
        None,
        "--save",
        help="Also write the result: .json (every number), or .png/.svg/.pdf (heatmaps and the "
        "pruning curve).",
        show_default=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON only."),
    batch_size: int = BATCH_SIZE,
    device: str = DEVICE,
    **values: Any,
) -> None:
    """Mask each attention head in turn and rank the heads by how much worse the model gets.

    A masked head's output is zeroed before W^O (Michel et al. 2019). The heatmap shows the
    importance of every head, layer by layer; --prune-curve removes the least important
    heads step by step and reports quality against the share removed.

    Examples:

      tformer ablate checkpoints/dates --limit 300

      tformer ablate checkpoints/dates --metric bleu --limit 100 --prune-curve --save heads.png
    """
    _check_options(metric, limit, prune_step, top, save)
    check_batch_size(batch_size)
    family = checkpoint_family(checkpoint, "ablate")
    check_ablation_metric(family_record(family.family), metric)  # before any data is read
    data, source_field, target_field, text_field = data_of(
        checkpoint, data, source_field, target_field, text_field
    )
    examples = split_examples(
        data, split, pairs=family.reads_source, source_field=source_field,
        target_field=target_field, text_field=text_field, limit=limit,
    )  # fmt: skip
    unit = "pairs" if family.reads_source else "documents"
    ckpt = load_chosen(checkpoint, device)
    result = _ablate(
        ckpt, examples, f"{len(examples):,} {unit} of {split}", metric=metric,
        prune_step=prune_step if prune else None, decoding=decoding_config(values),
        batch_size=batch_size,
    )  # fmt: skip
    record = {"checkpoint": str(ckpt.path), "data": data, "split": split, **result.to_dict()}
    if save is not None:
        _save(save, result, record)
    if as_json:
        console.print_json(json.dumps(record))
        return
    _show(result, top)
    if save is not None:
        err_console.print(f"wrote {escape(str(save))}", soft_wrap=True)


def _ablate(
    ckpt: Checkpoint,
    examples: Examples,
    measured: str,
    *,
    metric: str,
    prune_step: float | None,
    decoding: DecodingConfig,
    batch_size: int,
) -> Ablation:
    """Mask each head in turn (then prune, given ``prune_step``), saying on stderr what is
    ``measured`` and showing there a bar of the heads done so far."""
    heads = len(all_heads(ckpt.model))
    err_console.print(
        f"masking each of {heads} heads in turn on {measured} "
        f"({metric}{', then pruning' if prune_step is not None else ''}) …"
    )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as progress:
        task = progress.add_task("heads", total=heads)
        return ablate(
            ckpt,
            examples,
            metric=metric,
            prune_step=prune_step,
            decoding=decoding,
            batch_size=batch_size,
            on_head=lambda _: progress.advance(task),
        )


def _show(result: Ablation, top: int) -> None:
    """The ranking, the heatmap of every head and, with --prune-curve, the pruning table."""
    console.print(ranking_table(result, top))
    console.print(importance_heatmap(result))
    if result.prune_curve:
        console.print(prune_table(result))


def _check_options(
    metric: str, limit: int | None, prune_step: float, top: int, save: Path | None
) -> None:
    if metric not in METRICS:
        raise ConfigError(f"--metric {metric!r} must be one of {', '.join(METRICS)}")
    check_limit(limit)
    if not 0.0 < prune_step <= 1.0:
        raise ConfigError(f"--prune-step {prune_step} must be in (0, 1]")
    if top < 0:
        raise ConfigError(f"--top {top} must be >= 0")
    if save is not None:
        if save.suffix.lower() == ".json":
            check_replaceable(save, "--save", ConfigError)
            file_option(save, "--save")
        elif save.suffix.lower() in PLOT_SUFFIXES:
            check_plot_path(save, "--save")
        else:
            raise ConfigError(
                f"--save {save}: unsupported file type; use one of {', '.join(SAVE_SUFFIXES)}"
            )


def _save(path: Path, result: Ablation, record: dict[str, object]) -> None:
    if path.suffix.lower() != ".json":
        from tformer.analysis.ablation_plot import plot_ablation  # matplotlib: only here

        plot_ablation(result, path)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(record, indent=2) + "\n")
    except OSError as error:
        raise CheckpointError(
            f"--save {path}: cannot be written ({error.strerror or error}); give a writable path"
        ) from error


def _fmt(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def ranking_table(result: Ablation, top: int) -> Table:
    bleu = result.metric == "bleu"
    shown = result.effects if top == 0 else result.effects[:top]
    base = result.baseline
    title = (
        f"{len(result.effects)} heads by importance ({'BLEU drop' if bleu else 'loss increase'} "
        f"when masked alone), {result.pairs:,} {result.unit}; baseline loss {base.loss:.4f}"
        + (f", BLEU {base.bleu:.2f}, chrF {base.chrf:.2f}" if bleu else "")
    )
    table = Table(title=title, title_justify="left")
    for name in ("rank", "head", "part", "importance", "loss masked"):
        table.add_column(name, justify="left" if name in ("head", "part") else "right")
    if bleu:
        table.add_column("BLEU masked", justify="right")
        table.add_column("chrF masked", justify="right")
    for rank, effect in enumerate(shown, 1):
        row = [
            str(rank),
            effect.head,
            PARTS[effect.part],
            f"{effect.importance:+.4f}",
            f"{effect.quality.loss:.4f}",
        ]
        if bleu:
            row += [_fmt(effect.quality.bleu, 2), _fmt(effect.quality.chrf, 2)]
        table.add_row(*row)
    if len(shown) < len(result.effects):
        table.caption = f"{len(result.effects) - len(shown)} more heads: --top 0 shows every one"
    return table


def importance_heatmap(result: Ablation) -> RenderableType:
    """One grid per part, layers down and heads across, coloured by importance (brightest:
    the most important head of the model; negative importance: dark)."""
    values = [e.importance for e in result.effects]
    top = max(max(values, default=0.0), 1e-12)
    panels: list[RenderableType] = []
    for part, label in PARTS.items():
        grid = result.grid(part)
        if not grid:
            continue
        table = Table(title=label, title_justify="left", box=None, pad_edge=False)
        table.add_column("layer", justify="right")
        for h in range(len(grid[0])):
            table.add_column(f"h{h}", justify="right")
        for layer, row in enumerate(grid):
            cells = [Text(str(layer))]
            for value in row:
                shade = 0.0 if math.isnan(value) else min(max(value / top, 0.0), 1.0)
                style = Style(
                    bgcolor=weight_color(shade), color="black" if shade > 0.55 else "white"
                )
                cells.append(Text(f"{value:+.3f}", style=style))
            table.add_row(*cells)
        panels.append(table)
    return Group(*panels)


def prune_table(result: Ablation) -> Table:
    bleu = result.metric == "bleu"
    table = Table(title="greedy pruning: least important heads first", title_justify="left")
    for name in ("heads removed", "share", "loss"):
        table.add_column(name, justify="right")
    if bleu:
        table.add_column("BLEU", justify="right")
        table.add_column("chrF", justify="right")
    table.add_column("last removed")
    previous: list[str] = []
    for point in result.prune_curve:
        new = point.pruned[len(previous) :]
        row = [str(point.removed), f"{100 * point.share:.0f}%", f"{point.quality.loss:.4f}"]
        if bleu:
            row += [_fmt(point.quality.bleu, 2), _fmt(point.quality.chrf, 2)]
        table.add_row(*row, ", ".join(new))
        previous = point.pruned
    return table
