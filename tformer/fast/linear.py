"""Linear layers, y = x Wᵀ + b, made faster for small-batch CPU inference.

Two remedies, for two ways a BLAS library wastes a decoding step's few rows:

**Split over threads (1-4 rows).** BLAS runs a product with one row (a matrix-vector product)
or a few on one thread, and such a product is bound by how fast the weight streams from
memory, which one core does at about half the rate of two. Cut into one block of outputs per
thread (a free view of the weight), the product becomes a batched one, ``baddbmm``, which torch
runs one block per thread.

**Pre-packing (1-96 rows).** A BLAS matrix product first re-packs the weight into its own
blocked layout, on every call; with few rows that costs as much as the product itself. So the
weight is packed once when a second call brings the same row count, and reused until the row
count or the weight changes; the packed copy is a plain attribute, never in the state dict.
Two packers come with torch's x86 CPU builds and which is faster depends on the CPU: MKL
(chosen on Intel CPUs, where it was measured) and oneDNN (for large weights elsewhere).

Both run only on x86 CPUs, in fp32 inference, where they were measured; the row ranges and
weight sizes below are where each measured faster (docs/performance.md has the figures).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.device import cpuinfo

SPLIT_ROWS = range(1, 5)  # where splitting over threads measured faster than packing
SPLIT_MIN_WEIGHT = 1 << 16  # entries; below, starting the threads costs more than it saves
PACKED_ROWS = range(4, 97)  # where MKL packing measured faster (128 rows and up: equal)
ONEDNN_ROWS = range(2, 97)  # where oneDNN packing measured faster, for large weights
ONEDNN_MIN_WEIGHT = 1 << 20  # entries; below, oneDNN's fixed cost per call mostly outweighs it
ONEDNN_MID_WEIGHT = 3 << 16  # entries; from here oneDNN also wins for weights with many outputs


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def _mkl_packing() -> bool:
    return torch.backends.mkl.is_available() and hasattr(
        torch.ops.mkl, "_mkl_reorder_linear_weight"
    )


def _onednn_packing() -> bool:
    # x86 only: that is where it was measured, and where torch's builds bundle it with MKL.
    return (
        _x86()
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def _intel_cpu() -> bool:
    vendor = cpuinfo().get("vendor_id") or platform.processor()
    return "intel" in vendor.lower()


_X86 = _x86()
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
    # Against MKL's packed product, large weights gain, and so do mid-sized ones with many
    # outputs, where narrower ones lose (docs/performance.md).
    size = weight.numel()
    return size >= ONEDNN_MIN_WEIGHT or size >= ONEDNN_MID_WEIGHT and weight.size(0) >= 512


def inference_rows(x: Tensor, weight: Tensor) -> int:
    """The row count of ``x`` where :func:`linear` may speed the product up, else 0.

    That is an fp32 CPU product on x86 outside autograd, autocast and tracing.
    """
    # Cheap tests first: this runs for every projection of every decoding step. Training
    # stops at the first; traced code (torch.compile) at the second, before the row count,
    # which is symbolic there.
    if not _X86 or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return 0
    if (
        x.dtype != torch.float32
        or weight.dtype != torch.float32
        or x.device.type != "cpu"
        or torch.is_autocast_enabled("cpu")
    ):
        return 0
    return x.numel() // x.size(-1)


def split_parts(rows: int, weight: Tensor) -> int:
    """How many blocks of outputs :func:`linear` splits ``weight`` into for ``rows``, or 0.

    One per thread, or as many as divide the outputs evenly, never fewer than two.
    """
    if rows not in SPLIT_ROWS or weight.numel() < SPLIT_MIN_WEIGHT:
        return 0
    if rows > 1 and (not ONEDNN_LARGE_WEIGHTS or weight.numel() >= ONEDNN_MIN_WEIGHT // 2):
        # 2-4 rows: oneDNN's packed product wins from about half ONEDNN_MIN_WEIGHT entries
        # and loses below; with MKL packing (Intel CPUs) only one row was measured split.
        return 0
    if not weight.is_contiguous():
        return 0
    out = weight.size(0)
    for parts in range(torch.get_num_threads(), 1, -1):
        if out % parts == 0:
            return parts
    return 0  # one thread: nothing to split


def _packs(rows: int, weight: Tensor) -> bool:
    return (
        _PACKING
        and (rows in PACKED_ROWS or rows == 1 and _tall(weight))
        or _ONEDNN
        and _uses_onednn(rows, weight)
    )


def packed_rows(x: Tensor, weight: Tensor) -> int:
    """The row count :func:`linear` would pack ``weight`` for, or 0 where it would not pack."""
    rows = inference_rows(x, weight)
    return rows if rows and not split_parts(rows, weight) and _packs(rows, weight) else 0


def packing_applies(x: Tensor, weight: Tensor) -> bool:
    """Whether :func:`linear` would use a packed weight for this input."""
    return packed_rows(x, weight) > 0


def linear(owner: nn.Module, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)``, split over threads or through a packed copy of ``weight``
    held by ``owner``, where either pays."""
    out = fast_linear(owner, x, weight, bias)
    return F.linear(x, weight, bias) if out is None else out


def fast_linear(owner: nn.Module, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor | None:
    """:func:`linear` where it splits or packs; None where it would call ``F.linear``."""
    rows = inference_rows(x, weight)
    if not rows:
        return None
    parts = split_parts(rows, weight)
    if parts:
        if split_pays(x, weight, bias, parts):
            return split_linear(x, weight, bias, parts)
        return None
    if _packs(rows, weight):
        return packed_linear(owner, x, weight, bias, rows)
    return None


def unpacked_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """:func:`linear` for a weight used for a few calls only: split where that pays, never
    packed (packing a weight costs more than one product with it)."""
    rows = inference_rows(x, weight)
    parts = split_parts(rows, weight) if rows else 0
    if parts and split_pays(x, weight, bias, parts):
        return split_linear(x, weight, bias, parts)
    return F.linear(x, weight, bias)


# Whether splitting paid, per (weight shape, rows, parts, threads): measured once per process.
_SPLIT_PAYS: dict[tuple[int, ...], bool] = {}
_TRIALS = 5  # calls of each kind per measurement; the fastest of each is compared


def split_pays(x: Tensor, weight: Tensor, bias: Tensor | None, parts: int) -> bool:
    """Whether :func:`split_linear` beats ``F.linear`` for this product on this machine.

    Where it pays depends on the CPU and how its threads wake: it was 2x faster on an AMD EPYC
    and 3x slower on another 2-core Xeon (docs/performance.md). So the first product of each
    shape times both, on its own input, and the faster one is kept for the process.
    """
    rows = x.numel() // x.size(-1)
    key = (*weight.shape, rows, parts, torch.get_num_threads())
    known = _SPLIT_PAYS.get(key)
    if known is None:
        split = _fastest(lambda: split_linear(x, weight, bias, parts))
        whole = _fastest(lambda: F.linear(x, weight, bias))
        known = _SPLIT_PAYS[key] = split < whole
    return known


def _fastest(call: Callable[[], Tensor]) -> float:
    call()  # warm: the first call may allocate or start threads
    best = float("inf")
    for _ in range(_TRIALS):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def split_linear(x: Tensor, weight: Tensor, bias: Tensor | None, parts: int) -> Tensor:
    """``F.linear(x, weight, bias)`` as ``parts`` products, one per block of outputs, run
    side by side (``baddbmm`` gives each batch entry to a thread). Inference only."""
    out, inputs = weight.shape
    rows = x.numel() // inputs
    blocks = weight.view(parts, out // parts, inputs)  # a view: nothing copied
    # x as each block's (inputs x rows) right-hand side, stored column by column (strides
    # (1, inputs)): BLAS takes it as it is, where a (1, 1) stride for one row made torch
    # fall back to a much slower kernel.
    x = x.contiguous()
    columns = x.as_strided((parts, inputs, rows), (0, 1, inputs))
    if bias is None:
        y = torch.bmm(blocks, columns)
    else:
        y = torch.baddbmm(bias.view(parts, out // parts, 1), blocks, columns)
    shape = (*x.shape[:-1], out)
    # y is (parts, out/parts, rows): for one row that is already the output's layout.
    return y.view(shape) if rows == 1 else y.view(out, rows).t().reshape(shape)


def packed_linear(
    owner: nn.Module, x: Tensor, weight: Tensor, bias: Tensor | None, rows: int
) -> Tensor:
    """:func:`linear` once :func:`packed_rows` has said yes with ``rows``."""
    onednn = _uses_onednn(rows, weight)
    key = (rows, onednn, weight.data_ptr(), weight._version, weight.shape)
    cached = owner.__dict__.get("_packed_weight")  # a plain attribute: not in state_dict
    if cached is None or cached[0] != key:
        spare = owner.__dict__.pop("_packed_spare", None)
        if cached is not None and cached[1] is not None:
            spare = cached  # never both: packing drops the spare
        if spare is not None and spare[0] == key:
            # Back to the row count packed before a one-off: beam search's first step has one
            # row per source and every later step K, and repacking a vocabulary-sized weight
            # for K at every call cost more than a step.
            owner.__dict__["_packed_weight"] = cached = spare
        else:
            # Pack only when the next call repeats this row count (decoding steps do; a one-off
            # encoder pass or a prefix that grows every step would pay for packing each time).
            owner.__dict__["_packed_weight"] = (key, None)
            if spare is not None and spare[0][2:] == key[2:]:
                owner.__dict__["_packed_spare"] = spare  # the same weight: kept for a return
            return F.linear(x, weight, bias)
    if cached[1] is None:
        owner.__dict__.pop("_packed_spare", None)  # one packed copy at a time
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


def forget_packed(owner: nn.Module) -> None:
    """Drop ``owner``'s packed copies of its weight (a new weight may reuse the old address)."""
    owner.__dict__.pop("_packed_weight", None)
    owner.__dict__.pop("_packed_spare", None)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) with :func:`linear`'s packed path."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(self, x, self.weight, self.bias)


def direct(layer: nn.Module, x: Tensor) -> Tensor:
    """``layer(x)`` without ``nn.Module``'s call machinery (hooks are not run).

    For the per-token decoding step, where a small model's time goes to the number of
    operations and calls rather than to arithmetic. A layer that is not an ``nn.Linear``
    (an int8 one) runs its own ``forward``.
    """
    if isinstance(layer, nn.Linear):
        return linear(layer, x, layer.weight, layer.bias)
    return layer.forward(x)
