"""What the model's cached decoding step (``TransformerBase.step``) runs on when accelerated:
the folding cross-attention cache and the vocabulary projection split or packed over threads.

The step's maths is the model's own (``tformer.model``); this module supplies only the cache
and the kernel, and keeps the model's parameters; the tests hold the step equal to ``decode``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from tformer.fast.attention import FoldingKVCache
from tformer.fast.linear import fast_linear
from tformer.model.cache import DecoderCache, LayerCache
from tformer.model.transformer import Decoder, Transformer, TransformerBase


def step_mask(mask: Tensor) -> Tensor | None:
    """A source padding mask for step-by-step decoding, or None when it hides nothing.

    Read back once per source batch: attention without a mask skips converting it at every
    layer of every step.
    """
    return None if bool(mask.all()) else mask


class LeanStep(TransformerBase):
    """Decoding through the model's ``step`` with the fast caches and a faster inference
    projection, for any family with a decoder; mixed in before the family's own class
    (:class:`FastTransformer`, int8's decoder-only)."""

    decoder: Decoder

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

    def projection_onto(self, ids: Tensor) -> Callable[[Tensor], Tensor]:
        if ids.device.type != "cpu" or torch.is_grad_enabled():
            return super().projection_onto(ids)
        # The (D, C) copy the BLAS splits over threads, as for the whole vocabulary above.
        transposed = self.output_weight().detach()[ids].t().contiguous()
        bias = None if self.logits_bias is None else self.logits_bias.detach()[ids]

        def project(hidden: Tensor) -> Tensor:
            rows = hidden.reshape(-1, hidden.size(-1))
            logits = rows @ transposed if bias is None else torch.addmm(bias, rows, transposed)
            return logits.view(*hidden.shape[:-1], -1)

        return project

    def _transposed(self, weight: Tensor) -> Tensor:
        """A contiguous (D, V) copy of ``weight``, remade whenever the weight changes."""
        key = (weight.data_ptr(), weight._version, weight.dtype, weight.device)
        cached = self.__dict__.get("_transposed_cache")
        if cached is None or cached[0] != key:
            cached = (key, weight.detach().t().contiguous())
            self.__dict__["_transposed_cache"] = cached  # a plain attribute: not in state_dict
        return cached[1]


class FastTransformer(LeanStep, Transformer):
    """:class:`Transformer` with the fast caches and a faster inference projection."""
