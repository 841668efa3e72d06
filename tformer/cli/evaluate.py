"""``tformer evaluate``: translate a split, score it (sacreBLEU, chrF, loss), write a card."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from tformer.analysis.evaluate import evaluate, result_card, write_results
from tformer.checkpoint.store import load_checkpoint
from tformer.cli.app import app
from tformer.cli.console import console, err_console
from tformer.cli.options import (
    BEAM_SIZE,
    CHECKPOINT,
    DATA,
    DEVICE,
    LENGTH_PENALTY,
    LIMIT,
    MASK_HEADS,
    MAX_NEW_TOKENS,
    MIN_NEW_TOKENS,
    MIN_P,
    NO_REPEAT_NGRAM_SIZE,
    QUANTIZE,
    REPETITION_PENALTY,
    SEED,
    SOURCE_FIELD,
    TARGET_FIELD,
    TEMPERATURE,
    TOP_K,
    TOP_P,
    apply_mask_heads,
    apply_quantize,
    check_batch_size,
    check_limit,
    decoding_config,
    folder_option,
    split_pairs,
    warn_long_inputs,
)
from tformer.device import resolve_device
from tformer.errors import CheckpointError


@app.command("evaluate")
def evaluate_command(
    ctx: typer.Context,
    checkpoint: Path = CHECKPOINT,
    data: str | None = DATA,
    source_field: str = SOURCE_FIELD,
    target_field: str = TARGET_FIELD,
    split: str = typer.Option("test", "--split", help="train, validation or test."),
    limit: int | None = LIMIT,
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        show_default=False,
        help="Folder for hypotheses.txt, result.json, result.md "
        "(default: <checkpoint>/eval-<split>).",
    ),
    temperature: float = TEMPERATURE,
    top_k: int = TOP_K,
    top_p: float = TOP_P,
    min_p: float = MIN_P,
    repetition_penalty: float = REPETITION_PENALTY,
    no_repeat_ngram_size: int = NO_REPEAT_NGRAM_SIZE,
    beam_size: int = BEAM_SIZE,
    length_penalty: float = LENGTH_PENALTY,
    min_new_tokens: int = MIN_NEW_TOKENS,
    max_new_tokens: int = MAX_NEW_TOKENS,
    seed: int | None = SEED,
    batch_size: int = typer.Option(64, "--batch-size"),
    device: str = DEVICE,
    quantize: str = QUANTIZE,
    mask_heads: str | None = MASK_HEADS,
) -> None:
    """Translate a split and report sacreBLEU and chrF (with signatures), loss and perplexity.

    Example: tformer evaluate checkpoints/dates --split test
    """
    check_limit(limit)
    check_batch_size(batch_size)
    folder_option(out, "--out")
    # The same decoding flags as `tformer generate`; one output per input is scored.
    decoding = decoding_config(ctx.params)
    pairs = split_pairs(
        data, split, source_field=source_field, target_field=target_field, limit=limit
    )
    ckpt = load_checkpoint(checkpoint, resolve_device(device))
    masked = apply_mask_heads(ckpt.model, mask_heads)
    apply_quantize(ckpt.model, quantize)
    folder_option(out or ckpt.path / f"eval-{split}", "--out")
    err_console.print(f"translating {len(pairs):,} pairs of {split} …")
    warn_long_inputs(ckpt.tokenizers.source, [s for s, _ in pairs], ckpt.model_config.max_len)
    result = evaluate(ckpt, pairs, split=split, decoding=decoding, batch_size=batch_size)
    result.decoding["quantize"] = quantize  # the card says whether int8 made these outputs
    result.decoding["mask_heads"] = masked  # ... and which heads were silenced
    card = result_card(ckpt, result, data=data, pairs=pairs)
    folder = out or ckpt.path / f"eval-{split}"
    try:
        paths = write_results(folder, card, result.hypotheses)
    except OSError as error:
        raise CheckpointError(
            f"--out {folder}: the results cannot be written ({error.strerror or error}); "
            "give a writable --out folder"
        ) from error

    table = Table(
        title=f"{escape(data or 'bundled dates')} [{split}], {len(pairs):,} pairs",
        title_justify="left",
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("signature")
    table.add_row("sacreBLEU", f"{result.scores.bleu:.2f}", result.scores.bleu_signature)
    table.add_row("chrF", f"{result.scores.chrf:.2f}", result.scores.chrf_signature)
    table.add_row("loss", f"{result.loss:.4f}", "teacher forcing")
    table.add_row("perplexity", f"{result.perplexity:.2f}", "")
    console.print(table)
    console.print(
        f"{result.new_tokens_per_s:,.0f} new tokens/s; wrote "
        f"{escape(str(paths['json']))}, {escape(str(paths['markdown']))}, "
        f"{escape(str(paths['hypotheses']))}"
    )
