"""Numeric precision of training: fp32, or mixed precision with bf16 / fp16 autocast.

``auto`` picks per device what is fastest without hurting convergence:

- CUDA: bf16 autocast where the GPU supports it (Ampere and later), else fp16 autocast with a
  gradient scaler (fp16's narrow range needs the loss scaled so small gradients do not vanish).
- CPU: bf16 autocast when the CPU multiplies bf16 matrices faster than fp32 ones (AMX, or
  AVX-512-BF16 on AMD) and the model is wide enough to gain from them. Autocast copies each
  weight to bf16 on every forward pass; below ``d_model`` 256 those copies cost more than the
  faster matmuls save (docs/performance.md has the measurements).
- MPS: fp32.

Weights, gradients and optimizer state stay fp32 in every mode; only the forward computation
runs in the lower precision, so checkpoints are the same whichever precision trained them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from tformer.config import ModelConfig, PrecisionName
from tformer.device import cpuinfo
from tformer.errors import ConfigError

PRECISIONS: tuple[str, ...] = get_args(PrecisionName)

# The narrowest model for which CPU bf16 autocast pays for its weight casts (see above).
CPU_BF16_MIN_D_MODEL = 256


@dataclass(frozen=True)
class Precision:
    """The resolved precision of a run on one device."""

    name: Literal["fp32", "bf16", "fp16"]
    device_type: str

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype, or None for plain fp32."""
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.name)

    @property
    def mixed(self) -> bool:
        return self.name != "fp32"

    @property
    def needs_scaler(self) -> bool:
        """fp16 overflows / underflows without loss scaling; bf16 has fp32's range."""
        return self.name == "fp16"

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The forward pass (and loss) of a step runs inside this."""
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device_type, dtype=self.dtype):
            yield

    def scaler(self) -> torch.amp.GradScaler | None:
        if not self.needs_scaler:
            return None
        return torch.amp.GradScaler(self.device_type)


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices faster than fp32 ones: with AMX, or with
    AVX-512-BF16 on AMD (Zen 4 and later). An Intel CPU whose only bf16 instructions are
    AVX-512-BF16 (AMX absent or hidden by a virtual machine) multiplied bf16 at about half its
    fp32 speed (docs/performance.md), so fp32 is faster there."""
    info = cpuinfo()
    flags = set(info.get("flags", "").split())
    if "amx_bf16" in flags:
        return True
    return "avx512_bf16" in flags and info.get("vendor_id") == "AuthenticAMD"


def resolve_precision(
    name: str, device: torch.device, model: ModelConfig | None = None
) -> Precision:
    """Turn ``--precision`` into what this device will run.

    Raises:
        ConfigError: an unknown name, or a precision the device cannot run.
    """
    if name not in PRECISIONS:
        raise ConfigError(f"--precision {name!r} must be one of {', '.join(PRECISIONS)}")
    kind = device.type
    if name == "auto":
        name = _auto(device, model)
    if name == "fp16" and kind != "cuda":
        raise ConfigError(
            f"--precision fp16 needs a CUDA GPU (this run is on {kind}); use bf16 or fp32"
        )
    if name == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("--precision bf16: this GPU has no bf16 support; use fp16 or fp32")
    if name == "bf16" and kind == "mps":
        raise ConfigError("--precision bf16 is not supported on MPS; use fp32")
    return Precision(name=name, device_type=kind)  # type: ignore[arg-type]


def _auto(device: torch.device, model: ModelConfig | None) -> str:
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if device.type == "cpu":
        wide = model is None or model.d_model >= CPU_BF16_MIN_D_MODEL
        return "bf16" if cpu_has_bf16() and wide else "fp32"
    return "fp32"
