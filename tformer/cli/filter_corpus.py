"""``tformer filter``: score every pair of a corpus with a model (and a reverse model), keep
the best, write the kept corpus and a report."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from tformer.analysis.filter_report import FILTERED, FilterJob, check_kept, write_filtered
from tformer.analysis.filtering import (
    CorpusScores,
    Progress,
    Selection,
    check_rule,
    score_corpus,
    select,
)
from tformer.cli.app import app
from tformer.cli.console import console, err_console
from tformer.cli.data_options import checkpoint_family
from tformer.cli.options import (
    CHECKPOINT,
    CHECKPOINT_CHOICE,
    DEVICE,
    SOURCE_FIELD,
    TARGET_FIELD,
    load_chosen,
)
from tformer.data.prepare import text_splits
from tformer.errors import ConfigError, DataError

PROGRESS_PAIRS = 10_000  # a corpus at least this long has its progress said on stderr


@app.command("filter")
def filter_command(
    checkpoint: Path = CHECKPOINT,
    checkpoint_choice: str = CHECKPOINT_CHOICE,
    data: str = typer.Option(
        ...,
        "--data",
        help="The corpus: a folder of train / validation / test files, one file (its train "
        "split), or a hub data set.",
        show_default=False,
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="The folder to write: the filtered corpus and its report."
    ),
    reverse: Path | None = typer.Option(
        None,
        "--reverse",
        help="A target-to-source model: score by dual conditional cross-entropy (without it, "
        "by the forward model's cross-entropy alone).",
        show_default=False,
    ),
    contrast: bool = typer.Option(
        False, "--contrast", help="Score each pair by how much its own source lowers its "
        "target's cross-entropy against another pair's source (with --reverse, both ways): "
        "a target as likely after any source scores near 0. Each model reads the corpus twice.",
    ),  # fmt: skip
    keep: float | None = typer.Option(
        None, "--keep", help="Keep this fraction of the pairs, the best-scored.",
        show_default=False,
    ),  # fmt: skip
    threshold: float | None = typer.Option(
        None, "--threshold", help="Keep the pairs scored at most this (nats per token).",
        show_default=False,
    ),  # fmt: skip
    keep_copies: bool = typer.Option(
        False, "--keep-copies", help="Keep pairs whose target is their source (case and "
        "punctuation aside) where their score allows; by default they are dropped.",
    ),  # fmt: skip
    split: str = typer.Option("train", "--split", help="The split filtered; others are copied."),
    source_field: str = SOURCE_FIELD,
    target_field: str = TARGET_FIELD,
    worst_n: int = typer.Option(20, "--worst", help="Pairs of highest score in report.md."),
    device: str = DEVICE,
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an earlier filtering at --out."
    ),
) -> None:
    """Score every pair of a split with CHECKPOINT (and --reverse: dual conditional
    cross-entropy; --contrast: the source's gain), keep the best --keep share or those under
    --threshold, and write --out as a corpus `tformer train --data OUT` reads, with
    scores.jsonl, report.md and report.png.
    Pairs whose target copies their source are dropped unless --keep-copies.

    Example: tformer filter checkpoints/dates --data noisy --keep 0.9 --out clean
    """
    check_rule(keep, threshold)
    if worst_n < 1:
        raise ConfigError(f"--worst {worst_n} must be >= 1 (pairs shown)")
    FILTERED.check_out(out)
    FILTERED.check_replace(out, overwrite=overwrite)  # before any work: a refusal costs none
    checkpoint_family(checkpoint, "filter", "reads_source")
    if reverse is not None:
        checkpoint_family(reverse, "filter --reverse", "reads_source")
    splits = text_splits(data, source_field=source_field, target_field=target_field)
    if split not in splits:
        raise DataError(f"--split {split}: not in --data {data} (splits: {', '.join(splits)})")
    pairs = splits[split]
    forward = load_chosen(checkpoint, device)
    backward = None if reverse is None else load_chosen(reverse, device)
    scores = score_corpus(forward, pairs, reverse=backward, contrast=contrast,
                          progress=_progress(len(pairs)))  # fmt: skip
    selection = select(scores, keep=keep, threshold=threshold, keep_copies=keep_copies)
    check_kept(selection, scores)
    job = FilterJob(data, split, (source_field, target_field), str(forward.path),
                    None if backward is None else str(backward.path), contrast)  # fmt: skip
    files = write_filtered(out, splits, job, scores, selection, worst_n=worst_n,
                           overwrite=overwrite)  # fmt: skip
    _say_kept(scores, selection, split, out, files)


def _say_kept(
    scores: CorpusScores, selection: Selection, split: str, out: Path, files: list[str]
) -> None:
    """The one line of the result: what was kept, what was dropped unread, what was written."""
    dropped = int((~scores.scored).sum())
    copied = scores.copied
    copies = 0 if selection.keep_copies or copied is None else int(copied.sum())
    notes = [f"{dropped:,} not scorable"] if dropped else []
    notes += [f"{copies:,} copies dropped"] if copies else []
    note = f" ({', '.join(notes)})" if notes else ""
    console.print(
        f"kept {len(selection.kept):,} of {len(scores):,} pairs of {escape(split)}{note} by "
        f"{escape(selection.rule)}; wrote {escape(str(out))} ({', '.join(files)}); train "
        f"with --data {escape(str(out))}",
        soft_wrap=True,
    )


def _progress(total: int) -> Progress | None:
    """Lines on stderr as chunks are scored, for a corpus long enough to wait for."""
    if total < PROGRESS_PAIRS:
        return None  # a short corpus is scored in moments: its one line is the result
    err_console.print(f"scoring {total:,} pairs …")

    def say(model: str, done: int, all_pairs: int) -> None:
        err_console.print(f"{model} model: {done:,} / {all_pairs:,} pairs scored")

    return say
