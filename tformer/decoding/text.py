"""Text in, text out: encode with the source tokenizer, decode, detokenize with the target's."""

from __future__ import annotations

from collections.abc import Sequence

from tformer.checkpoint.store import Checkpoint
from tformer.decoding.api import decode_texts
from tformer.decoding.settings import DecodingConfig
from tformer.fast.accelerate import accelerate


def generate(
    checkpoint: Checkpoint, texts: Sequence[str], config: DecodingConfig | None = None
) -> list[list[str]]:
    """Decode ``texts`` with a loaded checkpoint; ``num_samples`` strings per input.

    The checkpoint's model gets tformer's speed-ups (``tformer.fast.accelerate``) first.
    """
    config = config or DecodingConfig()
    accelerate(checkpoint.model)
    src = [checkpoint.tokenizers.source.encode(t) for t in texts]
    hyps = decode_texts(checkpoint.model, src, config)
    target = checkpoint.tokenizers.target
    return [[target.decode(h.ids) for h in per_input] for per_input in hyps]
