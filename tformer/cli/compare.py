"""``tformer compare``: the same inputs under several decoding settings, side by side."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from tformer.checkpoint.store import Checkpoint
from tformer.cli.app import app
from tformer.cli.console import console
from tformer.cli.data_options import checkpoint_family
from tformer.cli.decoding_options import decoding_parameters
from tformer.cli.ensemble_options import ENSEMBLE, SHORTLIST, with_members
from tformer.cli.options import (
    BATCH_SIZE,
    CHECKPOINT,
    CHECKPOINT_CHOICE,
    DEVICE,
    INPUT_FILE,
    QUANTIZE,
    TEXTS,
    apply_quantize,
    check_batch_size,
    default,
    load_chosen,
    read_inputs,
    warn_long_inputs,
    with_parameters,
)
from tformer.decoding.ensemble import Decodable
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.text import Generation, translate
from tformer.errors import ConfigError

Setting = tuple[str, DecodingConfig]


def default_settings(
    *,
    beam_size: int = 4,
    temperatures: Sequence[float] = (0.5, 1.0, 1.5),
    top_p: float = 0.9,
    max_new_tokens: int = default(DecodingConfig, "max_new_tokens"),
    seed: int = 0,
) -> list[Setting]:
    """Greedy, beam search, a temperature sweep and nucleus sampling (T = 1), fixed seed.

    A beam size of 1 or a top-p of 1 leaves that setting out.
    """
    limit = max_new_tokens
    settings: list[Setting] = [("greedy", DecodingConfig(max_new_tokens=limit))]
    if beam_size > 1:
        beam = DecodingConfig(beam_size=beam_size, max_new_tokens=limit)
        settings.append((f"beam {beam_size}", beam))
    for t in temperatures:
        sampled = DecodingConfig(temperature=t, seed=seed, max_new_tokens=limit)
        settings.append((f"T={t:g}", sampled))
    if top_p < 1.0:
        nucleus = DecodingConfig(temperature=1.0, top_p=top_p, seed=seed, max_new_tokens=limit)
        settings.append((f"top-p {top_p:g}", nucleus))
    return settings


def parse_temperatures(text: str) -> list[float]:
    """ "0.5,1,1.5" -> [0.5, 1.0, 1.5]; an empty string means no temperature rows."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(
            f"--temperatures {text!r} must be numbers separated by commas, e.g. 0.5,1,1.5"
        ) from None
    for t in values:
        if t <= 0:
            raise ConfigError(f"--temperatures: {t:g} must be > 0 (greedy has its own row)")
    return values


def compare_outputs(
    loaded: Checkpoint,
    inputs: list[str],
    settings: list[Setting],
    *,
    batch_size: int = 64,
    model: Decodable | None = None,
) -> list[list[tuple[str, Generation]]]:
    """For each input, the first output of each setting, in settings order; decoded by
    ``model`` (an ensemble with ``loaded``'s tokenizers) when given, else ``loaded``'s."""
    decoder = loaded.model if model is None else model
    per_setting = [
        translate(decoder, loaded.tokenizers, inputs, config, batch_size=batch_size)
        for _, config in settings
    ]
    return [
        [(label, outputs[i][0]) for (label, _), outputs in zip(settings, per_setting, strict=True)]
        for i in range(len(inputs))
    ]


def comparison_table(text: str, rows: list[tuple[str, Generation]]) -> Table:
    table = Table(title=escape(text), title_justify="left")
    table.add_column("setting", no_wrap=True)
    table.add_column("output")
    table.add_column("log p", justify="right")
    table.add_column("per token", justify="right")
    table.add_column("tokens", justify="right")
    for label, generation in rows:
        hyp = generation.hypothesis
        output = escape(generation.text)
        if not hyp.finished:
            output += " [dim](cut off)[/]"
        per_token = hyp.logprob / max(len(hyp.token_logprobs), 1)
        table.add_row(label, output, f"{hyp.logprob:.3f}", f"{per_token:.3f}", str(len(hyp.ids)))
    return table


def print_comparison(
    loaded: Checkpoint,
    inputs: list[str],
    settings: list[Setting],
    *,
    batch_size: int = 64,
    as_json: bool = False,
    model: Decodable | None = None,
) -> None:
    """One table per input (or one JSON record per input and setting) on stdout."""
    outputs = compare_outputs(loaded, inputs, settings, batch_size=batch_size, model=model)
    for text, rows in zip(inputs, outputs, strict=True):
        if not as_json:
            console.print(comparison_table(text, rows))
            continue
        for label, generation in rows:
            hyp = generation.hypothesis
            record = {
                "input": text,
                "setting": label,
                "output": generation.text,
                "ids": hyp.ids,
                "logprob": round(hyp.logprob, 6),
                "score": round(hyp.score, 6),
                "length": len(hyp.ids),
                "finished": hyp.finished,
            }
            typer.echo(json.dumps(record, ensure_ascii=False))


@app.command("compare")
@with_parameters(decoding_parameters("max_new_tokens"), after="seed")
def compare_command(
    checkpoint: Path = CHECKPOINT,
    checkpoint_choice: str = CHECKPOINT_CHOICE,
    texts: list[str] | None = TEXTS,
    input_file: Path | None = INPUT_FILE,
    beam_size: int = typer.Option(4, "--beam-size", "-b", help="Beam row; 1 leaves it out."),
    temperatures: str = typer.Option(
        "0.5,1,1.5", "--temperatures", help="Sampling rows, comma-separated; '' for none."
    ),
    top_p: float = typer.Option(
        0.9, "--top-p", help="Nucleus sampling row (at T = 1); 1 leaves it out."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of every sampling row."),
    batch_size: int = BATCH_SIZE,
    as_json: bool = typer.Option(
        False, "--json", help="One JSON record per input and setting instead of tables."
    ),
    device: str = DEVICE,
    quantize: str = QUANTIZE,
    ensemble: list[Path] | None = ENSEMBLE,
    shortlist: Path | None = SHORTLIST,
    **values: Any,
) -> None:
    """Decode the same inputs under several settings; outputs, log p and lengths side by side.

    Rows: greedy, beam search, one per temperature, and nucleus sampling (top-p at T = 1).
    Sampling rows use a fixed seed, so the table repeats.
    Log-probabilities are the model's (before temperature and filters), so rows compare.

    Examples:

      tformer compare checkpoints/dates "6 Mar. 2025" "03/06/25"

      tformer compare checkpoints/dates "6 Mar. 2025" --beam-size 8 --temperatures 0.3,2

      tformer compare checkpoints/dates "6 Mar. 2025" --ensemble checkpoints/dates-2
    """
    check_batch_size(batch_size)
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"--top-p {top_p} must be in (0, 1] (1 leaves the row out)")
    if beam_size < 1:
        raise ConfigError(f"--beam-size {beam_size} must be >= 1 (1 leaves the row out)")
    settings = default_settings(
        beam_size=beam_size,
        temperatures=parse_temperatures(temperatures),
        top_p=top_p,
        max_new_tokens=values["max_new_tokens"],
        seed=seed,
    )
    inputs = read_inputs(texts, input_file)
    checkpoint_family(checkpoint, "compare", "generates")
    loaded = load_chosen(checkpoint, device)
    apply_quantize(loaded.model, quantize)
    model, _ = with_members(
        loaded, ensemble, "compare", device=device, quantize=quantize, shortlist=shortlist
    )
    warn_long_inputs(loaded.tokenizers.source, inputs, model.config.max_len)
    print_comparison(
        loaded, inputs, settings, batch_size=batch_size, as_json=as_json, model=model
    )
