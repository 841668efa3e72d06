"""Device selection and seeding."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import numpy as np
import torch

from tformer.errors import ConfigError, DeviceError


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA, then Apple MPS, then the CPU; an explicit device must exist.

    Raises:
        DeviceError: the requested device is not available here.
    """
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceError(
                f"--device {name}: no CUDA GPU is visible to this torch "
                f"({torch.__version__}); use --device cpu, or install a CUDA build of torch"
            )
        device = torch.device(name)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(
                f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
        return device
    if name == "mps":
        if not _mps_available():
            raise DeviceError("--device mps: Apple MPS is not available here; use --device cpu")
        return torch.device("mps")
    raise DeviceError(f"--device {name!r} must be auto, cpu, cuda, cuda:N or mps")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) so runs repeat."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_threads(threads: int) -> None:
    """``--threads N``: the CPU threads torch uses inside each operation.

    Raises:
        ConfigError: N < 1.
    """
    if threads < 1:
        raise ConfigError(f"--threads {threads} must be >= 1")
    torch.set_num_threads(threads)


@functools.cache
def cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ("vendor_id", "model name", "flags", ...).

    Empty where the file does not exist (macOS, Windows) or cannot be read.
    """
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            break  # the end of the first processor's block
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields
