"""The lean cached decoding step: the decoder's maths for one new position per row.

A decoding step of a small model is bound by how many tensor operations and module calls it
runs more than by arithmetic, so these subclasses of the model's modules add a ``step`` that
runs the same sublayers, residuals and norms without module calls or dropout (inference
only). They keep the model's parameters and ``forward``; the tests hold ``step`` equal to it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.fast.attention import FastMultiHeadAttention, FoldingKVCache
from tformer.fast.linear import direct, fast_linear
from tformer.model.cache import DecoderCache, LayerCache
from tformer.model.layers import DecoderLayer, FeedForward, GatedFeedForward, residual
from tformer.model.transformer import Decoder, Transformer, TransformerBase


def layer_norm(norm: nn.LayerNorm | nn.RMSNorm, x: Tensor) -> Tensor:
    """``norm(x)`` (LayerNorm or RMSNorm) without the module call."""
    if isinstance(norm, nn.RMSNorm):
        return F.rms_norm(x, norm.normalized_shape, norm.weight, norm.eps)
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def step_mask(mask: Tensor) -> Tensor | None:
    """A source padding mask for step-by-step decoding, or None when it hides nothing.

    Read back once per source batch: attention without a mask skips converting it at every
    layer of every step.
    """
    return None if bool(mask.all()) else mask


class FastFeedForward(FeedForward):
    """:class:`FeedForward` with ``step``; same parameters."""

    def step(self, x: Tensor) -> Tensor:
        h = direct(self.w1, x)
        # In place: the hidden layer is this call's own tensor, and writing a fresh one is a
        # noticeable part of a small model's step.
        h = F.relu(h, inplace=True) if self.activation is F.relu else self.activation(h)
        return direct(self.w2, h)


class FastGatedFeedForward(GatedFeedForward):
    """:class:`GatedFeedForward` with ``step``; same parameters."""

    def step(self, x: Tensor) -> Tensor:
        gate = self.activation(direct(self.w1, x))
        return direct(self.w2, gate.mul_(direct(self.v, x)))  # in place, as FastFeedForward


class FastDecoderLayer(DecoderLayer):
    """:class:`DecoderLayer` with ``step``; same parameters."""

    self_attn: FastMultiHeadAttention
    cross_attn: FastMultiHeadAttention
    feed_forward: FastFeedForward | FastGatedFeedForward

    def step(
        self,
        x: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None,
        cache: LayerCache,
        position_bias: Tensor | None = None,
    ) -> Tensor:
        """``forward`` for one new position per row (B, 1, D), at inference, with a cache
        (and T5's relative ``position_bias`` (1, H, 1, t) on the self-attention scores)."""
        self_attn = self.self_attn
        sublayers: list[tuple[nn.LayerNorm | nn.RMSNorm, Callable[[Tensor], Tensor]]] = [
            (
                self.norm1,
                lambda h: self_attn.step(h, cache.self_attn, position_bias=position_bias),
            )
        ]
        if self.has_cross:  # a decoder-only model's block has none
            cross = self.cross_attn
            sublayers.append(
                (self.norm2, lambda h: cross.step(h, cache.cross_attn, memory, memory_mask))
            )
        sublayers.append((self.norm3, self.feed_forward.step))
        for norm, sublayer in sublayers:
            x = residual(x, sublayer, partial(layer_norm, norm), self.pre_norm)
        return x


class LeanStep(TransformerBase):
    """A lean ``step`` and a faster inference projection for any family with a decoder;
    mixed in before the family's own class (:class:`FastTransformer`, int8's decoder-only)."""

    decoder: Decoder

    def step(
        self, tgt: Tensor, memory: Tensor, memory_mask: Tensor | None, cache: DecoderCache
    ) -> Tensor:
        """(B, 1) newest tokens -> (B, 1, V) logits, through each layer's ``step``.

        The same result as ``decode(tgt, encoded, cache=cache).logits`` in eval mode.
        """
        decoder = self.decoder
        start = cache.length
        x = decoder.positions(decoder.embedding(tgt), start)  # (B, 1, D)
        bias = decoder.relative(1, start + 1, start) if decoder.relative is not None else None
        for layer, layer_cache in zip(decoder.layers, cache.layers, strict=True):
            assert isinstance(layer, FastDecoderLayer)  # accelerate() swapped every layer
            x = layer.step(x, memory, memory_mask, layer_cache, bias)
        cache.length += 1
        return self.project(decoder.finish(x))

    def new_cache(self) -> DecoderCache:
        return DecoderCache([LayerCache(cross_attn=FoldingKVCache()) for _ in self.decoder.layers])

    def project(self, hidden: Tensor) -> Tensor:
        if (
            hidden.device.type != "cpu"
            or torch.is_grad_enabled()
            or torch.is_autocast_enabled("cpu")
        ):
            return super().project(hidden)
        weight, bias = self.output_weight(), self.logits_bias
        logits = fast_linear(self, hidden, weight, bias)  # a decoding step: split or packed
        if logits is not None:
            return logits
        # With W stored (V, D), x Wᵀ for one row runs as a matrix-vector product on one
        # thread; a (D, V) copy lets the BLAS split the vocabulary over every thread.
        if bias is None:
            return hidden @ self._transposed(weight)
        rows = hidden.reshape(-1, hidden.size(-1))
        return torch.addmm(bias, rows, self._transposed(weight)).view(*hidden.shape[:-1], -1)

    def _transposed(self, weight: Tensor) -> Tensor:
        """A contiguous (D, V) copy of ``weight``, remade whenever the weight changes."""
        key = (weight.data_ptr(), weight._version, weight.dtype, weight.device)
        cached = self.__dict__.get("_transposed_cache")
        if cached is None or cached[0] != key:
            cached = (key, weight.detach().t().contiguous())
            self.__dict__["_transposed_cache"] = cached  # a plain attribute: not in state_dict
        return cached[1]


class FastTransformer(LeanStep, Transformer):
    """:class:`Transformer` with a lean ``step`` and a faster inference projection."""
