"""``tformer generate``: decode outputs for inputs given as arguments, a file, stdin, or
interactively; optionally streamed, explained step by step, or compared across settings."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import typer

from tformer.analysis.explain import attended_tokens, explain
from tformer.checkpoint import Checkpoint
from tformer.cli.app import app
from tformer.cli.compare import default_settings, print_comparison
from tformer.cli.console import console
from tformer.cli.data_options import checkpoint_family
from tformer.cli.decoding_options import DECODING_FLAGS, decoding_config, decoding_parameters
from tformer.cli.ensemble_options import (
    ENSEMBLE,
    SHORTLIST,
    refuse_with_ensemble,
    with_members,
)
from tformer.cli.explain import explanation_table
from tformer.cli.options import (
    BATCH_SIZE,
    CHECKPOINT,
    CHECKPOINT_CHOICE,
    DEVICE,
    INPUT_FILE,
    MASK_HEADS,
    QUANTIZE,
    TEXTS,
    apply_mask_heads,
    apply_quantize,
    check_batch_size,
    load_chosen,
    read_inputs,
    warn_long_inputs,
    with_parameters,
)
from tformer.config import check_text
from tformer.decoding.api import stream_tokens
from tformer.decoding.ensemble import Decodable
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.text import Generation, translate
from tformer.errors import ConfigError, DataError
from tformer.fast.accelerate import accelerate


def _load(checkpoint: Path, device: str, quantize: str, mask_heads: str | None) -> Checkpoint:
    """The checkpoint, refused unless it generates, loaded with --mask-heads applied; int8
    layers with --quantize int8, tformer's float32 speed-ups otherwise."""
    checkpoint_family(checkpoint, "generate", "generates")
    loaded = load_chosen(checkpoint, device)
    apply_mask_heads(loaded.model, mask_heads)
    if quantize == "none":
        accelerate(loaded.model)
    else:
        apply_quantize(loaded.model, quantize)
    return loaded


def _warn_long(loaded: Checkpoint, model: Decodable, inputs: list[str]) -> None:
    """Say when inputs are longer than the model reads (a prompt keeps its last tokens)."""
    warn_long_inputs(
        loaded.tokenizers.source, inputs, model.config.max_len, prompts=model.continues_prompts
    )


AS_JSON = typer.Option(
    False,
    "--json",
    help="One JSON record per output: ids, per-token log-probabilities, log p and score.",
)
STREAM = typer.Option(
    None,
    "--stream/--no-stream",
    help="Print tokens as they are decoded (default: on for one input to a terminal).",
    show_default=False,
)
INTERACTIVE = typer.Option(
    False, "--interactive", help="Keep the model loaded; read inputs at a prompt."
)
EXPLAIN = typer.Option(
    False,
    "--explain",
    help="For one input, a table of every step: the token, its probability before and "
    "after each processor, the alternatives and the source tokens attended to.",
)
COMPARE = typer.Option(
    False,
    "--compare",
    help="Decode with greedy, beam 4, temperatures 0.5/1/1.5 and top-p 0.9 and show "
    "the outputs side by side (see `tformer compare`).",
)


@app.command("generate")
@with_parameters(
    decoding_parameters(*DECODING_FLAGS, "n_best", "num_samples"), after="input_file"
)
def generate_command(
    checkpoint: Path = CHECKPOINT,
    checkpoint_choice: str = CHECKPOINT_CHOICE,
    texts: list[str] | None = TEXTS,
    input_file: Path | None = INPUT_FILE,
    batch_size: int = BATCH_SIZE,
    as_json: bool = AS_JSON,
    stream: bool | None = STREAM,
    interactive: bool = INTERACTIVE,
    explain_steps: bool = EXPLAIN,
    compare: bool = COMPARE,
    device: str = DEVICE,
    quantize: str = QUANTIZE,
    mask_heads: str | None = MASK_HEADS,
    ensemble: list[Path] | None = ENSEMBLE,
    shortlist: Path | None = SHORTLIST,
    **values: Any,
) -> None:
    """Generate outputs; one line per output, in input order (an input's outputs together).

    Greedy by default; -t samples; --beam-size searches. Logit processors run in this order:
    repetition penalty, no-repeat n-gram, min new tokens, then (sampling) temperature, top-k,
    top-p, min-p.

    Examples:

      tformer generate checkpoints/dates "6 March 2025" "the first of May 1999"

      tformer generate checkpoints/dates "6 Mar. 2025" -t 0.8 -n 3 --seed 1

      tformer generate checkpoints/dates "6 Mar. 2025" --beam-size 4 --n-best 2 --json

      tformer generate checkpoints/dates "6 Mar. 2025" -t 0.7 --top-p 0.9 --explain

      tformer generate checkpoints/dates --interactive

      tformer generate checkpoints/dates "6 Mar. 2025" --ensemble checkpoints/dates-2
    """
    config = decoding_config(values)
    _check_modes(config, batch_size, as_json, stream, interactive, explain_steps, compare)
    if explain_steps:
        refuse_with_ensemble(ensemble, "--explain", "shows the steps of one model")
        if shortlist is not None:
            raise ConfigError("--explain shows every token's score; drop --shortlist")
    if mask_heads:
        refuse_with_ensemble(ensemble, "--mask-heads", "names heads of one model")
    if interactive:
        if texts or input_file is not None:
            raise ConfigError("--interactive reads inputs at a prompt: drop TEXT / --input-file")
        loaded = _load(checkpoint, device, quantize, mask_heads)
        model, _ = with_members(
            loaded, ensemble, "generate", device=device, quantize=quantize, shortlist=shortlist
        )
        _interactive(loaded, model, config, as_json=as_json, stream=stream)
        return
    inputs = read_inputs(texts, input_file)
    if explain_steps and len(inputs) != 1:
        raise ConfigError(f"--explain shows one input at a time; got {len(inputs)}")
    loaded = _load(checkpoint, device, quantize, mask_heads)
    model, _ = with_members(
            loaded, ensemble, "generate", device=device, quantize=quantize, shortlist=shortlist
        )
    _warn_long(loaded, model, inputs)
    if compare:
        settings = default_settings(max_new_tokens=config.max_new_tokens, seed=config.seed or 0)
        print_comparison(
            loaded, inputs, settings, batch_size=batch_size, as_json=as_json, model=model
        )
    elif explain_steps:
        _explain(loaded, inputs[0], config)
    elif _should_stream(stream, config, len(inputs), as_json):
        for text in inputs:
            _stream(loaded, model, text, config)
    else:
        _print_outputs(loaded, model, inputs, config, batch_size=batch_size, as_json=as_json)


def _check_modes(
    config: DecodingConfig,
    batch_size: int,
    as_json: bool,
    stream: bool | None,
    interactive: bool,
    explain_steps: bool,
    compare: bool,
) -> None:
    check_batch_size(batch_size)
    modes = [
        name
        for name, on in (
            ("--interactive", interactive),
            ("--explain", explain_steps),
            ("--compare", compare),
        )
        if on
    ]
    if len(modes) > 1:
        raise ConfigError(f"{' and '.join(modes)} do not combine; pick one")
    if stream:
        if config.beam_size > 1:
            raise ConfigError(
                f"--stream with --beam-size {config.beam_size}: beam search knows its best "
                "output only at the end; drop one of them"
            )
        clash = ["--json"] if as_json else [m for m in modes if m != "--interactive"]
        if clash:
            raise ConfigError(f"--stream prints plain text; it does not combine with {clash[0]}")
    if as_json and explain_steps:
        raise ConfigError("--explain prints a table; it does not combine with --json")


def _should_stream(
    stream: bool | None, config: DecodingConfig, n_inputs: int, as_json: bool
) -> bool:
    if stream is not None:
        return stream
    return (
        n_inputs == 1
        and not as_json
        and config.beam_size == 1
        and config.num_samples == 1
        and stdout_is_terminal()
    )


def stdout_is_terminal() -> bool:
    """Whether results go to a terminal (then a single output is streamed by default)."""
    return sys.stdout.isatty()


def _records(
    text: str, outputs: list[Generation], config: DecodingConfig
) -> Iterable[dict[str, Any]]:
    for index, generation in enumerate(outputs):
        hyp = generation.hypothesis
        record: dict[str, Any] = {"input": text, "output": generation.text}
        record["rank" if config.beam_size > 1 else "sample"] = index
        record |= {
            "ids": hyp.ids,
            "token_logprobs": [round(x, 6) for x in hyp.token_logprobs],
            "logprob": round(hyp.logprob, 6),
            "score": round(hyp.score, 6),
            "length": len(hyp.ids),
            "finished": hyp.finished,
        }
        yield record


def _print_outputs(
    loaded: Checkpoint,
    model: Decodable,
    inputs: list[str],
    config: DecodingConfig,
    *,
    batch_size: int,
    as_json: bool,
) -> None:
    generations = translate(model, loaded.tokenizers, inputs, config, batch_size=batch_size)
    for text, outputs in zip(inputs, generations, strict=True):
        for record in _records(text, outputs, config):
            typer.echo(json.dumps(record, ensure_ascii=False) if as_json else record["output"])


def _stream(loaded: Checkpoint, model: Decodable, text: str, config: DecodingConfig) -> None:
    """Print each output's text piece by piece as its tokens arrive; one line per output."""
    src = loaded.tokenizers.source.encode(text)
    tgt = loaded.tokenizers.target
    for sample in range(config.num_samples):
        ids: list[int] = []
        shown = ""
        for token in stream_tokens(model, src, config, sample=sample):
            ids.append(token)
            decoded = tgt.decode(ids)
            # Print only once the text so far extends what is on screen (it nearly always
            # does; a token that rewrites earlier text waits for the next one).
            if decoded.startswith(shown):
                typer.echo(decoded[len(shown) :], nl=False)
                shown = decoded
        final = tgt.decode(ids)
        typer.echo(final[len(shown) :] if final.startswith(shown) else "")


def _explain(loaded: Checkpoint, text: str, config: DecodingConfig) -> None:
    src = loaded.tokenizers.source.encode(text)
    outputs = translate(loaded.model, loaded.tokenizers, [text], config)[0]
    for index, generation in enumerate(outputs):
        hyp = generation.hypothesis
        steps = explain(loaded.model, src, hyp, config)
        title = f"{text!r} -> {generation.text!r}"
        if len(outputs) > 1:
            title = f"output {index + 1}/{len(outputs)}: {title}"
        decoder_only = loaded.model.continues_prompts
        columns = attended_tokens(loaded.model, loaded.tokenizers, src, hyp)
        table = explanation_table(
            steps, columns, loaded.tokenizers, config, hyp, title=title, decoder_only=decoder_only
        )
        console.print(table)


def _read_line() -> str:
    """One line of stdin; bytes that are not UTF-8 become lone surrogates (refused by the
    caller, one line at a time) whatever the locale, never a decoding error."""
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:
        return sys.stdin.readline()
    return bytes(stream.readline()).decode("utf-8", "surrogateescape")


def _interactive(
    loaded: Checkpoint,
    model: Decodable,
    config: DecodingConfig,
    *,
    as_json: bool,
    stream: bool | None,
) -> None:
    """Read one input a line at a prompt until end of input, an empty line or "exit"."""
    typer.echo("one input a line; an empty line, 'exit' or Ctrl-D ends", err=True)
    while True:
        typer.echo("> ", err=True, nl=False)
        line = _read_line()
        text = line.rstrip("\r\n")
        if not line or not text.strip() or text.strip() in ("exit", "quit"):
            break
        try:
            check_text(text, "this line")
        except DataError as error:  # one bad line (bytes that are not UTF-8) ends nothing
            typer.echo(f"error: {error}", err=True)
            continue
        _warn_long(loaded, model, [text])
        if _should_stream(stream, config, 1, as_json):
            _stream(loaded, model, text, config)
        else:
            _print_outputs(loaded, model, [text], config, batch_size=64, as_json=as_json)
