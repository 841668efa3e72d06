"""Linear layers, y = x Wᵀ + b, with pre-packed weights for small-batch CPU inference.

A BLAS matrix product first re-packs the weight matrix into its own blocked layout, on every
call. With few rows (a decoding step of a batch or a beam) that packing costs as much as the
product itself: measured on a 2-core Xeon, a packed (2048 x 512) weight multiplies 4-96 rows
1.5-3x faster. So on a CPU, in inference, in fp32, with 4-96 rows, the weight is packed once
(through MKL, which torch's CPU builds for x86 bundle) when a second call brings the same row
count, and reused until the row count or the weight changes. At one row (a matrix-vector
product) and in every other case nothing changes. The packed copy is a plain attribute,
never part of the state dict.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PACKED_ROWS = range(4, 97)  # where packing measured faster (1 row: equal; 128 and up: equal)


def _mkl_packing() -> bool:
    return torch.backends.mkl.is_available() and hasattr(
        torch.ops.mkl, "_mkl_reorder_linear_weight"
    )


_PACKING = _mkl_packing()


def packed_rows(x: Tensor, weight: Tensor) -> int:
    """The row count :func:`linear` would pack ``weight`` for, or 0 where it would not pack."""
    # Cheap tests first: this runs for every projection of every decoding step. Training
    # stops at the first; traced code (torch.compile) at the second, before the row count,
    # which is symbolic there.
    if not _PACKING or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return 0
    rows = x.numel() // x.size(-1)
    applies = (
        rows in PACKED_ROWS
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.device.type == "cpu"
        and not torch.is_autocast_enabled("cpu")
    )
    return rows if applies else 0


def packing_applies(x: Tensor, weight: Tensor) -> bool:
    """Whether :func:`linear` would use a packed weight for this input."""
    return packed_rows(x, weight) > 0


def linear(owner: nn.Module, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)``, through a packed copy of ``weight`` held by ``owner``."""
    rows = packed_rows(x, weight)
    if not rows:
        return F.linear(x, weight, bias)
    return packed_linear(owner, x, weight, bias, rows)


def packed_linear(
    owner: nn.Module, x: Tensor, weight: Tensor, bias: Tensor | None, rows: int
) -> Tensor:
    """:func:`linear` once :func:`packed_rows` has said yes with ``rows``."""
    key = (rows, weight.data_ptr(), weight._version, weight.shape)
    cached = owner.__dict__.get("_packed_weight")  # a plain attribute: not in state_dict
    if cached is None or cached[0] != key:
        # Pack only when the next call repeats this row count (decoding steps do; a one-off
        # encoder pass or a prefix that grows every step would pay for packing each time).
        owner.__dict__["_packed_weight"] = (key, None)
        return F.linear(x, weight, bias)
    if cached[1] is None:
        cached = (key, torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), rows))
        owner.__dict__["_packed_weight"] = cached
    return torch.ops.mkl._mkl_linear(x, cached[1], weight.detach(), bias, rows)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) with :func:`linear`'s packed path."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(self, x, self.weight, self.bias)


def direct(layer: nn.Linear, x: Tensor) -> Tensor:
    """``layer(x)`` without ``nn.Module``'s call machinery (hooks are not run).

    For the per-token decoding step, where a small model's time goes to the number of
    operations and calls rather than to arithmetic.
    """
    return linear(layer, x, layer.weight, layer.bias)
