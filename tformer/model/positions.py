"""Where each token is: the paper's sinusoids (section 3.5) and two later variants.

Shape legend: B batch, L length, D d_model, H heads, d_k D / H (the size of one head).

- ``sinusoidal`` (the paper): a fixed table added to the embeddings.
- ``learned`` (BERT, Devlin et al. 2019; GPT-2): a trained embedding per position, added alike.
- ``rope`` (RoFormer, Su et al. 2021): nothing is added to the embeddings; self-attention
  rotates each query and key by an angle proportional to its position, so a query-key score
  depends only on their relative offset (:func:`rotate`).
- ``relative`` (T5, Raffel et al. 2020): nothing is added either; a learned scalar per head and
  bucket of relative distance is added to self-attention's scores (:class:`RelativePositionBias`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tformer.config import ModelConfig


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


class AddedPositions(nn.Module):
    """Embeddings + position table[start : start + L], then dropout (section 5.4).

    The base of the three: with no table (RoPE) only the dropout and the length check remain.
    """

    def __init__(self, max_len: int, dropout: float, norm: nn.Module | None = None) -> None:
        super().__init__()
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        # BERT's embeddings.LayerNorm (``embedding_norm``): on the sum, before the dropout.
        self.norm = norm if norm is not None else nn.Identity()

    def vectors(self) -> Tensor | None:
        """The (max_len, D) vector added at each position; None: nothing is added."""
        return None

    def positions(self, start: int, length: int) -> Tensor | None:
        """The (L, D) vectors added at positions start .. start + L - 1; None: nothing added."""
        table = self.vectors()
        return None if table is None else table[start : start + length]

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        length = x.size(1)
        if start + length > self.max_len:
            raise ValueError(
                f"sequence of {start + length} positions exceeds max_len {self.max_len}"
            )
        table = self.positions(start, length)
        return self.dropout(self.norm(x if table is None else x + table.to(x.dtype)))

    def at(self, x: Tensor, index: Tensor) -> Tensor:
        """``forward`` at inference for the positions held in ``index`` (a tensor on x's
        device, so that a captured CUDA graph replays the step at any position)."""
        table = self.vectors()
        return self.norm(x if table is None else x + table.index_select(0, index).to(x.dtype))


class PositionalEncoding(AddedPositions):
    """The paper's fixed sinusoids (section 3.5)."""

    def __init__(
        self, d_model: int, max_len: int, dropout: float, norm: nn.Module | None = None
    ) -> None:
        super().__init__(max_len, dropout, norm)
        # Not persistent: the table is a pure function of the config, so it stays out of the
        # checkpoint and cannot disagree with it.
        self.table: Tensor
        self.register_buffer("table", sinusoidal_positions(max_len, d_model), persistent=False)

    def vectors(self) -> Tensor:
        return self.table


class LearnedPositions(AddedPositions):
    """A trained vector per position, ``nn.Embedding(max_len, D)`` (BERT, Devlin et al. 2019)."""

    def __init__(
        self, d_model: int, max_len: int, dropout: float, norm: nn.Module | None = None
    ) -> None:
        super().__init__(max_len, dropout, norm)
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, std=0.02)  # BERT's and GPT-2's initialisation

    def vectors(self) -> Tensor:
        return self.table.weight


def positional_encoding(config: ModelConfig, norm: nn.Module | None = None) -> AddedPositions:
    """What is added to the embeddings for ``config.positions`` (nothing for RoPE), with
    ``norm`` (BERT's embedding LayerNorm) applied to the sum."""
    held = config.positions_held
    if config.positions == "learned":
        return LearnedPositions(config.d_model, held, config.dropout, norm)
    if config.positions in ("rope", "relative"):
        return AddedPositions(held, config.dropout, norm)
    return PositionalEncoding(config.d_model, held, config.dropout, norm)


def rotary_angles(max_len: int, d_k: int, base: float = 10000.0) -> Tensor:
    """(max_len, d_k / 2) angles m·θ_i with θ_i = base^(-2(i-1)/d_k) (Su et al. 2021, eq. 15)."""
    theta = torch.pow(base, -torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
    return torch.arange(max_len, dtype=torch.float64)[:, None] * theta[None, :]


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each pair (x_2i, x_2i+1) of ``x`` (..., L, d_k) by its angle (cos, sin: (L, d_k/2)).

    RoFormer's R_Θ,m x (eq. 34): (x_2i cos mθ_i - x_2i+1 sin mθ_i, x_2i sin mθ_i + x_2i+1 cos mθ_i).
    Then (R_m q)·(R_n k) = q·(R_(n-m) k): the score sees only the offset n - m.
    """
    even, odd = x[..., 0::2], x[..., 1::2]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2)  # pairs back in place: (..., L, d_k)


class RotaryEmbedding(nn.Module):
    """RoPE for one self-attention layer: rotates queries or keys by their positions.

    The cos/sin tables are not persistent: like the sinusoids they are a pure function of
    the config, so the state dict holds nothing new.
    """

    def __init__(self, d_k: int, max_len: int) -> None:
        super().__init__()
        if d_k % 2:
            raise ValueError(f"rotary positions need an even head size, not {d_k}")
        angles = rotary_angles(max_len, d_k)
        self.cos: Tensor
        self.sin: Tensor
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """(B, H, L, d_k) at positions start .. start + L - 1 -> the same, rotated."""
        end = start + x.size(-2)
        return rotate(x, self.cos[start:end], self.sin[start:end])


def relative_bucket(
    offset: Tensor, *, bidirectional: bool, buckets: int, max_distance: int
) -> Tensor:
    """Bucket of each key-minus-query ``offset`` (T5's ``_relative_position_bucket``).

    Half the buckets (all of them when causal) hold small distances exactly; the rest cover
    distances up to ``max_distance`` logarithmically. Bidirectional: the upper half is for keys
    after the query. Causal: keys after the query all fall in bucket 0 (they are masked anyway).
    """
    bucket = torch.zeros_like(offset)
    if bidirectional:
        buckets //= 2
        bucket = (offset > 0).long() * buckets
        distance = offset.abs()
    else:
        distance = (-offset).clamp(min=0)
    exact = buckets // 2
    far = exact + (
        torch.log(distance.float().clamp(min=1) / exact)
        / math.log(max_distance / exact)
        * (buckets - exact)
    ).long()  # truncated toward zero, as T5's .to(torch.long)
    far = far.clamp(max=buckets - 1)
    return bucket + torch.where(distance < exact, distance, far)


class RelativePositionBias(nn.Module):
    """T5's relative position bias: a learned scalar per (bucket, head), added to the scores of
    every self-attention layer of one stack (computed once, in T5's first layer, and shared)."""

    def __init__(self, config: ModelConfig, *, bidirectional: bool) -> None:
        super().__init__()
        self.bidirectional = bidirectional
        self.buckets = config.relative_buckets
        self.max_distance = config.relative_max_distance
        self.table = nn.Embedding(config.relative_buckets, config.n_heads)

    def forward(self, q_len: int, k_len: int, start: int = 0) -> Tensor:
        """(1, H, Q, K) bias for queries at positions start .. start + Q - 1 and keys 0 .. K - 1."""
        device = self.table.weight.device
        queries = torch.arange(start, start + q_len, device=device)[:, None]
        keys = torch.arange(k_len, device=device)[None, :]
        bucket = relative_bucket(
            keys - queries,
            bidirectional=self.bidirectional,
            buckets=self.buckets,
            max_distance=self.max_distance,
        )
        return self.table(bucket).permute(2, 0, 1)[None]  # (Q, K, H) -> (1, H, Q, K)
