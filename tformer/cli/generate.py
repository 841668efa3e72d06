"""``tformer generate``: decode outputs for inputs given as arguments, a file, or stdin."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from tformer.checkpoint import load_checkpoint
from tformer.cli import app
from tformer.cli.options import (
    CHECKPOINT,
    DEVICE,
    MAX_NEW_TOKENS,
    SEED,
    TEMPERATURE,
    TOP_K,
    TOP_P,
    existing_file,
)
from tformer.decoding import DecodingConfig, decode_texts
from tformer.device import resolve_device
from tformer.errors import ConfigError, DataError


def read_inputs(texts: list[str] | None, input_file: Path | None) -> list[str]:
    """Inputs from arguments, else ``--input-file``, else stdin; one input a line."""
    if texts and input_file is not None:
        raise ConfigError("give inputs as arguments or with --input-file, not both")
    if texts:
        return list(texts)
    if input_file is not None:
        existing_file(input_file, "--input-file")
        try:
            return input_file.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as error:
            raise DataError(f"--input-file {input_file}: not UTF-8 text ({error})") from error
    if sys.stdin is None or sys.stdin.isatty():
        raise ConfigError("no input: give TEXT arguments, --input-file FILE, or pipe lines in")
    return sys.stdin.read().splitlines()


@app.command("generate")
def generate_command(
    checkpoint: Path = CHECKPOINT,
    texts: list[str] | None = typer.Argument(
        None, help="Inputs (default: --input-file or stdin, one a line).", show_default=False
    ),
    input_file: Path | None = typer.Option(None, "--input-file", "-i", show_default=False),
    temperature: float = TEMPERATURE,
    top_k: int = TOP_K,
    top_p: float = TOP_P,
    max_new_tokens: int = MAX_NEW_TOKENS,
    num_samples: int = typer.Option(1, "--num-samples", "-n", help="Outputs per input."),
    seed: int | None = SEED,
    batch_size: int = typer.Option(64, "--batch-size", help="Rows decoded together."),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="One JSON record per output, with ids, per-token log-probabilities and the score.",
    ),
    device: str = DEVICE,
) -> None:
    """Generate outputs; one line per output, in input order (samples of an input together).

    Example: tformer generate checkpoints/dates "6 March 2025" "the first of May 1999" -t 0
    """
    config = DecodingConfig(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        num_samples=num_samples,
        seed=seed,
    )
    if batch_size < 1:
        raise ConfigError(f"--batch-size {batch_size} must be >= 1")
    inputs = read_inputs(texts, input_file)
    loaded = load_checkpoint(checkpoint, resolve_device(device))
    src = [loaded.tokenizers.source.encode(t) for t in inputs]
    hyps = decode_texts(loaded.model, src, config, batch_size=batch_size)
    tgt = loaded.tokenizers.target
    for text, samples in zip(inputs, hyps, strict=True):
        for index, hyp in enumerate(samples):
            output = tgt.decode(hyp.ids)
            if as_json:
                record = {
                    "input": text,
                    "output": output,
                    "sample": index,
                    "ids": hyp.ids,
                    "token_logprobs": [round(x, 6) for x in hyp.token_logprobs],
                    "score": round(hyp.score, 6),
                    "finished": hyp.finished,
                }
                typer.echo(json.dumps(record, ensure_ascii=False))
            else:
                typer.echo(output)
