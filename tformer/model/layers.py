"""Embeddings, feed-forward, normalisation and the encoder/decoder layers (sections 3.1, 3.3, 3.4).

Positions (section 3.5 and its variants) live in ``positions``. Variants here: the SiLU /
Swish activation (Ramachandran et al. 2017; Marian's), gated feed-forward layers (SwiGLU,
GeGLU; Shazeer 2020) and RMSNorm (Zhang & Sennrich, 2019).

Shape legend: B batch, S source length, T target length, D d_model, V vocabulary size,
F the feed-forward's hidden width.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.model.attention import MultiHeadAttention
from tformer.model.cache import LayerCache
from tformer.model.positions import RotaryEmbedding


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU's tanh approximation (Hendrycks & Gimpel 2016), GPT-2's "gelu_new"."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": gelu_tanh,
    "silu": F.silu,  # Swish with beta = 1 (Ramachandran et al. 2017); Marian's "swish"
    "swiglu": F.silu,  # Swish with beta = 1
    "geglu": F.gelu,
    "geglu_tanh": gelu_tanh,  # T5 v1.1's "gated-gelu" (its gelu_new gate)
}
Sublayer = Callable[[Tensor], Tensor]
RMS_NORM_EPS = 1e-6  # LLaMA's; LayerNorm keeps torch's 1e-5


class TokenEmbedding(nn.Module):
    """Token ids -> vectors, multiplied by √D (section 3.4) so they are not drowned by positions.

    Variants: ``scale=False`` adds them unscaled (GPT-2, BERT); ``segment`` adds one learned
    vector to every token (BERT's token-type embedding of segment 0: tformer has no pairs).
    """

    def __init__(
        self, vocab_size: int, d_model: int, *, scale: bool = True, segment: bool = False
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.scale = math.sqrt(d_model) if scale else 1.0
        # With a √D scale, N(0, D^-1/2) entries give embeddings of unit scale per dimension;
        # the same matrix then doubles as a well-scaled output projection when tied. Unscaled,
        # GPT-2's and BERT's N(0, 0.02) keeps them on the scale of their learned positions.
        nn.init.normal_(self.embedding.weight, mean=0.0, std=d_model**-0.5 if scale else 0.02)
        self.segment = nn.Parameter(torch.zeros(d_model)) if segment else None

    @property
    def weight(self) -> Tensor:
        return self.embedding.weight

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embedding(ids)
        if self.scale != 1.0:
            x = x * self.scale
        return x if self.segment is None else x + self.segment  # (B, L, D)


def token_embedding(config: ModelConfig, vocab_size: int) -> TokenEmbedding:
    """The token embedding ``config`` asks for (scaled or not, with a segment vector or not)."""
    return TokenEmbedding(
        vocab_size,
        config.d_model,
        scale=config.embedding_scale,
        segment=config.segment_embedding,
    )


class FeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2, applied to each position alike (section 3.3)."""

    def __init__(self, d_model: int, d_ff: int, activation: str, bias: bool = True) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.activation(self.w1(x)))


class GatedFeedForward(nn.Module):
    """FFN_GLU(x) = (act(x W + b) ⊙ (x V + c)) W2 + b2 (Shazeer 2020, "GLU Variants Improve
    Transformer"): SwiGLU with act = Swish (SiLU), GeGLU with act = GELU.

    Three matrices instead of two, so the hidden width F is ``ModelConfig.ffn_hidden``
    (2/3 of d_ff, rounded up to a multiple of 8) to keep the parameters about equal.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str, bias: bool = True) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)  # W: the gate
        self.v = nn.Linear(d_model, d_ff, bias=bias)  # V: the gated value
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.activation(self.w1(x)) * self.v(x))  # (B, L, F) -> (B, L, D)


def feed_forward(config: ModelConfig) -> FeedForward | GatedFeedForward:
    """The position-wise feed-forward sub-layer ``config.activation`` asks for."""
    kind = GatedFeedForward if config.gated else FeedForward
    return kind(config.d_model, config.ffn_hidden, config.activation, config.linear_bias)


def norm_layer(config: ModelConfig) -> nn.LayerNorm | nn.RMSNorm:
    """LayerNorm (Ba et al. 2016, the paper) or RMSNorm (Zhang & Sennrich 2019): x / RMS(x) · g,
    no centring and no bias."""
    if config.normalization == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=config.layer_norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)


def self_attention(config: ModelConfig) -> MultiHeadAttention:
    """Self-attention: grouped-query with ``kv_heads``, rotary with ``positions`` rope."""
    held = config.positions_held
    rotary = RotaryEmbedding(config.d_head, held) if config.positions == "rope" else None
    return MultiHeadAttention(
        config.d_model,
        config.n_heads,
        config.attention_dropout,
        kv_heads=config.kv_heads,
        rotary=rotary,
        bias=config.linear_bias,
        scaled=config.attention_scale,
    )


def _cross_attention(config: ModelConfig) -> MultiHeadAttention:
    """Cross-attention: grouped-query with ``kv_heads``, never rotary (its queries and keys
    come from two sequences, whose positions have no offset to one another)."""
    return MultiHeadAttention(
        config.d_model,
        config.n_heads,
        config.attention_dropout,
        kv_heads=config.kv_heads,
        bias=config.linear_bias,
        scaled=config.attention_scale,
    )


def residual(
    x: Tensor,
    sublayer: Callable[[Tensor], Tensor],
    norm: Callable[[Tensor], Tensor],
    pre_norm: bool,
    dropout: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """A sub-layer inside its residual connection and normalisation (section 3.1).

    Post-norm (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-norm (option):     x + Dropout(Sublayer(LayerNorm(x))), steadier for deep stacks.
    Every layer runs its sub-layers through this one rule, the lean decoding step included.
    """
    if pre_norm:
        out = sublayer(norm(x))
        return x + (out if dropout is None else dropout(out))
    out = sublayer(x)
    return norm(x + (out if dropout is None else dropout(out)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in residual + LayerNorm (section 3.1,
    :func:`residual`; LayerNorm or RMSNorm, by ``config.normalization``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.pre_norm = config.norm == "pre"
        self.self_attn = self_attention(config)
        self.feed_forward = feed_forward(config)
        self.norm1 = norm_layer(config)
        self.norm2 = norm_layer(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        need_weights: bool = False,
        position_bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        weights: list[Tensor | None] = []  # the self-attention's, when asked for

        def attend(h: Tensor) -> Tensor:
            attended, w = self.self_attn(
                h, h, mask, need_weights=need_weights, position_bias=position_bias
            )
            weights.append(w)
            return attended

        x = residual(x, attend, self.norm1, self.pre_norm, self.dropout)
        x = residual(x, self.feed_forward, self.norm2, self.pre_norm, self.dropout)
        return x, weights[0]  # (B, S, D), (B, H, S, S) or None


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention over the encoder output, then feed-forward.

    Section 3.1: queries of the cross-attention come from the decoder, keys and values from
    the encoder output ("memory"). Without ``cross_attention`` the middle sub-layer is left
    out: the block of a decoder-only language model (GPT, Radford et al. 2018), whose other
    parameters keep their names here.
    """

    cross_attn: MultiHeadAttention
    norm2: nn.LayerNorm | nn.RMSNorm

    def __init__(self, config: ModelConfig, *, cross_attention: bool = True) -> None:
        super().__init__()
        self.pre_norm = config.norm == "pre"
        self.has_cross = cross_attention
        # Registered in this order whichever the family: initialisation draws in module order.
        self.self_attn = self_attention(config)
        if cross_attention:
            self.cross_attn = _cross_attention(config)
        self.feed_forward = feed_forward(config)
        self.norm1 = norm_layer(config)
        if cross_attention:
            self.norm2 = norm_layer(config)
        self.norm3 = norm_layer(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None,
        *,
        cache: LayerCache | None = None,
        need_weights: bool = False,
        position_bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        weights: dict[str, Tensor | None] = {"self": None, "cross": None}  # when asked for

        def attend(h: Tensor) -> Tensor:
            # Causality alone suffices: with right-padded targets a real position never sees
            # a later (padding) one, and outputs at padding positions are ignored by the loss.
            attended, weights["self"] = self.self_attn(
                h,
                h,
                causal=True,
                cache=cache.self_attn if cache else None,
                need_weights=need_weights,
                position_bias=position_bias,
            )
            return attended

        def attend_source(h: Tensor) -> Tensor:
            attended, weights["cross"] = self.cross_attn(
                h,
                memory,
                memory_mask,
                cache=cache.cross_attn if cache else None,
                static_kv=True,
                need_weights=need_weights,
            )
            return attended

        for norm, sublayer in self.sublayers(attend, attend_source, self.feed_forward):
            x = residual(x, sublayer, norm, self.pre_norm, self.dropout)
        return x, weights["self"], weights["cross"]  # (B, T, D), (B, H, T, T), (B, H, T, S)

    def step(
        self,
        x: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None,
        cache: LayerCache,
        position_bias: Tensor | None = None,
    ) -> Tensor:
        """``forward`` for one new position per row (B, 1, D), at inference, with a cache:
        each attention's ``step`` in the same residual order, without module calls or dropout
        (T5's relative ``position_bias`` (1, H, 1, t) on the self-attention scores)."""

        def attend(h: Tensor) -> Tensor:
            return self.self_attn.step(h, cache.self_attn, position_bias=position_bias)

        def attend_source(h: Tensor) -> Tensor:
            return self.cross_attn.step(h, cache.cross_attn, memory, memory_mask)

        for norm, sublayer in self.sublayers(attend, attend_source, self.feed_forward.forward):
            x = residual(x, sublayer, norm.forward, self.pre_norm)
        return x

    def sublayers(
        self, attend: Sublayer, attend_source: Sublayer, feed_forward: Sublayer
    ) -> list[tuple[nn.LayerNorm | nn.RMSNorm, Sublayer]]:
        """The block's sub-layers in their order, each with its norm (one order for ``forward``
        and ``step``): self-attention, cross-attention (not in a decoder-only block), FFN."""
        parts = [(self.norm1, attend)]
        if self.has_cross:
            parts.append((self.norm2, attend_source))
        parts.append((self.norm3, feed_forward))
        return parts
