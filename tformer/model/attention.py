"""Scaled dot-product and multi-head attention (Vaswani et al., 2017, section 3.2),
with two later variants: grouped-query attention (Ainslie et al., 2023) and rotary positions
(Su et al., 2021) on self-attention's queries and keys; and, for analysis, a gate per head
(Michel et al., 2019) that silences chosen heads.

Shape legend:
    B  batch size            H    number of (query) heads
    Q  query length          K    key/value length
    D  d_model               d_k  D / H, the size of one head
    G  key/value heads (H without grouped-query attention; each serves H / G query heads)

Masks are boolean and broadcastable to (B, H, Q, K): ``True`` means "may attend", the same
convention as ``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.model.cache import KVCache
from tformer.model.positions import RotaryEmbedding


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


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    fused: bool = True,
    bias: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V  (section 3.2.1).

    Args:
        q: (B, H, Q, d_k); k, v: (B, H, K, d_k).
        mask: boolean, broadcastable to (B, H, Q, K); True = may attend.
        causal: also hide keys after each query's own position.
        dropout_p: dropout on the attention weights (pass 0.0 at inference).
        need_weights: return the (B, H, Q, K) weights (the formula written out below).
        fused: without ``need_weights``, run torch's fused kernel, which gives the same result
            without materialising the weights; False writes the formula out instead.

    Returns:
        (output (B, H, Q, d_k), weights or None). Weights are taken before dropout.
    """
    q_len, k_len = q.size(-2), k.size(-2)
    if causal and q_len == 1:
        causal = False  # one new query at the end sees every key: nothing to hide
    explicit = need_weights or not fused
    if causal and (mask is not None or q_len != k_len or explicit or bias is not None):
        # Fold causality into one explicit mask; the fused kernel's is_causal flag only
        # covers the square, unmasked case.
        cmask = causal_mask(q_len, k_len, q.device)
        mask = cmask if mask is None else mask & cmask
        causal = False
    if bias is not None:
        # One additive float mask: the bias where a key may be seen, -inf where not.
        bias = bias.to(q.dtype)
        mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale

    if not explicit:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal, scale=scale
        )
        return out, None

    scores = q @ k.transpose(-2, -1) * scale  # (B, H, Q, K)
    if mask is not None and mask.dtype != torch.bool:
        scores = scores + mask
    elif mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return dropped @ v, (weights if need_weights else None)


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """(B, G, L, d_k) -> (B, G * groups, L, d_k): key/value head g serves query heads
    g * groups .. (g + 1) * groups - 1 (grouped-query attention, Ainslie et al. 2023)."""
    if groups == 1:
        return x
    b, g, length, d_k = x.shape
    return x[:, :, None].expand(b, g, groups, length, d_k).reshape(b, g * groups, length, d_k)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O (section 3.2.2),

    where head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    The h per-head projections are stored as one D x D matrix each (W^Q) and
    one D x 2D matrix for keys and values together, so keys and values cost one matmul.

    Variants: with ``kv_heads`` G < H (grouped-query attention, Ainslie et al. 2023) the
    key/value matrix is D x 2·G·d_k and each group of H / G query heads shares one key/value
    head, so a cache holds G heads, not H. With a ``rotary`` embedding (RoPE, Su et al. 2021;
    self-attention only) queries and keys are rotated by their positions before the scores.

    Head masks (Michel et al. 2019, "Are Sixteen Heads Really Better than One?"):
    MultiHead = Concat(ξ_1 head_1, ..., ξ_h head_h) W^O with a gate ξ_i in {0, 1}, so a masked
    head's output is zeroed before W^O. ``head_gate`` is None (every ξ_i = 1) unless
    :func:`tformer.model.heads.mask_heads` sets it; it is a setting, never saved.
    """

    head_gate: Tensor | None

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        *,
        kv_heads: int | None = None,
        rotary: RotaryEmbedding | None = None,
        bias: bool = True,
        scaled: bool = True,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads {n_heads} must divide d_model {d_model}")
        self.n_heads = n_heads
        self.kv_heads = n_heads if kv_heads is None else kv_heads
        if n_heads % self.kv_heads:
            raise ValueError(f"kv_heads {self.kv_heads} must divide n_heads {n_heads}")
        self.d_k = d_model // n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.kv_proj = nn.Linear(d_model, 2 * self.kv_heads * self.d_k, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        # T5 leaves scores unscaled (its initialisation absorbs 1 / sqrt(d_k)).
        self.scale: float | None = None if scaled else 1.0
        self.rotary = rotary
        # A buffer so it follows the model's device; not persistent: checkpoints never hold it.
        self.register_buffer("head_gate", None, persistent=False)

    @property
    def groups(self) -> int:
        """Query heads per key/value head (1: the paper's multi-head attention)."""
        return self.n_heads // self.kv_heads

    def split_heads(self, x: Tensor, heads: int | None = None) -> Tensor:
        b, length, _ = x.shape
        heads = self.n_heads if heads is None else heads
        return x.view(b, length, heads, self.d_k).transpose(1, 2)  # (B, heads, L, d_k)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(B, L, D) -> keys and values, each (B, G, L, d_k)."""
        k, v = self.kv_proj(x).chunk(2, dim=-1)
        return self.split_heads(k, self.kv_heads), self.split_heads(v, self.kv_heads)

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
        position_bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` (B, Q, D) to ``key_value`` (B, K, D).

        With a ``cache``: for self-attention (``static_kv=False``) the new keys/values are
        appended to it; for cross-attention (``static_kv=True``) they are computed on the first
        call and reused afterwards, so the encoder output is projected once per source.
        With rotary positions the new queries and keys sit at the cache's length onwards, and
        the cache holds keys already rotated. ``position_bias`` (1, H, Q, K) is added to the
        scores (T5's relative positions).

        Returns:
            (output (B, Q, D), weights (B, H, Q, K) or None).
        """
        q = self.split_heads(self.q_proj(query))  # (B, H, Q, d_k)
        if cache is not None and static_kv and cache.length:
            k, v = cache.k, cache.v
        else:
            k, v = self.project_kv(key_value)  # (B, G, K, d_k)
            if self.rotary is not None:
                start = cache.length if cache is not None else 0
                q, k = self.rotary(q, start), self.rotary(k, start)
            if cache is not None:
                if static_kv:
                    cache.set(k, v)
                else:
                    k, v = cache.append(k, v)
        assert k is not None and v is not None
        k, v = repeat_kv(k, self.groups), repeat_kv(v, self.groups)  # (B, H, K, d_k)
        out, weights = self.attend(
            q, k, v, mask, causal=causal, need_weights=need_weights, bias=position_bias
        )
        out = self.gate_heads(out)
        b, _, q_len, _ = out.shape
        out = out.transpose(1, 2).reshape(b, q_len, self.n_heads * self.d_k)  # (B, Q, D)
        return self.out_proj(out), weights

    # -- the cached decoding step ------------------------------------------------------------

    def step(
        self,
        query: Tensor,
        cache: KVCache,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        position_bias: Tensor | None = None,
    ) -> Tensor:
        """``forward`` for one new query position per row, at inference, with a cache.

        Self-attention when ``memory`` is None: the new position's key and value join
        ``cache``. Cross-attention over ``memory`` (B, S, D) otherwise: projected on the first
        step, reused afterwards. The same maths as ``forward`` in fewer tensor operations and
        no module calls, which is what a small model decoding one token at a time spends its
        time on. Every model decodes through this one step; ``tformer.fast`` replaces only
        its kernels (:meth:`qkv_step`, :meth:`cross_step`, the linear layers' ``forward``).

        Args:
            query: (B, 1, D). memory_mask: broadcastable to (B, H, 1, S), or None.
            position_bias: (1, H, 1, t) added to the self-attention scores (T5's relative
                positions), or None.
        Returns:
            (B, 1, D).
        """
        b = query.size(0)
        k: Tensor | None
        v: Tensor | None
        if memory is None:
            q, k, v = self.new_qkv(query, cache.length)
            k, v = cache.append(k, v)  # (B, G, t, d_k) each
            mask = cache.visible  # no causal mask: the one new query may see every cached key
        else:
            if not cache.length:
                cache.set(*self.project_kv(memory))
            whole = self.cross_step(query, cache, memory_mask)
            if whole is not None:
                return whole
            q = self.q_proj.forward(query).view(b, self.n_heads, 1, self.d_k)
            k, v, mask = cache.k, cache.v, memory_mask
        assert k is not None and v is not None
        k, v = repeat_kv(k, self.groups), repeat_kv(v, self.groups)  # (B, H, t, d_k)
        out, _ = scaled_dot_product_attention(q, k, v, mask, bias=position_bias, scale=self.scale)
        out = self.gate_heads(out)  # (B, H, 1, d_k)
        # With one query position the heads already lie side by side: no transpose needed.
        return self.out_proj.forward(out.reshape(b, 1, self.n_heads * self.d_k))

    def new_qkv(self, query: Tensor, start: int) -> tuple[Tensor, Tensor, Tensor]:
        """Query (B, H, 1, d_k), key and value (B, G, 1, d_k) of one new position at ``start``;
        with rotary positions the query and the key rotated to it."""
        b, h, g, d_k = query.size(0), self.n_heads, self.kv_heads, self.d_k
        qkv = self.qkv_step(query)  # (B, 1, (H + 2G) d_k)
        if g == h:
            q, k, v = qkv.view(b, 3, h, 1, d_k).unbind(1)
        else:
            q, k, v = qkv.split([h * d_k, g * d_k, g * d_k], dim=-1)
            q, k, v = q.reshape(b, h, 1, d_k), k.reshape(b, g, 1, d_k), v.reshape(b, g, 1, d_k)
        if self.rotary is not None:
            q, k = self.rotary(q, start), self.rotary(k, start)
        return q, k, v

    def qkv_step(self, query: Tensor) -> Tensor:
        """Kernel: the (B, 1, D) new positions' queries, keys and values side by side,
        (B, 1, (H + 2G)·d_k). Two products here; one stacked product in ``tformer.fast``."""
        return torch.cat([self.q_proj.forward(query), self.kv_proj.forward(query)], dim=-1)

    def cross_step(
        self, query: Tensor, cache: KVCache, memory_mask: Tensor | None
    ) -> Tensor | None:
        """Kernel: the whole cross-attention step in another form, or None for the maths of
        :meth:`step` (here always; ``tformer.fast`` folds the projections into one source)."""
        return None

    def gate_heads(self, out: Tensor) -> Tensor:
        """(B, H, Q, d_k) head outputs times their gates ξ (unchanged without a head mask)."""
        if self.head_gate is None:
            return out
        return out * self.head_gate.to(out.dtype).view(1, self.n_heads, 1, 1)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        *,
        causal: bool,
        need_weights: bool,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """:func:`scaled_dot_product_attention` with this layer's dropout and scale."""
        return scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            causal=causal,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights,
            fused=self.fused_kernel(q, k),
            bias=bias,
            scale=self.scale,
        )

    def fused_kernel(self, q: Tensor, k: Tensor) -> bool:
        """Whether attention that returns no weights runs torch's fused kernel (here: always)."""
        return True
