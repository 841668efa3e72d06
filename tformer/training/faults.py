"""Numerical faults and out-of-memory: stop with a message that says what to change.

A NaN / inf loss or gradient stops fp32 training before anything computed from it is logged
or saved; mixed precision skips and counts such steps, and only a long run of them stops it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tformer import checkpoint as ckpt
from tformer.errors import CheckpointError, DivergedError

# Mixed precision skips a step whose gradients overflowed; this many in a row means divergence.
MAX_SKIPPED_IN_A_ROW = 25


def is_out_of_memory(error: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    text = str(error)
    return isinstance(error, oom) or "out of memory" in text or "can't allocate memory" in text


def last_good(out: Path) -> str:
    """The end of an error message: which checkpoint is left to resume from."""
    try:
        return f"; the last good checkpoint {ckpt.resolve(out)} is kept"
    except CheckpointError:
        return "; no checkpoint had been saved yet"


class NumericsGuard:
    """Watches every step's loss and gradient norm for NaN / inf."""

    def __init__(self, device: torch.device, out: Path, precision_name: str) -> None:
        self.out, self.precision_name = out, precision_name
        # The first step whose loss or gradient norm was not finite (0: none yet). Kept on the
        # device and read only where the loop synchronises anyway (log, eval, save).
        self.bad_step = torch.zeros((), dtype=torch.long, device=device)
        self.bad_values = torch.zeros(2, device=device)
        self.skipped = 0
        self.skipped_in_a_row = 0

    def watch(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Remember the first step whose loss or gradient norm is NaN / inf, without a sync.

        In float32 such a step is fatal: ``check`` stops training before anything computed
        from it is logged or saved, so the last checkpoint stays good.
        """
        finite = torch.isfinite(loss) & torch.isfinite(grad_norm)
        first = (self.bad_step == 0) & ~finite
        self.bad_step = torch.where(first, step, self.bad_step)
        values = torch.stack([loss.detach().float(), grad_norm.detach().float()])
        self.bad_values = torch.where(first, values, self.bad_values)

    def check(self) -> None:
        """Raise if a watched step was not finite (reads one value from the device)."""
        step = int(self.bad_step)
        if step == 0:
            return
        loss, norm = (float(v) for v in self.bad_values)
        raise DivergedError(
            f"step {step}: training diverged (loss {loss}, gradient norm {norm}); stopped "
            f"without saving it{last_good(self.out)}. Resume from there with a lower --lr, a "
            "longer --warmup-steps or a smaller --clip-norm"
        )

    def count(self, step: int, skipped: bool) -> None:
        """Count a mixed-precision step skipped for overflow; too many in a row is divergence.

        Reduced precision overflows now and then without anything being wrong (fp16 above all,
        where the grad scaler then lowers its scale); only a long run of skips is fatal.
        """
        if not skipped:
            self.skipped_in_a_row = 0
            return
        self.skipped += 1
        self.skipped_in_a_row += 1
        if self.skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW:
            raise DivergedError(
                f"step {step}: training diverged ({self.skipped_in_a_row} steps in a row had "
                f"non-finite gradients in {self.precision_name}); stopped without saving "
                f"it{last_good(self.out)}. Resume from there with a lower --lr, a longer "
                "--warmup-steps or --precision fp32"
            )
