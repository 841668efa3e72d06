"""``tformer align``: word alignments from cross-attention, in Pharaoh format, scored by AER."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from tformer.analysis.aer import (
    AlignmentScores,
    check_gold_fits,
    read_lines,
    read_pharaoh,
    score_alignments,
)
from tformer.analysis.align import Choice, align, check_choice, check_extraction, unit_counts
from tformer.checkpoint.files import write_text_atomic
from tformer.cli.app import app
from tformer.cli.console import console, err_console
from tformer.cli.data_options import (
    LIMIT,
    SPLIT,
    check_limit,
    checkpoint_family,
    data_of,
    split_pairs,
)
from tformer.cli.options import (
    CHECKPOINT,
    CHECKPOINT_CHOICE,
    DATA,
    DEVICE,
    SOURCE_FIELD,
    TARGET_FIELD,
    existing_file,
    file_option,
    load_chosen,
    warn_long_inputs,
)
from tformer.errors import ConfigError, DataError

DEFAULT_LAYER = "mean"


def parse_choice(text: str, flag: str, what: str) -> Choice:
    """``--layer`` / ``--head``: a number (negative counts from the end) or ``mean``."""
    if text == "mean":
        return "mean"
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            f"{flag} {text!r} must be a {what} number (negative counts from the end) or 'mean'"
        ) from None


def read_pairs(
    data: str | None,
    split: str,
    files: tuple[Path | None, Path | None],
    fields: tuple[str, str],
) -> list[tuple[str, str]]:
    """The pairs to align: ``--source`` / ``--target`` files line by line, or a split."""
    source, target = files
    if (source is None) != (target is None):
        raise ConfigError("--source and --target go together: give both files, or neither")
    if source is not None and target is not None:
        if data is not None:
            raise ConfigError("give --data (with --split) or --source/--target files, not both")
        existing_file(source, "--source")
        existing_file(target, "--target")
        sources, targets = read_lines(source, "--source"), read_lines(target, "--target")
        if len(sources) != len(targets):
            raise DataError(
                f"--source {source} has {len(sources)} lines but --target {target} has "
                f"{len(targets)}; the files must be aligned line by line"
            )
        return list(zip(sources, targets, strict=True))
    return split_pairs(data, split, source_field=fields[0], target_field=fields[1])


@app.command("align")
def align_command(
    checkpoint: Path = CHECKPOINT,
    checkpoint_choice: str = CHECKPOINT_CHOICE,
    data: str | None = DATA,
    source_field: str = SOURCE_FIELD,
    target_field: str = TARGET_FIELD,
    split: str = SPLIT,
    limit: int | None = LIMIT,
    source: Path | None = typer.Option(
        None, "--source", help="Source sentences, one a line (instead of --data).",
        show_default=False,
    ),
    target: Path | None = typer.Option(
        None, "--target", help="Their translations, line by line with --source.",
        show_default=False,
    ),
    layer: str = typer.Option(
        DEFAULT_LAYER, "--layer", "-l",
        help="A decoder layer (negative counts from the end) or 'mean' of all layers.",
    ),
    head: str = typer.Option("mean", "--head", help="A head number or 'mean' of the heads."),
    threshold: float | None = typer.Option(
        None, "--threshold",
        help="Link every weight >= T (0 < T <= 1) instead of each target token's argmax.",
        show_default=False,
    ),
    units: str = typer.Option(
        "words", "--units", help="words (whitespace-separated) or tokens (subwords)."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Write the Pharaoh lines here (default: stdout).",
        show_default=False,
    ),
    gold: Path | None = typer.Option(
        None, "--gold",
        help="Gold Pharaoh file (i-j sure, i?j possible), one line per pair: print AER, "
        "precision and recall.",
        show_default=False,
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the --gold scores as JSON (needs --out)."
    ),
    max_tokens: int = typer.Option(
        4096, "--max-tokens", help="Padded tokens per batch of teacher-forced passes."
    ),
    device: str = DEVICE,
) -> None:
    """Align source and target words through the model's cross-attention.

    Writes one Pharaoh line per pair ("0-0 1-2": source word -
    target word, 0-based). A target word is linked to the source
    words its tokens attended to most while they were predicted (or
    to every weight >= --threshold); subword links merge into word
    links. --gold prints AER, precision and recall: on stdout with
    --out, else on stderr so a pipe gets only Pharaoh lines.

    Examples:

      tformer align checkpoints/dates --limit 100 --units tokens

      tformer align RUN --source test.de --target test.en
      --gold test.talp --out test.align
    """
    which_layer = parse_choice(layer, "--layer", "layer")
    which_head = parse_choice(head, "--head", "head")
    check_limit(limit)
    if max_tokens < 1:
        raise ConfigError(f"--max-tokens {max_tokens} must be >= 1")
    if as_json and (gold is None or out is None):
        raise ConfigError("--json prints the --gold scores on stdout: give --gold and --out")
    if out is not None:
        file_option(out, "--out")
    if source is None and target is None:
        data, source_field, target_field, _ = data_of(checkpoint, data, source_field, target_field)
    _align(checkpoint, read_pairs(data, split, (source, target), (source_field, target_field)),
           limit=limit, choices=(which_layer, which_head), threshold=threshold, units=units,
           out=out, gold=gold, as_json=as_json, max_tokens=max_tokens, device=device)


def _align(
    checkpoint: Path,
    pairs: list[tuple[str, str]],
    *,
    limit: int | None,
    choices: tuple[Choice, Choice],
    threshold: float | None,
    units: str,
    out: Path | None,
    gold: Path | None,
    as_json: bool,
    max_tokens: int,
    device: str,
) -> None:
    check_extraction(threshold, units)
    aligned = pairs[:limit]
    truth = None
    if gold is not None:
        existing_file(gold, "--gold")
        truth = read_pharaoh(gold)
        if len(truth) not in (len(aligned), len(pairs)):
            raise DataError(
                f"--gold {gold} has {len(truth)} lines for {len(aligned)} pairs; give one gold "
                "line per pair (with --limit N, N lines or one for every input pair)"
            )
        truth = truth[: len(aligned)]
        if not any(links.sure for links in truth):
            raise DataError(
                f"--gold {gold}: no sure link (i-j) in the lines used, so recall and AER are "
                "undefined; mark the links annotators were sure of with i-j"
            )
    pairs = aligned
    checkpoint_family(checkpoint, "align", "reads_source")
    ckpt = load_chosen(checkpoint, device)
    layer, head = choices
    check_choice(layer, ckpt.model_config.n_decoder_layers, "--layer", "decoder layers")
    check_choice(head, ckpt.model_config.n_heads, "--head", "heads")
    if truth is not None:  # before any work, and before anything is written
        check_gold_fits(truth, unit_counts(ckpt.tokenizers, pairs, units), f"--gold {gold}")
    warn_long_inputs(ckpt.tokenizers.source, [s for s, _ in pairs], ckpt.model_config.max_len)
    alignments = align(ckpt.model, ckpt.tokenizers, pairs, layer=layer, head=head,
                       threshold=threshold, units=units, max_tokens=max_tokens)
    text = "".join(a.pharaoh() + "\n" for a in alignments)
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, text)
        err_console.print(f"wrote {len(alignments):,} alignments to {escape(str(out))}")
    if truth is not None:
        scores = score_alignments([a.links for a in alignments], truth)
        if as_json:
            typer.echo(json.dumps(scores.as_dict(), indent=2))
        else:
            (console if out is not None else err_console).print(_table(scores, gold, units))


def _table(scores: AlignmentScores, gold: Path | None, units: str) -> Table:
    table = Table(title=f"alignment vs {escape(str(gold))} ({scores.pairs:,} pairs, {units})",
                  title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows: Sequence[tuple[str, str]] = (
        ("AER", f"{scores.aer:.4f}"),
        ("precision", f"{scores.precision:.4f}"),
        ("recall", f"{scores.recall:.4f}"),
        ("links |A| / sure |S| / possible |P|",
         f"{scores.predicted:,} / {scores.sure:,} / {scores.possible:,}"),
    )
    for name, value in rows:
        table.add_row(name, value)
    return table
