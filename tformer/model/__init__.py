"""The Transformer model: attention, layers and the encoder-decoder."""

from tformer.model.attention import (
    KVCache,
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from tformer.model.transformer import (
    AttentionMaps,
    DecoderCache,
    DecoderOutput,
    EncoderOutput,
    Seq2SeqOutput,
    Transformer,
)

__all__ = [
    "AttentionMaps",
    "DecoderCache",
    "DecoderOutput",
    "EncoderOutput",
    "KVCache",
    "MultiHeadAttention",
    "Seq2SeqOutput",
    "Transformer",
    "causal_mask",
    "padding_mask",
    "scaled_dot_product_attention",
]
