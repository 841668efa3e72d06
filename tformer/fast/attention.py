"""Attention kernels and caches for the model's own maths, faster on CPUs.

:class:`FastMultiHeadAttention` keeps :class:`tformer.model.MultiHeadAttention`'s parameters,
``forward`` and ``step``; it replaces only kernels: the decoding step's queries, keys and values
in one stacked product, for a single source cross-attention with W^Q folded into the source's
keys and W^O into its values (:class:`FoldedSource`), and the written-out attention where torch's
fused backward is slow. The state dict is the model's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.fast.linear import forget_packed, linear, unpacked_linear
from tformer.model.attention import MultiHeadAttention, repeat_kv
from tformer.model.cache import KVCache

# Keys up to this many positions train faster in a compiled GPU step through the formula.
GPU_SHORT_KEYS = 32


def fused_backward_is_slow(q: Tensor, keys: int) -> bool:
    """True where torch's fused kernel is the slow choice: bf16/fp16 training on a CPU, and
    in a compiled GPU training step over at most ``GPU_SHORT_KEYS`` keys.

    Its CPU backward in reduced precision is several times slower than the written-out
    formula at the short lengths of translation, while its forward is as fast, so inference
    and fp32 keep the fused kernel. On a GPU the fused kernel alone is the faster one, but
    under ``torch.compile`` the formula's small (B, H, Q, K) scores fuse with the projections,
    masking and dropout around them, and the whole step is faster at a sentence's length
    (docs/performance.md has the figures).
    """
    if not (
        q.dtype in (torch.bfloat16, torch.float16) and q.requires_grad and torch.is_grad_enabled()
    ):
        return False
    if q.device.type == "cuda":
        return keys <= GPU_SHORT_KEYS and torch.compiler.is_compiling()
    return q.device.type == "cpu"


class FoldingKVCache(KVCache):
    """A cross-attention cache that knows when its rows all hold one source.

    ``one_source`` is set from a single-row ``set`` and survives reordering (that source
    expanded to its beams or samples); ``folded`` holds that source's :class:`FoldedSource`,
    made on first use.
    """

    def __init__(self) -> None:
        super().__init__()
        self.one_source = False
        self.folded: FoldedSource | None = None

    def set(self, k: Tensor, v: Tensor) -> None:
        super().set(k, v)
        self.one_source, self.folded = k.size(0) == 1, None


class StaticKVCache(KVCache):
    """A self-attention cache of fixed capacity, for a step captured as a CUDA graph
    (:mod:`tformer.fast.graphs`): the new position is written at ``pos``, a device tensor the
    graph reads, and the query attends over the whole buffer with ``visible`` (set by the
    graphed step) hiding the positions not yet written (shapes and addresses must not change
    between replays)."""

    def __init__(self, k: Tensor, v: Tensor, pos: Tensor) -> None:
        super().__init__()
        self._k, self._v, self.pos = k, v, pos
        self.length = k.size(2)  # the buffer is read whole

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        assert self._k is not None and self._v is not None
        self._k.index_copy_(2, self.pos, k)
        self._v.index_copy_(2, self.pos, v)
        return self._k, self._v

    def kv(self) -> tuple[Tensor, Tensor]:
        assert self._k is not None and self._v is not None
        return self._k, self._v


@dataclass(frozen=True)
class FoldedSource:
    """One source's cross-attention with W^Q folded into its keys and W^O into its values.

    For head h with query projection W_h (d_k x D) and bias b_h, source keys k_hs, values
    v_hs and output projection block O_h (D x d_k):

        score_hs = (x W_hᵀ + b_h) · k_hs / √d_k = x · (W_hᵀ k_hs / √d_k) + b_h · k_hs / √d_k
        output   = Σ_h Σ_s p_hs (O_h v_hs) + b_O

    so with ``keys`` (H·S x D) = the k_hsᵀ W_h / √d_k stacked, ``key_bias`` (H·S) and
    ``values`` (D x H·S) = the O_h v_hs side by side, one step of cross-attention is
    softmax(x keysᵀ + key_bias) per head, then p valuesᵀ + b_O: two matrix-vector products
    over 2·D·H·S numbers instead of W^Q, W^O and the cached keys and values (2·D·D + 2·S·D).
    Both are stored as linear-layer weights (out x in), so they take the same fast paths.
    """

    keys: Tensor  # (H * S, D)
    key_bias: Tensor | None  # (H * S,); None for bias-free projections (T5)
    values: Tensor  # (D, H * S)
    out_bias: Tensor | None  # (D,): b_O
    heads: int
    length: int  # S


def stacked_qkv(attention: MultiHeadAttention) -> tuple[Tensor, Tensor | None]:
    """W^Q stacked on the key/value weight ((H + 2G)·d_k x D) and their biases (None for
    bias-free layers): one product then gives a new position's query, key and value."""
    q, kv = attention.q_proj, attention.kv_proj
    bias = None if q.bias is None or kv.bias is None else torch.cat([q.bias, kv.bias])
    return torch.cat([q.weight, kv.weight]), bias


class FastMultiHeadAttention(MultiHeadAttention):
    """:class:`MultiHeadAttention` with faster kernels; same parameters, same maths."""

    def fused_kernel(self, q: Tensor, k: Tensor) -> bool:
        return not fused_backward_is_slow(q, k.size(-2))

    def cross_step(
        self, query: Tensor, cache: KVCache, memory_mask: Tensor | None
    ) -> Tensor | None:
        """Cross-attention folded into one source (:class:`FoldedSource`) where that pays."""
        if isinstance(cache, FoldingKVCache) and self.folding_pays(query, cache):
            return self.folded_cross_step(query, cache, memory_mask)
        return None

    def folding_pays(self, query: Tensor, cache: FoldingKVCache) -> bool:
        """Whether :meth:`folded_cross_step` applies: one source, CPU inference, short.

        Folded, a step reads 2·D·H·S numbers however many rows (beams, samples) decode the
        one source; unfolded, W^Q and W^O (2·D·D) and each row's cached keys and values
        (R·2·S·D): fewer whenever S·(H - R) < D. Rows of different sources would each need
        their own folded matrices, so only one source is folded.
        """
        return (
            cache.one_source
            and cache.length * (self.n_heads - query.size(0)) < self.n_heads * self.d_k
            and query.device.type == "cpu"
            and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
        )

    def folded_cross_step(
        self, query: Tensor, cache: FoldingKVCache, memory_mask: Tensor | None
    ) -> Tensor:
        """Cross-attention for (R, 1, D) queries of one source through :class:`FoldedSource`."""
        folded = cache.folded or self._fold(cache)
        rows = query.size(0)
        scores = unpacked_linear(query.view(rows, -1), folded.keys, folded.key_bias)
        scores = scores.view(rows, folded.heads, folded.length)
        if memory_mask is not None:  # (R, 1, 1, S), every row the one source's padding
            scores = scores.masked_fill(~memory_mask[:1].view(1, 1, -1), float("-inf"))
        weights = scores.softmax(dim=-1).view(rows, -1)  # (R, H·S)
        return unpacked_linear(weights, folded.values, folded.out_bias).view(rows, 1, -1)

    def qkv_step(self, query: Tensor) -> Tensor:
        """Queries, keys and values of (B, 1, D) new positions in one product with W^Q stacked
        on the key/value weight: one call fewer, and one tall weight streams faster than two."""
        return linear(self, query, *self._fused_qkv())

    def fold_weights(self) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        """W^Q, its bias, W^O and its bias as float tensors, for :meth:`_fold`."""
        return self.q_proj.weight, self.q_proj.bias, self.out_proj.weight, self.out_proj.bias

    def _fold(self, cache: FoldingKVCache) -> FoldedSource:
        assert cache.k is not None and cache.v is not None
        h, d_k = self.n_heads, self.d_k
        # (H, S, d_k): every row holds the same source; a grouped head serves H / G heads
        k, v = repeat_kv(cache.k[:1], self.groups)[0], repeat_kv(cache.v[:1], self.groups)[0]
        length = k.size(1)
        scale = 1.0 / math.sqrt(d_k) if self.scale is None else self.scale
        q_weight, q_bias, o_weight, o_bias = self.fold_weights()
        w_q = q_weight.view(h, d_k, -1)  # (H, d_k, D): W_h
        keys = (k @ w_q) * scale  # (H, S, D)
        key_bias = (
            None if q_bias is None else (k @ q_bias.view(h, d_k, 1)).view(h * length) * scale
        )
        w_o = o_weight.view(-1, h, d_k).permute(1, 2, 0)  # (H, d_k, D): O_hᵀ
        values = self.gate_heads((v @ w_o)[None])[0].reshape(h * length, -1)  # (H·S, D)
        cache.folded = FoldedSource(
            keys.reshape(h * length, -1), key_bias, values.t().contiguous(), o_bias, h, length
        )
        return cache.folded

    def _fused_qkv(self) -> tuple[Tensor, Tensor | None]:
        """W^Q stacked on the key/value weight ((H + 2G)·d_k x D) and their biases (None for
        bias-free layers), remade on change.

        A plain attribute, not a parameter: the state dict keeps the paper's projections.
        """
        parts = (self.q_proj.weight, self.kv_proj.weight, self.q_proj.bias, self.kv_proj.bias)
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            # Never a detached copy where autograd or a tracer is watching: stack the
            # parameters themselves, every call.
            return stacked_qkv(self)
        key = tuple((p.data_ptr(), p._version) for p in parts if p is not None)
        cached = self.__dict__.get("_qkv")
        if cached is None or cached[0] != key:
            # Outside inference mode: linear() keys its packed copy on the weight's version
            # counter, which inference-mode tensors do not have.
            with torch.inference_mode(False), torch.no_grad():
                cached = (key, *stacked_qkv(self))
            self.__dict__["_qkv"] = cached
            # A new tensor may reuse the old one's address and version: drop its packed copy.
            forget_packed(self)
        return cached[1], cached[2]
