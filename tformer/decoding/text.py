"""Text in, text out: encode with the source tokenizer, decode, detokenise with the target one.

Every caller that starts from text (the CLI's generate / compare, ``tformer evaluate``, the
public ``tformer.generate``) goes through ``translate``, so the three steps are written once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tformer.checkpoint import Checkpoint, Tokenizers
from tformer.decoding.api import decode_texts
from tformer.decoding.ensemble import Decodable, accelerate_members
from tformer.decoding.settings import DecodingConfig, Hypothesis


@dataclass(frozen=True)
class Generation:
    """One output for one input: its text and the hypothesis it was decoded from."""

    text: str
    hypothesis: Hypothesis


def translate(
    model: Decodable,
    tokenizers: Tokenizers,
    texts: Sequence[str],
    config: DecodingConfig | None = None,
    *,
    batch_size: int = 64,
) -> list[list[Generation]]:
    """Decode ``texts`` with ``model``; outputs per input in the order ``decode_texts`` gives.

    ``model`` (or each member of an ensemble) gets tformer's speed-ups first
    (``tformer.fast.accelerate``, in place): the same outputs, faster. A model quantised with
    ``tformer.fast.int8.quantize_int8`` keeps its int8 layers. ``tokenizers`` are the
    (first) model's.

    Args:
        batch_size: rows decoded together (each input takes num_samples or beam_size rows).
    Returns:
        For each input, ``config.num_samples`` generations, or the ``n_best`` of beam search.
    """
    accelerate_members(model)
    src = [tokenizers.source.encode(text) for text in texts]
    hyps = decode_texts(model, src, config or DecodingConfig(), batch_size=batch_size)
    flat = [hyp for per_input in hyps for hyp in per_input]
    decoded = iter(tokenizers.target.decode_batch([hyp.ids for hyp in flat]))
    return [[Generation(next(decoded), hyp) for hyp in per_input] for per_input in hyps]


def generate(
    checkpoint: Checkpoint, texts: Sequence[str], config: DecodingConfig | None = None
) -> list[list[str]]:
    """Decode ``texts`` with a loaded checkpoint; ``num_samples`` strings per input."""
    outputs = translate(checkpoint.model, checkpoint.tokenizers, texts, config)
    return [[g.text for g in per_input] for per_input in outputs]
