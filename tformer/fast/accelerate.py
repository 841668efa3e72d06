"""One explicit call that swaps the speed-ups into a built model, and one that takes them out.

Each fast module is a subclass of the model's own that adds no parameter or buffer and no
maths: it overrides only kernels (how a product, a cache or an attention is computed), listed
in :data:`KERNELS`. A swap changes the class of a module in place: the state dict, the
parameters (and whatever optimizer or EMA holds them) and the results stay the same.
"""

from __future__ import annotations

from torch import nn

from tformer.fast.attention import FastMultiHeadAttention
from tformer.fast.dropout import Dropout
from tformer.fast.linear import Linear, forget_packed
from tformer.fast.step import FastTransformer, LeanStep
from tformer.model.attention import MultiHeadAttention
from tformer.model.transformer import Transformer, TransformerBase

# The kernel table: each model class and the subclass holding its faster kernels.
KERNELS: dict[type[nn.Module], type[nn.Module]] = {
    nn.Linear: Linear,  # products packed or split over threads
    nn.Dropout: Dropout,  # a cheaper mask in reduced precision
    # the step's stacked QKV product, folded cross-attention, the written-out backward
    MultiHeadAttention: FastMultiHeadAttention,
    Transformer: FastTransformer,  # the folding cache, the packed vocabulary projection
}
_PLAIN = {fast: plain for plain, fast in KERNELS.items()}


def _swap(model: nn.Module, table: dict[type[nn.Module], type[nn.Module]]) -> None:
    for module in model.modules():
        # Exact types only: a user's own subclass keeps its behaviour.
        new = table.get(type(module))
        if new is not None:
            module.__class__ = new


def accelerate(model: TransformerBase) -> TransformerBase:
    """Swap tformer's speed-ups into ``model`` (in place) and return it.

    Packed and split linear products, and the model's cached decoding step with folded
    cross-attention, for small-batch CPU inference; a cheaper dropout mask and the faster
    attention backward for CPU training in bf16/fp16. Elsewhere each falls back to the plain
    kernel. Idempotent; :func:`plain` undoes it. A decoder-only or encoder-only model gets the
    layers' kernels; decoding by ``step`` is the encoder-decoder's (theirs decode through
    ``decode`` with the cache, int8's decoder-only by ``step``).
    """
    _swap(model, KERNELS)
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
