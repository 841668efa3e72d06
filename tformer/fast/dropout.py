"""Dropout (Srivastava et al., 2014; section 5.4 of the paper) with a cheaper mask on CPUs.

Each element is zeroed with probability p and the survivors are scaled by 1 / (1 - p), exactly
as ``torch.nn.Dropout`` does. Only the way the random mask is drawn differs on a CPU:
``bernoulli_`` draws one full random number per element, a visible part of a small model's
training step on a CPU. Here one 64-bit draw gives four 16-bit lanes, each compared with p
quantised to 1/65536 (0.1 becomes 0.100006): fewer random bits, and faster
(docs/performance.md).
On other devices torch's fused kernel is already cheap and is used as it is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LANES = 4  # 16-bit lanes per 64-bit random word
_LANE_VALUES = 1 << 16


def keep_mask(shape: torch.Size, p: float, device: torch.device | None = None) -> Tensor:
    """A boolean tensor of ``shape``, each element True (kept) with probability ~1 - p."""
    n = shape.numel()
    words = -(-n // _LANES)
    # The full signed 64-bit range, so every 16-bit lane of a word is uniform.
    bits = torch.randint(-(1 << 63), (1 << 63) - 1, (words,), dtype=torch.int64, device=device)
    lanes = bits.view(torch.int16)[:n].view(shape)
    threshold = -(_LANE_VALUES // 2) + round(p * _LANE_VALUES)
    return lanes >= threshold


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Functional form of :class:`Dropout`."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training=True)
    return torch.where(keep_mask(x.shape, p), x * (1.0 / (1.0 - p)), 0.0)


class Dropout(nn.Dropout):
    """``nn.Dropout`` with the cheaper CPU mask; same attribute ``p``, same (empty) state."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)
