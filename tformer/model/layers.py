"""Embeddings, positions, feed-forward and the encoder/decoder layers (sections 3.1, 3.3-3.5).

Shape legend: B batch, S source length, T target length, D d_model, V vocabulary size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import ModelConfig
from tformer.model.attention import MultiHeadAttention
from tformer.model.cache import LayerCache


class TokenEmbedding(nn.Module):
    """Token ids -> vectors, multiplied by √D (section 3.4) so they are not drowned by positions."""

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.scale = math.sqrt(d_model)
        # With a √D scale, N(0, D^-1/2) entries give embeddings of unit scale per dimension;
        # the same matrix then doubles as a well-scaled output projection when tied.
        nn.init.normal_(self.embedding.weight, mean=0.0, std=d_model**-0.5)

    @property
    def weight(self) -> Tensor:
        return self.embedding.weight

    def forward(self, ids: Tensor) -> Tensor:
        return self.embedding(ids) * self.scale  # (B, L, D)


def sinusoidal_positions(max_len: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)).

    Section 3.5. Returns a (max_len, D) tensor.
    """
    position = torch.arange(max_len, dtype=torch.float64)[:, None]
    div = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position / div)
    table[:, 1::2] = torch.cos(position / div[: d_model // 2])
    return table.float()


class PositionalEncoding(nn.Module):
    """Adds the sinusoidal table to the embeddings, then dropout (section 5.4)."""

    def __init__(self, d_model: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.max_len = max_len
        # Not persistent: the table is a pure function of the config, so it stays out of the
        # checkpoint and cannot disagree with it.
        self.table: Tensor
        self.register_buffer("table", sinusoidal_positions(max_len, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        length = x.size(1)
        if start + length > self.max_len:
            raise ValueError(
                f"sequence of {start + length} positions exceeds max_len {self.max_len}"
            )
        return self.dropout(x + self.table[start : start + length].to(x.dtype))


class FeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2, applied to each position alike (section 3.3)."""

    def __init__(self, d_model: int, d_ff: int, activation: str) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_ff, d_model)
        self.activation = F.relu if activation == "relu" else F.gelu

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.activation(self.w1(x)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in residual + LayerNorm (section 3.1).

    Post-norm (the paper): x = LayerNorm(x + Dropout(Sublayer(x))).
    Pre-norm (option):     x = x + Dropout(Sublayer(LayerNorm(x))), steadier for deep stacks.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.pre_norm = config.norm == "pre"
        self.self_attn = MultiHeadAttention(d, config.n_heads, config.attention_dropout)
        self.feed_forward = FeedForward(d, config.d_ff, config.activation)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: Tensor, mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        h = self.norm1(x) if self.pre_norm else x
        attended, weights = self.self_attn(h, h, mask, need_weights=need_weights)
        x = x + self.dropout(attended)
        if not self.pre_norm:
            x = self.norm1(x)

        h = self.norm2(x) if self.pre_norm else x
        x = x + self.dropout(self.feed_forward(h))
        if not self.pre_norm:
            x = self.norm2(x)
        return x, weights  # (B, S, D), (B, H, S, S) or None


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention over the encoder output, then feed-forward.

    Section 3.1: queries of the cross-attention come from the decoder, keys and values from
    the encoder output ("memory").
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.pre_norm = config.norm == "pre"
        self.self_attn = MultiHeadAttention(d, config.n_heads, config.attention_dropout)
        self.cross_attn = MultiHeadAttention(d, config.n_heads, config.attention_dropout)
        self.feed_forward = FeedForward(d, config.d_ff, config.activation)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)
        self.norm3 = nn.LayerNorm(d)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None,
        *,
        cache: LayerCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        h = self.norm1(x) if self.pre_norm else x
        # Causality alone suffices: with right-padded targets a real position never sees a
        # later (padding) one, and outputs at padding positions are ignored by the loss.
        attended, self_weights = self.self_attn(
            h,
            h,
            causal=True,
            cache=cache.self_attn if cache else None,
            need_weights=need_weights,
        )
        x = x + self.dropout(attended)
        if not self.pre_norm:
            x = self.norm1(x)

        h = self.norm2(x) if self.pre_norm else x
        attended, cross_weights = self.cross_attn(
            h,
            memory,
            memory_mask,
            cache=cache.cross_attn if cache else None,
            static_kv=True,
            need_weights=need_weights,
        )
        x = x + self.dropout(attended)
        if not self.pre_norm:
            x = self.norm2(x)

        h = self.norm3(x) if self.pre_norm else x
        x = x + self.dropout(self.feed_forward(h))
        if not self.pre_norm:
            x = self.norm3(x)
        return x, self_weights, cross_weights  # (B, T, D), (B, H, T, T), (B, H, T, S)
