"""The Transformer of "Attention Is All You Need": attention, layers, the encoder-decoder, caches.

Plain torch modules, one formula each, read top-down: ``attention`` (section 3.2), ``layers``
(sections 3.1, 3.3-3.5), ``transformer`` (figure 1), ``families`` (the same blocks as a
decoder-only and an encoder-only model) and ``cache`` (keys and values kept for
step-by-step decoding). CPU speed-ups live in ``tformer.fast`` and are swapped into a built
model by ``tformer.fast.accelerate``; nothing here imports them.
"""

from tformer.model.attention import (
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from tformer.model.cache import DecoderCache, KVCache, LayerCache
from tformer.model.families import (
    DecoderOnlyTransformer,
    EncoderOnlyTransformer,
    build_model,
    model_class,
)
from tformer.model.transformer import (
    AttentionMaps,
    DecoderOutput,
    EncoderOutput,
    Seq2SeqOutput,
    Transformer,
    TransformerBase,
)

__all__ = [
    "AttentionMaps",
    "DecoderCache",
    "DecoderOnlyTransformer",
    "DecoderOutput",
    "EncoderOnlyTransformer",
    "EncoderOutput",
    "KVCache",
    "LayerCache",
    "MultiHeadAttention",
    "Seq2SeqOutput",
    "Transformer",
    "TransformerBase",
    "build_model",
    "causal_mask",
    "model_class",
    "padding_mask",
    "scaled_dot_product_attention",
]
