"""Key/value caches for incremental decoding (the cached keys and values of section 3.2.3).

Shape legend: B rows, H heads, L cached positions, d_k the size of one head.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


class KVCache:
    """Keys and values already projected for one attention layer, (B, H, L, d_k) each.

    Self-attention appends one step at a time; cross-attention fills it once per source.
    Appended steps are written into a preallocated buffer whose capacity doubles when full:
    concatenating a new tensor at every step would copy the whole past each time.
    """

    def __init__(self) -> None:
        self._k: Tensor | None = None  # (B, H, capacity, d_k); steps [0, length) are filled
        self._v: Tensor | None = None
        self.length = 0
        # (1, 1, 1, L) the cached positions a new query may see; None: all of them (a static
        # cache of fixed capacity, whose later positions are not yet written, sets it).
        self.visible: Tensor | None = None

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
        """Keep rows ``index`` (beam reordering, dropping finished sequences)."""
        if self._k is not None and self._v is not None:
            self._k = self._rows(self._k, index)
            self._v = self._rows(self._v, index)

    def _rows(self, buffer: Tensor, index: Tensor) -> Tensor:
        """Rows ``index`` of ``buffer`` in a buffer of the same capacity; only the filled
        steps are copied (beam search reorders every step, and the rest is written later)."""
        if self.length == buffer.size(2) or buffer.requires_grad:  # out= has no gradient
            return buffer.index_select(0, index)
        moved = buffer.new_empty(index.numel(), *buffer.shape[1:])
        torch.index_select(buffer[:, :, : self.length], 0, index, out=moved[:, :, : self.length])
        return moved


@dataclass
class LayerCache:
    """One decoder layer's cached keys/values: its own past, and the projected source."""

    self_attn: KVCache = field(default_factory=KVCache)
    cross_attn: KVCache = field(default_factory=KVCache)


@dataclass
class DecoderCache:
    """Per-layer key/value caches for incremental decoding, plus how many steps are cached."""

    layers: list[LayerCache]
    length: int = 0
    # The new position as a (1,) tensor on the model's device, for a step captured as a CUDA
    # graph (replayed at any position); None: ``length`` is the position.
    index: Tensor | None = None

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index``, in that order (beam search, dropping finished rows)."""
        for layer in self.layers:
            layer.self_attn.reorder(index)
            layer.cross_attn.reorder(index)
