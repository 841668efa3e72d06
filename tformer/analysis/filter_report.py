"""What corpus filtering writes: a corpus folder ``tformer train --data OUT`` reads (the kept
pairs of the filtered split and every other split as it was, in JSON Lines) and the report
beside it: scores.jsonl (every pair's figures), report.md (the distribution as quantiles, how
many were kept, the worst pairs) and report.png (a histogram with the cut) when matplotlib is
there. The folder is written whole or not at all through ``tformer.folders``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from tformer.analysis.filtering import CorpusScores, Selection
from tformer.analysis.run_plot import save_figure
from tformer.data.sources import TextPair
from tformer.errors import ConfigError
from tformer.folders import MarkedFolder, written_files
from tformer.version import __version__

FILTERED = MarkedFolder(marker="tformer-filter.json", format="tformer-filter", version=1,
                        noun="filtering", command="`tformer filter`", option="--out")
QUANTILES = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
SHOWN_CHARS = 80  # of a source or target in the report's table of worst pairs


@dataclass(frozen=True)
class FilterJob:
    """What was filtered and by which models, as the report and the marker name them."""

    data: str
    split: str
    fields: tuple[str, str]  # the JSON keys of the source and the target
    forward: str
    reverse: str | None = None
    contrast: bool = False  # scored by the source's gain (--contrast)


def check_kept(selection: Selection, scores: CorpusScores) -> None:
    """Refuse a rule that keeps no pair: the corpus written would have an empty split."""
    if len(selection.kept):
        return
    finite = scores.score[scores.scored]
    best = f"the best score is {finite.min():.4f}" if len(finite) else "no pair could be scored"
    raise ConfigError(f"{selection.rule}: keeps no pair ({best}); loosen it")


def write_filtered(
    out: Path,
    splits: Mapping[str, Sequence[TextPair]],
    job: FilterJob,
    scores: CorpusScores,
    selection: Selection,
    *,
    worst_n: int = 20,
    overwrite: bool = False,
) -> list[str]:
    """Write the folder ``out``: ``<split>.jsonl`` for every split (``job.split`` holding
    only the kept pairs), scores.jsonl, report.md, report.png (with matplotlib) and the
    marker last. Returns the files written (relative names).

    Raises:
        ConfigError: ``out`` may not be written (not empty without ``overwrite``, not an
            earlier filtering, another process writing it).
        CheckpointError: the folder cannot be written.
    """
    FILTERED.check_out(out)
    FILTERED.check_replace(out, overwrite=overwrite)
    kept = set(selection.kept.tolist())
    with FILTERED.staging(out, overwrite=overwrite) as tmp:
        for name, pairs in splits.items():
            chosen = (p for i, p in enumerate(pairs) if i in kept) if name == job.split else pairs
            with open(tmp / f"{name}.jsonl", "w", encoding="utf-8", newline="\n") as handle:
                write_pairs(handle, chosen, job.fields)
        with open(tmp / "scores.jsonl", "w", encoding="utf-8", newline="\n") as handle:
            write_scores(handle, scores, kept)
        text = report_markdown(job, scores, selection, splits[job.split], worst_n)
        (tmp / "report.md").write_text(text, encoding="utf-8")
        if plotting():
            plot_scores(scores, selection, tmp / "report.png")
        files = written_files(tmp)
        marker = FILTERED.marker_text(
            files, tformer_version=__version__, data=job.data, split=job.split,
            checkpoint=job.forward, reverse=job.reverse, contrast=job.contrast,
            rule=selection.rule,
            cut=selection.cut, pairs=len(scores), kept=len(kept),
        )  # fmt: skip
        (tmp / FILTERED.marker).write_text(marker, encoding="utf-8")
    return [*files, FILTERED.marker]


def write_pairs(handle: IO[str], pairs: Any, fields: tuple[str, str]) -> None:
    """One JSON object a line: the pair under the keys ``fields`` (source, target)."""
    for source, target in pairs:
        record = {fields[0]: source, fields[1]: target}
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def _number(value: float) -> float | None:
    """A figure for JSON: NaN (no score) as null."""
    return None if math.isnan(value) else float(value)


def _optional(figures: np.ndarray | None, i: int) -> float | None:
    return None if figures is None else _number(figures[i])


def write_scores(handle: IO[str], scores: CorpusScores, kept: set[int]) -> None:
    """Every pair's index, score, exp(-score) (the paper's adequacy; null for a contrast
    score, which is no cross-entropy), H_A, H_B and, with a contrast score, each given the
    other pair's side (null without that model or where a model could not read the pair),
    whether it is a copy and whether it was kept."""
    for i in range(len(scores)):
        score = _number(scores.score[i])
        record = {
            "index": i,
            "score": score,
            "exp_neg_score": None if score is None or scores.contrast else math.exp(-score),
            "h_a": _number(scores.forward[i]),
            "h_b": _optional(scores.reverse, i),
            "h_a_other": _optional(scores.forward_other, i),
            "h_b_other": _optional(scores.reverse_other, i),
            "copy": None if scores.copied is None else bool(scores.copied[i]),
            "kept": i in kept,
        }
        handle.write(json.dumps(record) + "\n")


# -- report.md --------------------------------------------------------------------------------


def _cell(text: str) -> str:
    """A Markdown table cell: one line, pipes escaped, long text cut."""
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= SHOWN_CHARS else flat[: SHOWN_CHARS - 1] + "…"


def _figure(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.4f}"


def report_markdown(
    job: FilterJob,
    scores: CorpusScores,
    selection: Selection,
    pairs: Sequence[TextPair],
    worst_n: int,
) -> str:
    """The report: what was scored and how, the quantiles of the score, what was kept, and
    the ``worst_n`` pairs of highest score."""
    n, kept, scored = len(scores), len(selection.kept), int(scores.scored.sum())
    how = _scored_by(job)
    cut = "-" if selection.cut is None else f"{selection.cut:.4f}"
    lines = [
        f"# tformer filter: {job.data} [{job.split}]",
        "",
        f"Scored by {how}. H is a model's mean cross-entropy per target token (nats, the "
        "`<eos>` included) under teacher forcing; lower scores are better.",
        "",
        f"Rule: {selection.rule}; cut at score {cut}.",
        "",
        "| pairs | scored | kept | dropped | not scorable (empty or over max_len) |",
        "|---:|---:|---:|---:|---:|",
        f"| {n:,} | {scored:,} | {kept:,} ({kept / max(n, 1):.1%}) | {n - kept:,} | "
        f"{n - scored:,} |",
        "",
        *_copies_line(scores, selection),
        *_quantile_table(scores),
        "",
        *_worst_table(scores, selection, pairs, worst_n),
    ]
    return "\n".join(lines) + "\n"


def _scored_by(job: FilterJob) -> str:
    """The report's words for the score, its models and its formula."""
    if job.contrast:
        formula = "H_A(y|x) − H_A(y|x')" + (" + H_B(x|y) − H_B(x|y')" if job.reverse else "")
        models = f"forward {job.forward}" + (f", reverse {job.reverse}" if job.reverse else "")
        return (f"the source's gain (--contrast): {models}; score = {formula}, where x' and y' "
                "are the source and target of the pair half the corpus away")  # fmt: skip
    if job.reverse:
        return (f"dual conditional cross-entropy: forward {job.forward}, reverse {job.reverse}; "
                "score = |H_A − H_B| + (H_A + H_B) / 2")  # fmt: skip
    return f"the forward model's per-token cross-entropy H_A alone: {job.forward}"


def _copies_line(scores: CorpusScores, selection: Selection) -> list[str]:
    """How many pairs are copies (target = source) and whether the rule could keep them."""
    if scores.copied is None:
        return []
    copies = int(scores.copied.sum())
    fate = ("kept where their score allowed (--keep-copies)" if selection.keep_copies
            else "never kept, whatever their score")  # fmt: skip
    return [f"Copies (the target is the source, case and punctuation aside): {copies:,}, "
            f"{fate}.", ""]  # fmt: skip


def _quantile_table(scores: CorpusScores) -> list[str]:
    """The score's quantiles (with exp(-score), but for a contrast score) and those of H_A,
    H_B and, with a contrast score, each given the other pair's side, over scored pairs."""
    columns = [("score", scores.score), ("H_A", scores.forward), ("H_B", scores.reverse),
               ("H_A, another source", scores.forward_other),
               ("H_B, another target", scores.reverse_other)]
    shown = [(name, values) for name, values in columns if values is not None]
    adequacy = [] if scores.contrast else ["exp(-score)"]
    header = ["quantile", "score", *adequacy, *(name for name, _ in shown[1:])]
    lines = [
        "## The distribution of the scores",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---:|" * len(header),
    ]
    chosen = [values[scores.scored] for _, values in shown]
    if not len(chosen[0]):
        return [*lines, "| (no pair could be scored) |"]
    for q in QUANTILES:
        figures = [float(np.quantile(values, q)) for values in chosen]
        name = {0.0: "min", 0.5: "median", 1.0: "max"}.get(q, f"{q:.0%}")
        cells = [_figure(figures[0])]
        cells += [] if scores.contrast else [f"{math.exp(-figures[0]):.4f}"]
        cells += [_figure(v) for v in figures[1:]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _worst_table(
    scores: CorpusScores, selection: Selection, pairs: Sequence[TextPair], n: int
) -> list[str]:
    """The ``n`` scored pairs of highest score, highest first (ties: the earlier first)."""
    order = np.argsort(-np.where(scores.scored, scores.score, -math.inf), kind="stable")
    worst = [int(i) for i in order[:n] if scores.scored[i]]
    kept = set(selection.kept.tolist())
    lines = [
        f"## The {len(worst)} worst pairs",
        "",
        "| pair | score | H_A | H_B | kept | source | target |",
        "|---:|---:|---:|---:|:---:|---|---|",
    ]
    for i in worst:
        source, target = pairs[i]
        h_b = math.nan if scores.reverse is None else scores.reverse[i]
        lines.append(
            f"| {i} | {_figure(scores.score[i])} | {_figure(scores.forward[i])} | "
            f"{_figure(h_b)} | {'yes' if i in kept else 'no'} | {_cell(source)} | "
            f"{_cell(target)} |"
        )
    return lines


# -- report.png -------------------------------------------------------------------------------


def plotting() -> bool:
    """Whether matplotlib (an optional extra) is there to draw report.png."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_scores(scores: CorpusScores, selection: Selection, path: Path) -> None:
    """A histogram of the scores with the cut drawn, written atomically to ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8), layout="constrained")
    try:
        values = scores.score[scores.scored]
        ax.hist(values, bins=min(60, max(10, len(values) // 20)), color="#4c72b0")
        if selection.cut is not None:
            ax.axvline(selection.cut, color="#c44e52", linestyle="--", label="cut")
            ax.legend()
        ax.set_xlabel("score (nats per token; lower is better)")
        ax.set_ylabel("pairs")
        ax.set_title(f"{len(selection.kept):,} of {len(scores):,} pairs kept: {selection.rule}",
                     fontsize=9)  # fmt: skip
        save_figure(fig, path, "--out")
    finally:
        plt.close(fig)
