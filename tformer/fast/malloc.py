"""Keep freed CPU memory for reuse instead of handing it back to the system (Linux, glibc).

A training step allocates the same tensors afresh every time: activations, their gradients,
the logits and the loss's gradient. glibc serves each allocation above a threshold (128 KB,
rising by itself up to 32 MB) with its own ``mmap`` and returns it to the system at ``free``,
and it trims free memory at the top of the heap as well. So each step's tensors start as
untouched pages, and the kernel zeroes every page at its first touch (a page fault), on the
step's own time (docs/performance.md has the measurements).

The settings (``mallopt``) are process-wide:
- ``M_MMAP_MAX`` at 0: every block comes from the heap, where a freed block is reused by the
  next allocation of its size. The largest tensors of a step at the paper's base shape (the
  logits and their gradient, the embedding's gradient) are above glibc's largest mmap
  threshold (32 MB), and each of them was a fresh mapping at every step;
- ``M_MMAP_THRESHOLD`` at glibc's maximum, 32 MB, for a C library that refuses the first;
- ``M_TRIM_THRESHOLD`` off: free memory at the top of the heap is kept, not returned. A step of
  the base shape frees more than a gigabyte at its end, which a finite threshold handed back.

A training process reaches the same peak at every step, so keeping that memory does not raise
its peak; it only stops the memory from being handed back between steps (measured at the base
shape: a peak 2-3% higher, docs/performance.md). :func:`release_freed_memory` hands it back on
request (the dry run's memory estimate does). The command line applies the settings
(``tformer.fast.process.configure_process``); ``TFORMER_KEEP_FREED_MEMORY=0`` turns that off.
Elsewhere (macOS, Windows, musl) there is nothing to set.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h> parameter numbers
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's upper limit on 64-bit systems
NEVER_TRIM = -1  # glibc: a trim threshold of -1 turns trimming off
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
    # mallopt returns 1 on success; the placement first, so that a failure of the last leaves
    # the default trimming (which only costs speed).
    placed = [libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX), libc.mallopt(M_MMAP_MAX, 0)]
    _applied = all(placed) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
    return _applied


def release_freed_memory() -> None:
    """Hand the free memory of the heap back to the system now (glibc's ``malloc_trim``), so
    that the process's size is what it holds; nothing to do elsewhere."""
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)
