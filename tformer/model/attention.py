"""Scaled dot-product and multi-head attention (Vaswani et al., 2017, section 3.2).

Shape legend:
    B  batch size            H    number of heads
    Q  query length          K    key/value length
    D  d_model               d_k  D / H, the size of one head

Masks are boolean and broadcastable to (B, H, Q, K): ``True`` means "may attend", the same
convention as ``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.fast.dropout import dropout
from tformer.fast.linear import Linear, direct, linear, unpacked_linear


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, L) token ids -> (B, 1, 1, L) mask that hides padding keys from every query."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(q_len: int, k_len: int, device: torch.device | None = None) -> Tensor:
    """(1, 1, Q, K) mask letting query i see keys 0..(K - Q + i) and nothing later.

    The queries are taken to be the *last* Q positions of the K keys, which covers both
    full training (Q == K) and incremental decoding with a key/value cache (Q < K).
    """
    offset = k_len - q_len
    rows = torch.arange(q_len, device=device)[:, None] + offset
    cols = torch.arange(k_len, device=device)[None, :]
    return (cols <= rows)[None, None]


def fused_backward_is_slow(q: Tensor) -> bool:
    """True where torch's fused kernel would be the slow choice: bf16/fp16 training on a CPU.

    Its CPU backward in reduced precision took 4-5x as long as the explicit
    matmul-softmax-matmul below at the short lengths of translation (13 ms against 2.9 ms for
    64 pairs x 4 heads x 32 x 32 positions, and a fifth of a small model's training step); its
    forward is as fast as the explicit one, so inference and fp32 keep the fused kernel.
    """
    return (
        q.device.type == "cpu"
        and q.dtype in (torch.bfloat16, torch.float16)
        and q.requires_grad
        and torch.is_grad_enabled()
    )


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V  (section 3.2.1).

    Args:
        q: (B, H, Q, d_k); k, v: (B, H, K, d_k).
        mask: boolean, broadcastable to (B, H, Q, K); True = may attend.
        causal: also hide keys after each query's own position.
        dropout_p: dropout on the attention weights (pass 0.0 at inference).
        need_weights: return the (B, H, Q, K) weights. Without it torch's fused kernel runs,
            which never materialises the weights and is faster and lighter (except where
            :func:`fused_backward_is_slow`).

    Returns:
        (output (B, H, Q, d_k), weights or None). Weights are taken before dropout.
    """
    q_len, k_len = q.size(-2), k.size(-2)
    if causal and q_len == 1:
        causal = False  # one new query at the end sees every key: nothing to hide
    explicit = need_weights or fused_backward_is_slow(q)
    if causal and (mask is not None or q_len != k_len or explicit):
        # Fold causality into one explicit mask; the fused kernel's is_causal flag only
        # covers the square, unmasked case.
        cmask = causal_mask(q_len, k_len, q.device)
        mask = cmask if mask is None else mask & cmask
        causal = False

    if not need_weights and not fused_backward_is_slow(q):
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal
        )
        return out, None

    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Q, K)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    dropped = dropout(weights, dropout_p, training=True)
    return dropped @ v, (weights if need_weights else None)


class KVCache:
    """Keys and values already projected for one attention layer, (B, H, L, d_k) each.

    Self-attention appends one step at a time; cross-attention fills it once per source.
    Appended steps are written into a preallocated buffer whose capacity doubles when full:
    concatenating a new tensor at every step would copy the whole past each time, which
    dominated small-model decoding.
    """

    def __init__(self) -> None:
        self._k: Tensor | None = None  # (B, H, capacity, d_k); steps [0, length) are filled
        self._v: Tensor | None = None
        self.length = 0
        # Cross-attention: whether every row holds the same source (set from one row, then
        # expanded to its beams or samples), and that source's projections folded into its
        # keys and values (see MultiHeadAttention.folded_cross_step), made on first use.
        self.one_source = False
        self.folded: FoldedSource | None = None

    @property
    def k(self) -> Tensor | None:
        return self._filled(self._k)

    @property
    def v(self) -> Tensor | None:
        return self._filled(self._v)

    def _filled(self, buffer: Tensor | None) -> Tensor | None:
        """Steps [0, length) of ``buffer``; the buffer itself when full (always after set())."""
        if buffer is None or buffer.size(2) == self.length:
            return buffer
        return buffer[:, :, : self.length]

    def set(self, k: Tensor, v: Tensor) -> None:
        """Hold ``k`` and ``v`` as they are (the projected source of cross-attention)."""
        self._k, self._v, self.length = k, v, k.size(2)
        self.one_source, self.folded = k.size(0) == 1, None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add new steps (B, H, n, d_k); returns every cached step so far."""
        start, end = self.length, self.length + k.size(2)
        if self._k is None or self._v is None or end > self._k.size(2):
            capacity = max(end, 2 * start, 16)
            b, h, _, d = k.shape
            grown_k, grown_v = k.new_empty(b, h, capacity, d), v.new_empty(b, h, capacity, d)
            if self._k is not None and self._v is not None:
                grown_k[:, :, :start] = self._k[:, :, :start]
                grown_v[:, :, :start] = self._v[:, :, :start]
            self._k, self._v = grown_k, grown_v
        self._k[:, :, start:end] = k
        self._v[:, :, start:end] = v
        self.length = end
        return self._k[:, :, :end], self._v[:, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (beam reordering, dropping finished sequences).

        Rows of one source stay rows of that source (its beams or samples), and keep its
        folded matrices.
        """
        if self._k is not None and self._v is not None:
            self._k = self._k.index_select(0, index)
            self._v = self._v.index_select(0, index)


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
    Both are stored as linear-layer weights (out x in), so they take the same fast paths as
    one (see tformer.fast.linear).
    """

    keys: Tensor  # (H * S, D)
    key_bias: Tensor  # (H * S,)
    values: Tensor  # (D, H * S)
    heads: int
    length: int  # S


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O (section 3.2.2),

    where head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    The h per-head projections are stored as one D x D matrix each (W^Q) and
    one D x 2D matrix for keys and values together, so keys and values cost one matmul.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads {n_heads} must divide d_model {d_model}")
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.dropout = dropout
        self.q_proj = Linear(d_model, d_model)
        self.kv_proj = Linear(d_model, 2 * d_model)
        self.out_proj = Linear(d_model, d_model)

    def _split_heads(self, x: Tensor) -> Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, L, d_k)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(B, L, D) -> keys and values, each (B, H, L, d_k)."""
        k, v = self.kv_proj(x).chunk(2, dim=-1)
        return self._split_heads(k), self._split_heads(v)

    def forward(
        self,
        query: Tensor,
        key_value: Tensor,
        mask: Tensor | None = None,
        *,
        causal: bool = False,
        cache: KVCache | None = None,
        static_kv: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` (B, Q, D) to ``key_value`` (B, K, D).

        With a ``cache``: for self-attention (``static_kv=False``) the new keys/values are
        appended to it; for cross-attention (``static_kv=True``) they are computed on the first
        call and reused afterwards, so the encoder output is projected once per source.

        Returns:
            (output (B, Q, D), weights (B, H, Q, K) or None).
        """
        q = self._split_heads(self.q_proj(query))  # (B, H, Q, d_k)
        if cache is not None and static_kv and cache.length:
            k, v = cache.k, cache.v
        else:
            k, v = self.project_kv(key_value)  # (B, H, K, d_k)
            if cache is not None:
                if static_kv:
                    cache.set(k, v)
                else:
                    k, v = cache.append(k, v)
        assert k is not None and v is not None
        out, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            causal=causal,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights,
        )
        b, _, q_len, _ = out.shape
        out = out.transpose(1, 2).reshape(b, q_len, self.n_heads * self.d_k)  # (B, Q, D)
        return self.out_proj(out), weights

    def step(
        self,
        query: Tensor,
        cache: KVCache,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
    ) -> Tensor:
        """``forward`` for one new query position per row, at inference, with a cache.

        Self-attention when ``memory`` is None: the new position's key and value join
        ``cache``. Cross-attention over ``memory`` (B, S, D) otherwise: projected on the first
        step, reused afterwards. The same maths as ``forward`` in fewer tensor operations and
        calls: a small model decoding one token at a time spends its time on those (a few
        microseconds each on a 2-core CPU) more than on arithmetic.

        Args:
            query: (B, 1, D). memory_mask: broadcastable to (B, H, 1, S), or None.
        Returns:
            (B, 1, D).
        """
        b = query.size(0)
        if memory is None:
            # Queries, keys and values of the one new position in one product: one call
            # fewer, and a (3D x D) weight streams faster than a (D x D) and a (2D x D) one.
            qkv = linear(self, query, *self._fused_qkv()).view(b, 3, self.n_heads, 1, self.d_k)
            q = qkv[:, 0]
            k, v = cache.append(qkv[:, 1], qkv[:, 2])  # (B, H, t, d_k) each
        else:
            if not cache.length:
                cache.set(*self.project_kv(memory))
            if self.folding_pays(query, cache):
                return self.folded_cross_step(query, cache, memory_mask)
            q = direct(self.q_proj, query).view(b, self.n_heads, 1, self.d_k)
            k, v = cache.k, cache.v
        assert k is not None and v is not None
        # No causal mask: the one new query may see every cached key.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=memory_mask)  # (B, H, 1, d_k)
        # With one query position the heads already lie side by side: no transpose needed.
        return direct(self.out_proj, out.reshape(b, 1, self.n_heads * self.d_k))

    def folding_pays(self, query: Tensor, cache: KVCache) -> bool:
        """Whether :meth:`folded_cross_step` applies: one source, CPU inference, short.

        Folded, a step reads 2·D·H·S numbers however many rows (beams, samples) decode the
        one source; unfolded, W^Q and W^O (2·D·D) and each row's cached keys and values
        (R·2·S·D): fewer whenever S·(H - R) < D (for one row of the base model: up to 73
        source tokens). A batch-1 decoding step is bound by the bytes it reads, and this also
        runs 5 operations instead of the attention kernel's dozen. Rows of different sources
        would each need their own folded matrices: the shared W^Q and W^O read less.
        """
        return (
            cache.one_source
            and cache.length * (self.n_heads - query.size(0)) < self.n_heads * self.d_k
            and query.device.type == "cpu"
            and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
        )

    def folded_cross_step(
        self, query: Tensor, cache: KVCache, memory_mask: Tensor | None
    ) -> Tensor:
        """Cross-attention for (R, 1, D) queries of one source through :class:`FoldedSource`."""
        folded = cache.folded or self._fold(cache)
        rows = query.size(0)
        scores = unpacked_linear(query.view(rows, -1), folded.keys, folded.key_bias)
        scores = scores.view(rows, folded.heads, folded.length)
        if memory_mask is not None:  # (R, 1, 1, S), every row the one source's padding
            scores = scores.masked_fill(~memory_mask[:1].view(1, 1, -1), float("-inf"))
        weights = scores.softmax(dim=-1).view(rows, -1)  # (R, H·S)
        return unpacked_linear(weights, folded.values, self.out_proj.bias).view(rows, 1, -1)

    def _fold(self, cache: KVCache) -> FoldedSource:
        assert cache.k is not None and cache.v is not None
        h, d_k = self.n_heads, self.d_k
        k, v = cache.k[0], cache.v[0]  # (H, S, d_k): every row holds the same source
        length = k.size(1)
        scale = 1.0 / math.sqrt(d_k)
        w_q = self.q_proj.weight.view(h, d_k, -1)  # (H, d_k, D): W_h
        keys = (k @ w_q) * scale  # (H, S, D)
        key_bias = (k @ self.q_proj.bias.view(h, d_k, 1)).view(h * length) * scale
        w_o = self.out_proj.weight.view(-1, h, d_k).permute(1, 2, 0)  # (H, d_k, D): O_hᵀ
        values = (v @ w_o).reshape(h * length, -1)  # (H·S, D)
        cache.folded = FoldedSource(
            keys.reshape(h * length, -1), key_bias, values.t().contiguous(), h, length
        )
        return cache.folded

    def _fused_qkv(self) -> tuple[Tensor, Tensor]:
        """W^Q stacked on the key/value weight (3D x D) and their biases, remade on change.

        A plain attribute, not a parameter: the state dict keeps the paper's projections.
        """
        parts = (self.q_proj.weight, self.kv_proj.weight, self.q_proj.bias, self.kv_proj.bias)

        def stacked() -> tuple[Tensor, Tensor]:
            return torch.cat(parts[:2]), torch.cat(parts[2:])

        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            # Never a detached copy where autograd or a tracer is watching: stack the
            # parameters themselves, every call.
            return stacked()
        key = tuple((p.data_ptr(), p._version) for p in parts)
        cached = self.__dict__.get("_qkv")
        if cached is None or cached[0] != key:
            # Outside inference mode: linear() keys its packed copy on the weight's version
            # counter, which inference-mode tensors do not have.
            with torch.inference_mode(False), torch.no_grad():
                cached = (key, *stacked())
            self.__dict__["_qkv"] = cached
            # A new tensor may reuse the old one's address and version: drop its packed copy.
            self.__dict__.pop("_packed_weight", None)
        return cached[1], cached[2]
