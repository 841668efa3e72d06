"""Keep freed CPU memory for reuse instead of handing it back to the system (Linux, glibc).

A training step allocates the same tensors afresh every time: activations, their gradients,
the logits and the loss's gradient. glibc serves each allocation above a threshold (128 KB,
rising by itself up to 32 MB) with its own ``mmap`` and returns it to the system at ``free``,
and it trims free memory at the top of the heap as well. So each step's tensors start as
untouched pages, and the kernel zeroes every page at its first touch (a page fault), on the
step's own time (docs/performance.md has the measurements). Allocations of 32 MB and more
still get their own mapping (glibc's limit), which huge pages (``tformer.fast.process``) make
cheaper to fill instead.

The settings (``mallopt``) are process-wide:
- ``M_MMAP_THRESHOLD`` at glibc's maximum, 32 MB: smaller blocks come from the heap, where a
  freed block is reused by the next allocation of its size;
- ``M_TRIM_THRESHOLD`` at 1 GB: free memory at the top of the heap is kept, not returned.

A training process reaches the same peak at every step, so keeping that memory does not raise
its peak; it only stops the memory from being handed back between steps. The command line applies
them (``tformer.fast.process.configure_process``); ``TFORMER_KEEP_FREED_MEMORY=0`` turns that
off. Elsewhere (macOS, Windows, musl) there is nothing to set.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h> parameter numbers
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's upper limit on 64-bit systems
TRIM_THRESHOLD = 1 << 30
SWITCH = "TFORMER_KEEP_FREED_MEMORY"

_applied = False


def glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (the only one with these settings), else None."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Apply the settings above once per process; True where they are in force.

    Does nothing (False) where the C library is not glibc or ``TFORMER_KEEP_FREED_MEMORY=0``.
    """
    global _applied
    if _applied:
        return True
    if os.environ.get(SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    libc = glibc()
    if libc is None:
        return False
    # mallopt returns 1 on success; the mmap threshold first, so that a failure of the second
    # leaves the default trimming (which only costs speed).
    _applied = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    return _applied


def release_freed_memory() -> None:
    """Hand the free memory of the heap back to the system now (glibc's ``malloc_trim``), so
    that the process's size is what it holds; nothing to do elsewhere."""
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)
