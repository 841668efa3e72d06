"""What the API answers, as JSON-ready dicts: outputs, attention maps, explanations, the model."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any

from tformer.analysis.attention import AttentionSelection
from tformer.analysis.explain import StepExplanation
from tformer.checkpoint.files import MANIFEST
from tformer.checkpoint.store import Checkpoint
from tformer.data.tokenizer import Tokenizer
from tformer.decoding.settings import DecodingConfig, Hypothesis
from tformer.version import __version__

DECIMALS = 6


def output_record(
    text: str, hyp: Hypothesis, index: int, config: DecodingConfig, tokens: list[str]
) -> dict[str, Any]:
    """One output, as ``tformer generate --json`` writes it, plus its token strings."""
    return {
        "output": text,
        "rank" if config.beam_size > 1 else "sample": index,
        "ids": hyp.ids,
        "tokens": tokens,
        "token_logprobs": [round(x, DECIMALS) for x in hyp.token_logprobs],
        "logprob": round(hyp.logprob, DECIMALS),
        "score": round(hyp.score, DECIMALS),
        "length": len(hyp.ids),
        "finished": hyp.finished,
    }


def settings_record(config: DecodingConfig) -> dict[str, Any]:
    """The decoding settings a request was answered with (its seed included)."""
    return {
        "temperature": config.temperature,
        "top_k": config.top_k,
        "top_p": config.top_p,
        "min_p": config.min_p,
        "repetition_penalty": config.repetition_penalty,
        "no_repeat_ngram_size": config.no_repeat_ngram_size,
        "beam_size": config.beam_size,
        "length_penalty": config.length_penalty,
        "n_best": config.n_best,
        "min_new_tokens": config.min_new_tokens,
        "max_new_tokens": config.max_new_tokens,
        "num_samples": config.num_samples,
        "seed": config.seed,
    }


def attention_record(selection: AttentionSelection) -> dict[str, Any]:
    """One selection of maps, as ``inspect-attention --save x.json`` writes it."""
    scale = 10**DECIMALS
    weights = ((selection.weights.double() * scale).round() / scale).tolist()
    return {
        **selection.metadata(),
        "rows": selection.rows,
        "columns": selection.columns,
        "weights": weights,
    }


def explain_record(
    steps: Sequence[StepExplanation],
    source_tokens: list[str],
    target_token: Callable[[int], str],
) -> list[dict[str, Any]]:
    """Each step: the token, its probability after each processor, alternatives, source."""
    return [
        {
            "step": t,
            "id": step.token,
            "token": target_token(step.token),
            "probs": {name: round(p, DECIMALS) for name, p in step.probs.items()},
            "alternatives": [
                {"id": i, "token": target_token(i), "p": round(p, DECIMALS)}
                for i, p in step.alternatives
                if p > 0
            ],
            "source": [
                {"position": j, "token": source_tokens[j], "weight": round(w, DECIMALS)}
                for j, w in step.source
            ],
        }
        for t, step in enumerate(steps)
    ]


def logprob_of(steps: Sequence[StepExplanation]) -> float:
    """The model's log-probability of an explained output (sum of its steps' model p)."""
    return round(sum(math.log(max(s.probs["model"], 1e-45)) for s in steps), DECIMALS)


def model_record(loaded: Checkpoint, quantize: str) -> dict[str, Any]:
    """``GET /v1/model``: the architecture, parameter counts, tokenizers and checkpoint hash."""
    tokenizers = loaded.tokenizers
    manifest = loaded.path / MANIFEST
    return {
        "checkpoint": str(loaded.path),
        "step": loaded.step,
        "manifest_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest(),
        "config": loaded.model_config.to_dict(),
        "parameters": loaded.model.parameter_counts(),
        "tokenizer": {
            "shared": tokenizers.shared,
            "source": _tokenizer(tokenizers.source),
            "target": _tokenizer(tokenizers.target),
        },
        "quantize": quantize,
        "tformer_version": __version__,
    }


def _tokenizer(tokenizer: Tokenizer) -> dict[str, Any]:
    return {
        "kind": tokenizer.kind,
        "vocab_size": tokenizer.vocab_size,
        "sha256": tokenizer.sha256(),
    }
