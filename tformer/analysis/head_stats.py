"""Head statistics: how each attention head spreads its weight, and the pattern that dominates.

A pure function of the maps (L, H, R, C): no model, no tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.config import EOS
from tformer.data.display import stands_for

# A head is named for a positional pattern when at least this share of its weight follows it.
POSITIONAL_SHARE = 0.5
# ... "broad" when its rows spread this evenly (entropy / log(keys it can see)) ...
BROAD_ENTROPY = 0.75
# ... and "focused" (content-based: sharp, but not at a fixed offset) when rows peak this high.
FOCUSED_PEAK = 0.5
PATTERNS = ("diagonal", "previous-token", "first-token", "eos", "broad", "focused", "mixed")


@dataclass(frozen=True)
class HeadStats:
    """How one head spreads its weight, averaged over the rows (queries) of its map.

    Shares are the mean weight a row puts on that key: ``diagonal`` its own position,
    ``previous`` the one before, ``first`` key 0 (an "attention sink"), ``eos`` the
    end-of-sequence key. ``entropy`` is in nats; ``spread`` is entropy / log(keys the row can
    see), 0 for one-hot rows and 1 for uniform ones; ``max_weight`` is a row's largest weight.
    """

    layer: int
    head: int
    entropy: float
    spread: float
    diagonal: float
    previous: float
    first: float
    eos: float
    max_weight: float
    pattern: str


def eos_column(columns: list[str]) -> int:
    """The end-of-sequence key: the last ``<eos>`` column if there is one, else the last one."""
    found = [i for i, token in enumerate(columns) if stands_for(token, EOS)]
    return found[-1] if found else len(columns) - 1


def head_statistics(
    maps: Tensor, *, causal: bool = False, eos: int | None = None
) -> list[HeadStats]:
    """Statistics and a pattern tag for every head of (L, H, R, C) maps.

    Args:
        causal: row i sees keys 0..i only (decoder self-attention). Rows that can see a single
            key have no choice to make and are left out of the averages.
        eos: the end-of-sequence column (default: the last one).

    Returns:
        One ``HeadStats`` per (layer, head), layer-major.
    """
    n_layers, n_heads, n_rows, n_cols = maps.shape
    maps = maps.double()
    row = torch.arange(n_rows)
    r, c = row[:, None], torch.arange(n_cols)[None, :]
    visible = c <= r if causal else torch.ones(n_rows, n_cols, dtype=torch.bool)
    n_keys = visible.sum(-1)  # (R,)
    used = n_keys > 1
    if not used.any():
        used = torch.ones(n_rows, dtype=torch.bool)
    eos = n_cols - 1 if eos is None else eos

    def share(keys: Tensor, valid: Tensor) -> Tensor:  # (L, H): mean weight on ``keys``
        valid = valid & used
        if not valid.any():
            return maps.new_zeros(n_layers, n_heads)
        return (maps * keys).sum(-1)[..., valid].mean(-1)

    entropy = -torch.special.xlogy(maps, maps).sum(-1)  # (L, H, R)
    log_keys = n_keys.double().clamp(min=2).log()
    spread = torch.where(n_keys > 1, entropy / log_keys, torch.zeros_like(entropy))
    measures = {
        "diagonal": share(c == r, row < n_cols),
        "previous": share(c == r - 1, (row >= 1) & (row - 1 < n_cols)),
        "first": share(c == 0, used),
        "eos": share(c == eos, visible[:, eos]),
        "entropy": entropy[..., used].mean(-1),
        "spread": spread[..., used].mean(-1),
        "max_weight": maps.amax(-1)[..., used].mean(-1),
    }
    stats = []
    for layer in range(n_layers):
        for head in range(n_heads):
            values = {name: float(v[layer, head]) for name, v in measures.items()}
            stats.append(
                HeadStats(layer=layer, head=head, pattern=head_pattern(**values), **values)
            )
    return stats


def head_pattern(
    *,
    diagonal: float,
    previous: float,
    first: float,
    eos: float,
    spread: float,
    max_weight: float,
    **_: float,
) -> str:
    """The dominant pattern of a head from its statistics (one of ``PATTERNS``)."""
    positional = {
        "diagonal": diagonal,
        "previous-token": previous,
        "first-token": first,
        "eos": eos,
    }
    name, best = max(positional.items(), key=lambda item: item[1])
    if best >= POSITIONAL_SHARE:
        return name
    if spread >= BROAD_ENTROPY:
        return "broad"
    if max_weight >= FOCUSED_PEAK:
        return "focused"
    return "mixed"
