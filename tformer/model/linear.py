"""Linear layers, y = x Wᵀ + b, with pre-packed weights for small-batch CPU inference.

A BLAS matrix product first re-packs the weight matrix into its own blocked layout, on every
call. With few rows (a decoding step of a batch or a beam) that packing costs as much as the
product itself. So on a CPU, in inference, in fp32, with a few rows, the weight is packed once
when a second call brings the same row count, and reused until the row count or the weight
changes. The packed copy is a plain attribute, never part of the state dict.

At one row (a matrix-vector product, batch-1 greedy decoding) BLAS does not pack, but its
matrix-vector kernel for a weight stored (out x in) with out much larger than in streams the
weight at half the memory bandwidth of the packed product: on a 2-core AMD EPYC, with weights
too large for the caches, (32000 x 512) took 5.7 ms against 2.9 ms packed, (2048 x 512) 410
against 265 us, at one thread or two. Weights at least twice as tall as wide are packed for
one row; square and wide ones measured as fast or faster unpacked.

Two packers come with torch's x86 CPU builds, and which one is faster depends on the CPU:

- MKL (``_mkl_reorder_linear_weight``): on a 2-core Xeon a packed (2048 x 512) weight
  multiplied 4-96 rows 1.5-3x faster than ``F.linear``. MKL chooses its kernels by CPU vendor,
  and on an AMD EPYC it was no faster than ``F.linear`` for the widest matrices.
- oneDNN (``mkldnn._reorder_linear_weight``): on a 2-core AMD EPYC, for weights of 1M entries
  and more (the feed-forward and vocabulary matrices), it multiplied 2-96 rows 1.3-3.3x faster
  than MKL's packed product (32 rows x (32000 x 512): 108 against 49 GFLOP/s), while for
  smaller weights its fixed cost per call made it slower.

So on Intel CPUs MKL packs every eligible weight (as measured there); elsewhere oneDNN packs
the large ones and MKL the rest. ``ONEDNN_LARGE_WEIGHTS`` switches that choice.
"""

from __future__ import annotations

import platform

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.device import cpuinfo

PACKED_ROWS = range(4, 97)  # where MKL packing measured faster (128 rows and up: equal)
ONEDNN_ROWS = range(2, 97)  # where oneDNN packing measured faster, for large weights
ONEDNN_MIN_WEIGHT = 1 << 20  # entries; below, oneDNN's fixed cost per call mostly outweighs it


def _mkl_packing() -> bool:
    return torch.backends.mkl.is_available() and hasattr(
        torch.ops.mkl, "_mkl_reorder_linear_weight"
    )


def _onednn_packing() -> bool:
    # x86 only: that is where it was measured, and where torch's builds bundle it with MKL.
    return (
        platform.machine().lower() in ("x86_64", "amd64")
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def _intel_cpu() -> bool:
    vendor = cpuinfo().get("vendor_id") or platform.processor()
    return "intel" in vendor.lower()


_PACKING = _mkl_packing()
_ONEDNN = _onednn_packing()
# Whether weights of ONEDNN_MIN_WEIGHT entries and more are packed by oneDNN rather than MKL.
ONEDNN_LARGE_WEIGHTS = _ONEDNN and not (_PACKING and _intel_cpu())


def _tall(weight: Tensor) -> bool:
    """At least twice as many outputs as inputs: where packing pays at one row."""
    return weight.size(0) >= 2 * weight.size(1)


def _uses_onednn(rows: int, weight: Tensor) -> bool:
    if not ONEDNN_LARGE_WEIGHTS or rows not in ONEDNN_ROWS:
        return False
    # Measured on the EPYC: 1M entries and more, or 256K and more with >= 1024 outputs
    # (a (1024 x 256) feed-forward matrix: 1.0-1.5x), gain; narrower outputs lose (0.5-0.9x).
    size = weight.numel()
    return size >= ONEDNN_MIN_WEIGHT or size >= ONEDNN_MIN_WEIGHT // 4 and weight.size(0) >= 1024


def packed_rows(x: Tensor, weight: Tensor) -> int:
    """The row count :func:`linear` would pack ``weight`` for, or 0 where it would not pack."""
    # Cheap tests first: this runs for every projection of every decoding step. Training
    # stops at the first; traced code (torch.compile) at the second, before the row count,
    # which is symbolic there.
    if not (_PACKING or _ONEDNN) or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return 0
    rows = x.numel() // x.size(-1)
    applies = (
        (
            _PACKING
            and (rows in PACKED_ROWS or rows == 1 and _tall(weight))
            or _uses_onednn(rows, weight)
        )
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
    onednn = _uses_onednn(rows, weight)
    key = (rows, onednn, weight.data_ptr(), weight._version, weight.shape)
    cached = owner.__dict__.get("_packed_weight")  # a plain attribute: not in state_dict
    if cached is None or cached[0] != key:
        # Pack only when the next call repeats this row count (decoding steps do; a one-off
        # encoder pass or a prefix that grows every step would pay for packing each time).
        owner.__dict__["_packed_weight"] = (key, None)
        return F.linear(x, weight, bias)
    if cached[1] is None:
        w = weight.detach()
        packed = (
            torch.ops.mkldnn._reorder_linear_weight(w, rows)
            if onednn
            else torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
        )
        cached = (key, packed)
        owner.__dict__["_packed_weight"] = cached
    if onednn:
        return torch.ops.mkldnn._linear_pointwise(x, cached[1], bias, "none", [], "")
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
