"""The decoding flags, defined once: each command that decodes takes the ones it needs as
parameters (``decoding_parameters``) and reads them back as one ``DecodingConfig``."""

from __future__ import annotations

import dataclasses
import typing
from inspect import Parameter
from typing import Any

import typer

from tformer.cli.options import default
from tformer.config import flag
from tformer.decoding.settings import DecodingConfig


def _option(name: str, *aliases: str, help: str) -> Any:
    """The flag of a DecodingConfig field: named after it, with the config's default."""
    return typer.Option(default(DecodingConfig, name), flag(name), *aliases, help=help)


_OPTIONS: dict[str, Any] = {
    "temperature": _option(
        "temperature",
        "-t",
        help="Sample from softmax(z / T); 0 means greedy (always the most likely token).",
    ),
    "top_k": _option("top_k", help="Sample among the k most likely tokens only; 0 = off."),
    "top_p": _option(
        "top_p",
        help="Nucleus sampling: the smallest set of tokens with this much probability; 1 = off.",
    ),
    "min_p": _option(
        "min_p",
        help="Sample only tokens at least this fraction as likely as the most likely one; "
        "0 = off.",
    ),
    "repetition_penalty": _option(
        "repetition_penalty",
        help="Divide a seen token's positive logit by this (multiply a negative one); 1 = off.",
    ),
    "no_repeat_ngram_size": _option(
        "no_repeat_ngram_size",
        help="Never repeat an n-gram of the output of this size; 0 = off.",
    ),
    "beam_size": _option(
        "beam_size", "-b", help="Beam search with this many beams; 1 = greedy / sampling."
    ),
    "length_penalty": _option(
        "length_penalty",
        help="Beam score = sum log p / length ** this (length counts <eos>); 0 favours short "
        "outputs, 1 is the mean log-probability per token, more favours long ones.",
    ),
    "n_best": _option("n_best", help="Beam search outputs per input."),
    "min_new_tokens": _option(
        "min_new_tokens", help="Forbid <eos> until this many tokens are generated."
    ),
    "max_new_tokens": _option(
        "max_new_tokens",
        help="The most tokens generated for each output (fewer when <eos> comes first).",
    ),
    "num_samples": _option("num_samples", "-n", help="Samples per input."),
    "seed": _option("seed", help="Random seed: the same seed gives the same output."),
}

# The flags of every command that samples or searches (generate, evaluate); generate adds
# n_best and num_samples, for more than one output per input.
DECODING_FLAGS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "beam_size",
    "length_penalty",
    "min_new_tokens",
    "max_new_tokens",
    "seed",
)


def decoding_parameters(*names: str) -> list[Parameter]:
    """The flags ``names`` as keyword parameters for ``with_parameters``, in the config's
    field order, so every command lists them alike."""
    hints = typing.get_type_hints(DecodingConfig)
    order = [f.name for f in dataclasses.fields(DecodingConfig)]
    return [
        Parameter(name, Parameter.KEYWORD_ONLY, default=_OPTIONS[name], annotation=hints[name])
        for name in sorted(names, key=order.index)
    ]


def decoding_config(values: dict[str, Any]) -> DecodingConfig:
    """The ``DecodingConfig`` of a command's decoding flags (its parameters named like the
    config's fields), so every command that decodes takes the same flags the same way."""
    names = {f.name for f in dataclasses.fields(DecodingConfig)}
    return DecodingConfig(**{k: v for k, v in values.items() if k in names})
