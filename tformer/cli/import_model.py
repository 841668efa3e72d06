"""``tformer import``: a Hugging Face Marian (OPUS-MT), GPT-2, BERT or T5 model as a tformer
checkpoint."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.markup import escape

from tformer.checkpoint.files import WEIGHTS
from tformer.checkpoint.store import read_config
from tformer.checkpoint.verify import Check
from tformer.checkpoint.weights import read_header
from tformer.cli.app import app
from tformer.cli.console import console
from tformer.config.families import family_record
from tformer.errors import CheckpointError
from tformer.imports import import_model
from tformer.imports.check import check_import, read_texts
from tformer.imports.hub import local_folder


@app.command("import")
def import_command(
    source: str = typer.Argument(
        ...,
        help="A folder written by save_pretrained (MarianMTModel, GPT2LMHeadModel, "
        "BertForMaskedLM or T5ForConditionalGeneration with its tokenizer), or a hub id such "
        "as Helsinki-NLP/opus-mt-en-de, gpt2, bert-base-uncased or t5-small.",
        show_default=False,
    ),
    out: Path = typer.Argument(
        ...,
        help="The checkpoint folder to create (absent or empty; with --overwrite, an earlier "
        "import).",
        show_default=False,
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an earlier import in OUT (nothing else)."
    ),
    check: bool = typer.Option(
        False,
        "--check",
        help="After writing OUT, run SOURCE with transformers and compare it with OUT on a few "
        "short sentences: token ids, logits (within 1e-3), greedy outputs or fill-mask's top "
        "token. A failed check exits 4; OUT is kept either way.",
    ),
    check_text: Path | None = typer.Option(
        None,
        "--check-text",
        help="The sentences --check reads, one a line (implies --check).",
        show_default=False,
    ),
) -> None:
    """Import an OPUS-MT / Marian or T5 model (encoder-decoder), GPT-2 (decoder-only) or
    BERT (encoder-only) as an ordinary tformer checkpoint.

    Every command of its family then takes OUT: generate, fill-mask, score, evaluate,
    inspect-attention, ablate, export, serve, and train --init-from OUT to fine-tune it on
    your data with its tokenizer. Commands that read data (evaluate, score --split, ablate,
    align) need --data for an import. A hub id is fetched through huggingface_hub's cache;
    offline, pass a local folder. Needs the "import" extra (pip install "tformer[import]").
    With --check, OUT is then compared with SOURCE run by transformers (exit 4 if they
    differ; OUT is kept). See docs/finetune.md.

    Example: tformer import Helsinki-NLP/opus-mt-en-de checkpoints/opus-en-de
    """
    texts = read_texts(check_text) if check_text is not None else None
    folder = import_model(source, out, overwrite=overwrite)
    console.print(f"imported {escape(source)} into {escape(str(folder))}", soft_wrap=True)
    console.print(escape(import_summary(folder)), soft_wrap=True, highlight=False)
    if check or check_text is not None:
        report_checks(check_import(local_folder(source), folder, texts), folder)


def report_checks(checks: list[Check], folder: Path) -> None:
    """One line per check of ``--check``, its figure and pass / fail.

    Raises:
        CheckpointError: a check failed (the checkpoint is kept).
    """
    for c in checks:
        verdict = "[green]pass[/]" if c.ok else "[red]FAIL[/]"
        console.print(f"check {c.name}: {escape(c.detail)}: {verdict}", soft_wrap=True)
    failed = [c.name for c in checks if not c.ok]
    if failed:
        raise CheckpointError(
            f"--check: {', '.join(failed)} differ from transformers' (the import is kept in "
            f"{folder})"
        )


def import_summary(folder: Path) -> str:
    """One line on what was imported: the model, its size and vocabularies, the tokenizer
    and where it came from (read from the checkpoint's config and weights' header)."""
    config = read_config(folder)
    model, origin = config["model"], config.get("origin") or {}
    params = sum(
        math.prod(shape) for _, shape in read_header(folder / WEIGHTS).tensors.values()
    )
    stacks = family_record(model.get("arch", "encoder-decoder")).stacks
    layers = "+".join(str(model[f"n_{stack}_layers"]) for stack in stacks) + " layers"
    vocab = f"{model['src_vocab_size']:,}"
    if model["tgt_vocab_size"] != model["src_vocab_size"]:
        vocab = f"{vocab} source / {model['tgt_vocab_size']:,} target"
    return (
        f"{origin.get('model_type')} as {model.get('arch', 'encoder-decoder')}: "
        f"{params:,} parameters, d_model {model['d_model']}, {layers}, {model['n_heads']} "
        f"heads; vocabulary {vocab} ({origin.get('tokenizer')}); transformers "
        f"{origin.get('transformers_version')}"
    )
