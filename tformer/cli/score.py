"""``tformer score``: the teacher-forcing X-ray of a reference, or of a whole split."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tformer.analysis.measures import score
from tformer.analysis.score import (
    PairScore,
    ScoreSummary,
    decoder_masks,
    score_pairs,
    score_tsv,
    summarize,
    unknown_characters,
    worst,
)
from tformer.checkpoint.files import write_text_atomic
from tformer.checkpoint.store import Checkpoint, read_origin
from tformer.cli.app import app
from tformer.cli.console import console, err_console
from tformer.cli.data_options import check_limit, checkpoint_family, data_of, split_pairs
from tformer.cli.options import (
    CHECKPOINT,
    CHECKPOINT_CHOICE,
    DATA,
    DEVICE,
    MASK_HEADS,
    SOURCE_FIELD,
    TARGET_FIELD,
    apply_mask_heads,
    file_option,
    load_chosen,
)
from tformer.cli.render import SPECIAL_STYLE, heatmap
from tformer.config import UNK, UNK_ID
from tformer.data.display import is_special
from tformer.data.sources import TextPair
from tformer.errors import CheckpointError, ConfigError
from tformer.metrics import perplexity_text

MARKER = "≠"  # a position whose top choice is not the label


@app.command("score")
def score_command(
    checkpoint: Path = CHECKPOINT,
    checkpoint_choice: str = CHECKPOINT_CHOICE,
    source: str | None = typer.Argument(None, help="The source text.", show_default=False),
    reference: str | None = typer.Argument(
        None, help="Its reference translation, teacher-forced.", show_default=False
    ),
    data: str | None = DATA,
    source_field: str = SOURCE_FIELD,
    target_field: str = TARGET_FIELD,
    split: str | None = typer.Option(
        None,
        "--split",
        help="Score every pair of this split (train, validation or test) instead of one pair; "
        "test when only --data is given.",
        show_default=False,
    ),
    limit: int | None = typer.Option(
        None, "--limit", help="Only the split's first N pairs.", show_default=False
    ),
    worst_n: int = typer.Option(
        10, "--worst", help="With a split: show the N pairs of highest mean loss."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Also write every position of every pair to this TSV file (a header row first).",
        show_default=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    masks: bool = typer.Option(
        False,
        "--masks",
        help="Also draw the decoder's masks for the pair: causal self-attention and "
        "cross-attention.",
    ),
    device: str = DEVICE,
    mask_heads: str | None = MASK_HEADS,
) -> None:
    """Teacher-force a reference and show, at each position, what the decoder read, the label
    it had to predict, the label's probability and rank, the model's own top choice, and the
    loss (plain and label-smoothed); ≠ marks a position whose top choice is not the label.

    Examples:

      tformer score checkpoints/dates "6 March 2025" "2025-03-06"

      tformer score checkpoints/dates --split test --worst 5 --out test-tokens.tsv
    """
    whole_split = data is not None or split is not None
    if not checkpoint_family(checkpoint, "score").reads_source:
        _score_text(checkpoint, source, reference, whole_split, as_json, masks, out, device,
                    mask_heads)  # fmt: skip
        return
    _check_options(source, reference, whole_split, limit, worst_n, masks, out)
    name = split or "test"
    if whole_split:
        data, source_field, target_field, _ = data_of(checkpoint, data, source_field, target_field)
    pairs = (
        split_pairs(data, name, source_field=source_field, target_field=target_field, limit=limit)
        if whole_split
        else None
    )
    ckpt = load_chosen(checkpoint, device)
    apply_mask_heads(ckpt.model, mask_heads)
    if pairs is None:
        assert source is not None and reference is not None
        _warn_unknown_source(ckpt, source)
        scored = score(ckpt, reference, source=source)
        _write_tsv(out, [scored])
        _show_pair(ckpt, scored, as_json=as_json, masks=masks)
        return
    _score_split(ckpt, pairs, data, name, out=out, as_json=as_json, worst_n=worst_n)


def _score_split(
    ckpt: Checkpoint,
    pairs: list[TextPair],
    data: str | None,
    split: str,
    *,
    out: Path | None,
    as_json: bool,
    worst_n: int,
) -> None:
    """Score every pair of ``split``: a summary and the ``worst_n`` pairs of highest mean
    loss (or JSON), every position in the --out TSV."""
    err_console.print(f"scoring {len(pairs):,} pairs of {escape(split)} …")
    smoothing = ckpt.train_config.label_smoothing
    scores = score_pairs(ckpt.model, ckpt.tokenizers, pairs, label_smoothing=smoothing)
    _warn_split(scores, len(pairs))
    _write_tsv(out, scores)
    summary = summarize(scores, dropped=len(pairs) - len(scores))
    if as_json:
        _echo_json(_split_json(ckpt, data, split, summary, scores, worst_n))
        return
    where = escape(f"{data or 'bundled dates'} [{split}]")
    console.print(summary_table(summary, where))
    console.print(worst_table(worst(scores, worst_n)))


def _score_text(
    checkpoint: Path,
    text: str | None,
    extra: str | None,
    whole_split: bool,
    as_json: bool,
    masks: bool,
    out: Path | None,
    device: str,
    mask_heads: str | None,
) -> None:
    """A language model scores one text (its positions as a pair's; no source): a decoder-only
    model each next token, an encoder-only one each token masked in turn."""
    if whole_split:
        raise ConfigError(
            "--data / --split: a language model's split is measured by tformer evaluate "
            "(loss, perplexity); tformer score takes one TEXT"
        )
    if text is None or extra is not None:
        raise ConfigError(
            "a language model scores one TEXT: give tformer score CHECKPOINT TEXT (no REFERENCE)"
        )
    if out is not None:
        file_option(out, "--out")
    ckpt = load_chosen(checkpoint, device)
    masked = ckpt.model.fills_masks
    if masked and masks:
        raise ConfigError(
            "--masks draws a decoder's causal and cross-attention masks; an encoder-only model "
            "reads its whole text (tformer inspect-attention shows what it attends to)"
        )
    apply_mask_heads(ckpt.model, mask_heads)
    scored = score(ckpt, text)
    _write_tsv(out, [scored])
    _show_pair(ckpt, scored, as_json=as_json, masks=masks)


def _check_options(
    source: str | None,
    reference: str | None,
    whole_split: bool,
    limit: int | None,
    worst_n: int,
    masks: bool,
    out: Path | None,
) -> None:
    """Refuse contradictory or out-of-range options before anything is loaded."""
    if whole_split and source is not None:
        raise ConfigError(
            "SOURCE and REFERENCE score one pair, --data / --split a whole split; give one or "
            "the other"
        )
    if not whole_split and (source is None or reference is None):
        missing = "SOURCE and REFERENCE" if source is None else "REFERENCE"
        raise ConfigError(f"{missing} missing: give SOURCE REFERENCE, or --data D --split S")
    if limit is not None and not whole_split:
        raise ConfigError(f"--limit {limit} applies to a split; give --data D --split S")
    check_limit(limit)
    if worst_n < 1:
        raise ConfigError(f"--worst {worst_n} must be >= 1 (pairs shown)")
    if masks and whole_split:
        raise ConfigError("--masks draws one pair's masks; give SOURCE REFERENCE, not --split")
    if out is not None:
        file_option(out, "--out")


def _warn_unknown_source(ckpt: Checkpoint, source: str) -> None:
    """A warning (not a refusal): the model can read <unk>, it is the reference that must be
    scored token by token."""
    unknown = unknown_characters(ckpt.tokenizers.source, source)
    if unknown:
        err_console.print(
            f"[yellow]warning:[/] SOURCE: {escape(repr(''.join(dict.fromkeys(unknown))))} "
            f"cannot be encoded by the source tokenizer; the model reads {UNK} there",
            soft_wrap=True,
        )


def _warn_split(scores: Sequence[PairScore], given: int) -> None:
    dropped = given - len(scores)
    if dropped:
        err_console.print(
            f"[yellow]note:[/] {dropped:,} of {given:,} pairs skipped (a side empty or over the "
            "model's max_len), as evaluate skips them",
            soft_wrap=True,
        )
    unknown = sum(UNK_ID in s.label_ids for s in scores)
    if unknown:
        err_console.print(
            f"[yellow]warning:[/] {unknown:,} references hold characters the target tokenizer "
            f"encodes as {UNK}; those positions are scored as {UNK}",
            soft_wrap=True,
        )


def _write_tsv(out: Path | None, scores: Sequence[PairScore]) -> None:
    if out is None:
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, score_tsv(scores))
    except OSError as error:
        raise CheckpointError(
            f"--out {out}: cannot be written ({error.strerror or error}); give a writable path"
        ) from error
    err_console.print(f"wrote {escape(str(out))}", soft_wrap=True)


def _echo_json(record: dict[str, Any]) -> None:
    typer.echo(json.dumps(record, indent=2, ensure_ascii=False))


# -- one pair ---------------------------------------------------------------------------------


def _show_pair(ckpt: Checkpoint, scored: PairScore, *, as_json: bool, masks: bool) -> None:
    if as_json:
        record = {"checkpoint": str(ckpt.path), **scored.to_dict()}
        if masks:
            causal, cross = decoder_masks(scored)
            record["masks"] = {
                "rows": scored.input_tokens,
                "self_attention": causal.int().tolist(),
                "self_attention_columns": scored.input_tokens,
                "cross_attention": cross.int().tolist(),
                "cross_attention_columns": scored.source_tokens,
            }
        _echo_json(record)
        return
    console.print(pair_table(scored, imported=read_origin(ckpt.path) is not None))
    if masks:
        console.print(mask_maps(scored, width=console.width))


def _token(token: str) -> Text:
    return Text(token, style=SPECIAL_STYLE if is_special(token) else "")


def smoothing_note(epsilon: float, *, imported: bool) -> str:
    """What the smoothed loss is: the loss tformer trained the checkpoint with, or, for an
    import (which tformer never trained), the one a fine-tune trains with by default."""
    if imported:
        return (
            f"smoothed: with label smoothing ε={epsilon:g} (what tformer train --init-from "
            "fine-tunes this import with by default)"
        )
    return f"smoothed: with label smoothing ε={epsilon:g} (the training loss)"


def pair_table(scored: PairScore, *, imported: bool = False) -> Table:
    """One row per decoder position; the caption holds the pair's totals. ``imported``: the
    checkpoint is an import, not trained by tformer (:func:`smoothing_note`)."""
    totals = scored.totals()
    how = (
        "each token scored with it alone masked (pseudo-log-likelihood; perplexity is the "
        "pseudo-perplexity). "
        if scored.masked
        else ""
    )
    caption = how + (
        f"loss: -log p(label); {smoothing_note(scored.label_smoothing, imported=imported)}. "
        f"Sum {totals['loss_sum']:.4f}, mean {totals['mean_loss']:.4f}, "
        f"perplexity {perplexity_text(totals['perplexity'])}; smoothed sum "
        f"{totals['smoothed_loss_sum']:.4f}, mean {totals['smoothed_mean_loss']:.4f}. "
        f"{MARKER}: the top choice is not the label ({totals['mismatches']} of "
        f"{scored.tokens} positions)."
    )
    table = Table(
        title=f"source: {escape(scored.source)}\nreference: {escape(scored.reference)}",
        title_justify="left",
        caption=caption,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
    )
    names = ("#", "input", "label", "p label", "rank", "top", "p top", MARKER, "loss", "smoothed")
    for name in names:
        text = name in ("input", "label", "top", MARKER)
        table.add_column(name, justify="left" if text else "right", min_width=len(name))
    for t in range(scored.tokens):
        miss = scored.top_ids[t] != scored.label_ids[t]
        table.add_row(
            str(t),
            _token(scored.input_tokens[t]),
            _token(scored.label_tokens[t]),
            f"{scored.p_label[t]:.4f}",
            str(scored.rank[t]),
            _token(scored.top_tokens[t]),
            f"{scored.p_top[t]:.4f}",
            Text(MARKER, style="bold red") if miss else "",
            f"{scored.loss[t]:.4f}",
            f"{scored.smoothed_loss[t]:.4f}",
        )
    return table


def mask_maps(scored: PairScore, *, width: int) -> RenderableType:
    """The decoder's two masks drawn as attention maps: bright = may attend, dark = masked."""
    causal, cross = decoder_masks(scored)
    rows = scored.input_tokens
    self_title = "decoder self-attention mask (causal): row = position, bright = may attend"
    cross_title = "cross-attention mask (source padding): bright = may attend"
    return Group(
        heatmap(causal.float(), rows, rows, width=width, title=self_title),
        heatmap(cross.float(), rows, scored.source_tokens, width=width, title=cross_title),
    )


# -- a split ----------------------------------------------------------------------------------


def summary_table(summary: ScoreSummary, where: str) -> Table:
    table = Table(
        title=f"{where}: teacher forcing",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
    )
    eps = summary.label_smoothing
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("pairs", f"{summary.pairs:,}"),
        ("skipped (empty or over max_len)", f"{summary.dropped:,}"),
        ("tokens (incl. <eos>)", f"{summary.tokens:,}"),
        ("loss sum", f"{summary.loss_sum:.4f}"),
        ("mean loss", f"{summary.mean_loss:.4f}"),
        ("perplexity", perplexity_text(summary.perplexity)),
        (f"mean loss, smoothed (ε={eps:g})", f"{summary.smoothed_mean_loss:.4f}"),
        (f"top choice {MARKER} label", f"{summary.mismatch_share:.2%} of positions"),
    ]
    for name, value in rows:
        table.add_row(escape(name), value)
    return table


def worst_table(scores: Sequence[PairScore]) -> Table:
    """The pairs of highest mean loss, with each one's worst position."""
    table = Table(
        title=f"the {len(scores)} pairs of highest mean loss",
        title_justify="left",
        caption=f"worst: the position of highest loss: label, p ({MARKER} top choice, p)",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
    )
    for name in ("pair", "tokens", "mean loss", "ppl", MARKER):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("worst", no_wrap=True)
    table.add_column("source → reference", min_width=16)
    for s in scores:
        t = max(range(s.tokens), key=lambda i: s.loss[i])
        where = f"#{t} {escape(s.label_tokens[t])} {s.p_label[t]:.3f}"
        if s.top_ids[t] != s.label_ids[t]:
            where += f" {MARKER} {escape(s.top_tokens[t])} {s.p_top[t]:.3f}"
        table.add_row(
            str(s.index),
            str(s.tokens),
            f"{s.mean_loss:.4f}",
            perplexity_text(s.perplexity),
            str(len(s.mismatches)),
            where,
            f"{escape(s.source)} → {escape(s.reference)}",
        )
    return table


def _split_json(
    ckpt: Checkpoint,
    data: str | None,
    split: str,
    summary: ScoreSummary,
    scores: Sequence[PairScore],
    worst_n: int,
) -> dict[str, Any]:
    return {
        "checkpoint": str(ckpt.path),
        "data": data,
        "split": split,
        "summary": asdict(summary),
        "worst": [s.to_dict() for s in worst(scores, worst_n)],
        "pairs": [s.to_dict(positions=False) for s in scores],
    }
