"""``tformer evaluate``: translate a split, score it (sacreBLEU, chrF, loss), write a card."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import typer
from rich.markup import escape
from rich.table import Table

from tformer.analysis.evaluate import (
    Evaluation,
    check_card_folder,
    language_card,
    result_card,
    write_language_results,
    write_results,
)
from tformer.analysis.language import LanguageEvaluation
from tformer.analysis.measures import evaluate
from tformer.cli.app import app
from tformer.cli.console import console, err_console
from tformer.cli.data_options import (
    LIMIT,
    SPLIT,
    TEXT_FIELD,
    check_limit,
    checkpoint_family,
    data_of,
    split_examples,
)
from tformer.cli.decoding_options import DECODING_FLAGS, decoding_config, decoding_parameters
from tformer.cli.ensemble_options import (
    ENSEMBLE,
    SHORTLIST,
    refuse_with_ensemble,
    with_members,
)
from tformer.cli.options import (
    CHECKPOINT,
    CHECKPOINT_CHOICE,
    DATA,
    DEVICE,
    MASK_HEADS,
    QUANTIZE,
    SOURCE_FIELD,
    TARGET_FIELD,
    apply_mask_heads,
    apply_quantize,
    check_batch_size,
    load_chosen,
    warn_long_inputs,
    with_parameters,
)
from tformer.data.sources import TextPair
from tformer.decoding.ensemble import Decodable
from tformer.errors import CheckpointError
from tformer.metrics import perplexity_text
from tformer.paths import file_sha256

CARD_FOLDER = typer.Option(
    None,
    "--out",
    "-o",
    show_default=False,
    help="Folder for hypotheses.txt, result.json, result.md (default: <checkpoint>/eval-<split>).",
)
EVAL_BATCH_SIZE = typer.Option(
    64, "--batch-size", help="Inputs decoded together (lower it when memory runs out)."
)


@app.command("evaluate")
@with_parameters(decoding_parameters(*DECODING_FLAGS), after="out")
def evaluate_command(
    checkpoint: Path = CHECKPOINT,
    checkpoint_choice: str = CHECKPOINT_CHOICE,
    data: str | None = DATA,
    source_field: str = SOURCE_FIELD,
    target_field: str = TARGET_FIELD,
    split: str = SPLIT,
    limit: int | None = LIMIT,
    out: Path | None = CARD_FOLDER,
    batch_size: int = EVAL_BATCH_SIZE,
    device: str = DEVICE,
    quantize: str = QUANTIZE,
    mask_heads: str | None = MASK_HEADS,
    text_field: str = TEXT_FIELD,
    ensemble: list[Path] | None = ENSEMBLE,
    shortlist: Path | None = SHORTLIST,
    **values: Any,
) -> None:
    """Translate a split and report sacreBLEU and chrF (with signatures), loss and perplexity.

    A language model's split is measured instead: perplexity and bits per character
    (decoder-only), masked-token accuracy and perplexity (encoder-only).

    With --ensemble the checkpoints translate together; the loss is the ensemble's.

    Example: tformer evaluate checkpoints/dates --split test
    """
    check_limit(limit)
    check_batch_size(batch_size)
    if out is not None:
        check_card_folder(out)  # before any work: a refused folder costs no evaluation
    family = checkpoint_family(checkpoint, "evaluate")
    if not family.reads_source:
        refuse_with_ensemble(ensemble, "a language model's split", "is measured by one model")
    if mask_heads:
        refuse_with_ensemble(ensemble, "--mask-heads", "names heads of one model")
    data, source_field, target_field, text_field = data_of(
        checkpoint, data, source_field, target_field, text_field
    )
    examples = split_examples(
        data, split, pairs=family.reads_source, source_field=source_field,
        target_field=target_field, text_field=text_field, limit=limit,
    )  # fmt: skip
    # The same decoding flags as `tformer generate`; one output per input is scored.
    decoding = decoding_config(values) if family.reads_source else None
    ckpt = load_chosen(checkpoint, device)
    masked = apply_mask_heads(ckpt.model, mask_heads)
    folder = out or ckpt.path / f"eval-{split}"
    check_card_folder(folder)
    model: Decodable = ckpt.model
    members = [str(ckpt.path)]
    if family.reads_source:
        apply_quantize(ckpt.model, quantize)
        model, members = with_members(
            ckpt, ensemble, "evaluate", device=device, quantize=quantize, shortlist=shortlist
        )
        sources = [s for s, _ in cast(list[TextPair], examples)]
        warn_long_inputs(ckpt.tokenizers.source, sources, model.config.max_len)
    what = "translating" if family.reads_source else "measuring"
    unit = "pairs" if family.reads_source else "documents"
    err_console.print(f"{what} {len(examples):,} {unit} of {split} …")
    result = evaluate(
        ckpt, examples, split=split, decoding=decoding, batch_size=batch_size, model=model
    )
    if isinstance(result, LanguageEvaluation):
        docs = cast(list[str], examples)
        card = language_card(ckpt, result, data=data, docs=docs, mask_heads=masked)
        paths = _written(folder, lambda: write_language_results(folder, card))
        _show_language(result, data, split, len(examples), paths)
        return
    result.decoding["quantize"] = quantize  # the card says whether int8 made these outputs
    result.decoding["mask_heads"] = masked  # ... and which heads were silenced
    if ensemble:
        result.decoding["ensemble"] = members  # ... and which checkpoints decoded together
    if shortlist is not None:  # ... and over which shortlist
        result.decoding["shortlist"] = {"path": str(shortlist), "sha256": file_sha256(shortlist)}
    card = result_card(ckpt, result, data=data, pairs=cast(list[TextPair], examples))
    paths = _written(folder, lambda: write_results(folder, card, result.hypotheses))
    _show_translation(result, data, split, paths)


def _show_translation(
    result: Evaluation, data: str | None, split: str, paths: dict[str, Path]
) -> None:
    """The scores of a translated split as a table, and the files written."""
    table = Table(
        title=f"{escape(data or 'bundled dates')} [{split}], {result.pairs:,} pairs",
        title_justify="left",
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("signature")
    table.add_row("sacreBLEU", f"{result.scores.bleu:.2f}", result.scores.bleu_signature)
    table.add_row("chrF", f"{result.scores.chrf:.2f}", result.scores.chrf_signature)
    table.add_row("loss", f"{result.loss:.4f}", "teacher forcing")
    table.add_row("perplexity", perplexity_text(result.perplexity), "")
    console.print(table)
    console.print(
        f"{result.new_tokens_per_s:,.0f} new tokens/s; wrote "
        f"{escape(str(paths['json']))}, {escape(str(paths['markdown']))}, "
        f"{escape(str(paths['hypotheses']))}"
    )


def _show_language(
    result: LanguageEvaluation, data: str | None, split: str, docs: int, paths: dict[str, Path]
) -> None:
    """A language model's figures on a split as a table, and the files written."""
    table = Table(
        title=escape(
            f"{data or 'bundled text'} [{split}], {docs:,} documents, "
            f"{result.tokens:,} predicted tokens"
        ),
        title_justify="left",
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("loss", f"{result.loss:.4f}")
    table.add_row("perplexity", perplexity_text(result.perplexity))
    for name, value in result.metrics.items():
        shown = f"{value:.2%}" if name == "masked_accuracy" else f"{value:.4f}"
        table.add_row(name.replace("_", " "), shown)
    console.print(table)
    console.print(f"wrote {escape(str(paths['json']))}, {escape(str(paths['markdown']))}")


def _written(folder: Path, write: Callable[[], dict[str, Path]]) -> dict[str, Path]:
    """The files ``write`` wrote into ``folder``, or one line saying it cannot be written."""
    try:
        return write()
    except OSError as error:
        raise CheckpointError(
            f"--out {folder}: the results cannot be written ({error.strerror or error}); "
            "give a writable --out folder"
        ) from error
