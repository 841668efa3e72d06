"""The JSON bodies the API accepts: strict types, unknown fields refused.

The decoding fields are ``DecodingConfig``'s, under the same names; turning them into one
runs the library's own checks, so an impossible combination is refused with the same message
``tformer generate`` gives for the same flags.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tformer.decoding.settings import DecodingConfig

_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(DecodingConfig)}


class Strict(BaseModel):
    """Unknown fields and loose types ("4" for 4, true for 1) are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Decoding(Strict):
    """Decoding settings, as ``tformer generate`` takes them (``--top-k`` is ``top_k``)."""

    temperature: float = Field(_DEFAULTS["temperature"], description="0 is greedy.")
    top_k: int = Field(_DEFAULTS["top_k"], description="0 = off.")
    top_p: float = Field(_DEFAULTS["top_p"], description="1 = off.")
    min_p: float = Field(_DEFAULTS["min_p"], description="0 = off.")
    repetition_penalty: float = Field(_DEFAULTS["repetition_penalty"], description="1 = off.")
    no_repeat_ngram_size: int = Field(_DEFAULTS["no_repeat_ngram_size"], description="0 = off.")
    beam_size: int = Field(_DEFAULTS["beam_size"], description="1 = greedy / sampling.")
    length_penalty: float = Field(_DEFAULTS["length_penalty"], description="Beam search only.")
    n_best: int = Field(_DEFAULTS["n_best"], description="Beam search outputs per input.")
    min_new_tokens: int = Field(_DEFAULTS["min_new_tokens"])
    max_new_tokens: int | None = Field(
        None, description="Default: the library's, or the server's cap when lower."
    )
    num_samples: int = Field(_DEFAULTS["num_samples"], description="Samples per input.")
    seed: int | None = Field(
        None,
        description="The same seed gives the same samples; without one, sampling gets a fresh "
        "seed, reported in the answer.",
    )

    def decoding_config(self, *, max_new_tokens: int, seed: int | None) -> DecodingConfig:
        """The library's settings (its checks run here: ``ConfigError`` when impossible)."""
        values = self.model_dump(exclude={"max_new_tokens", "seed"}, include=set(_DEFAULTS))
        return DecodingConfig(**values, max_new_tokens=max_new_tokens, seed=seed)


class TranslateRequest(Decoding):
    inputs: str | list[str] = Field(description="One text, or a list of texts.")
    stream: bool = Field(
        False, description="Server-sent events, one per token (one input; no beam search)."
    )


class AttentionRequest(Strict):
    source: str
    target: str | None = Field(None, description="Teacher-forced; default: the model's output.")
    kind: Literal["encoder", "decoder", "cross"] = "cross"
    layer: int | Literal["all"] = Field(-1, description="Negative counts from the end.")
    head: int | Literal["all", "mean"] = "mean"
    temperature: float = Field(0.0, description="For the model's output: 0 is greedy.")
    seed: int | None = None


class ExplainRequest(Decoding):
    source: str
    target: str | None = Field(
        None, description="The output to explain; default: decode one with these settings."
    )
    output: int = Field(0, ge=0, description="Which output of the decoded ones (0 = first).")
