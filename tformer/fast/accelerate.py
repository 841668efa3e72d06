"""One explicit call that swaps the speed-ups into a built model, and one that takes them out.

Each fast module is a subclass of the model's own that adds no parameter or buffer, so a
swap changes the class of a module in place: the state dict, the parameters (and whatever
optimizer or EMA holds them) and ``forward``'s results stay the same.
"""

from __future__ import annotations

from torch import nn

from tformer.fast.attention import FastMultiHeadAttention
from tformer.fast.dropout import Dropout
from tformer.fast.linear import Linear, forget_packed
from tformer.fast.step import (
    FastDecoderLayer,
    FastFeedForward,
    FastGatedFeedForward,
    FastTransformer,
    LeanStep,
)
from tformer.model.attention import MultiHeadAttention
from tformer.model.layers import DecoderLayer, FeedForward, GatedFeedForward
from tformer.model.transformer import Transformer, TransformerBase

SWAPS: dict[type[nn.Module], type[nn.Module]] = {
    nn.Linear: Linear,
    nn.Dropout: Dropout,
    MultiHeadAttention: FastMultiHeadAttention,
    FeedForward: FastFeedForward,
    GatedFeedForward: FastGatedFeedForward,
    DecoderLayer: FastDecoderLayer,
    Transformer: FastTransformer,
}
_PLAIN = {fast: plain for plain, fast in SWAPS.items()}


def _swap(model: nn.Module, table: dict[type[nn.Module], type[nn.Module]]) -> None:
    for module in model.modules():
        # Exact types only: a user's own subclass keeps its behaviour.
        new = table.get(type(module))
        if new is not None:
            module.__class__ = new


def accelerate(model: TransformerBase) -> TransformerBase:
    """Swap tformer's speed-ups into ``model`` (in place) and return it.

    Packed and split linear products and the lean cached decoding step (with folded
    cross-attention) for small-batch CPU inference, and a cheaper dropout mask and the
    faster attention backward for CPU training in bf16/fp16. Elsewhere each falls back to
    the plain path. Idempotent; :func:`plain` undoes it. A decoder-only or encoder-only model
    gets the layers' speed-ups; the lean step is the encoder-decoder's (theirs decode through
    ``decode`` with the cache).
    """
    _swap(model, SWAPS)
    return model


def plain(model: TransformerBase) -> TransformerBase:
    """Undo :func:`accelerate`: every module back to the model's own class (in place)."""
    _swap(model, _PLAIN)
    forget_fast_weights(model)
    return model


def forget_fast_weights(model: nn.Module) -> None:
    """Drop the packed or stacked copies of weights the fast path keeps (plain attributes)."""
    for module in model.modules():
        forget_packed(module)
        for key in ("_qkv", "_transposed_cache"):
            module.__dict__.pop(key, None)


def is_accelerated(model: nn.Module) -> bool:
    """Whether :func:`accelerate` has been applied to ``model``."""
    return isinstance(model, LeanStep)
