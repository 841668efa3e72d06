"""Process-wide settings for CPU training and decoding, applied by one explicit call.

Importing tformer changes nothing in the process; the command line calls
:func:`configure_process` first thing, and a Python user may call it at the top of a script
(before torch allocates its first tensor, for the huge-page switch to take effect). This module
imports nothing heavy, so it can run before torch loads.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from tformer.fast import sharing
from tformer.fast.malloc import keep_freed_memory

HUGE_PAGES = "THP_MEM_ALLOC_ENABLE"


@dataclass(frozen=True)
class ProcessSettings:
    """What :func:`configure_process` put in force."""

    huge_pages: bool  # torch backs large CPU tensors with transparent huge pages
    keep_freed_memory: bool  # glibc keeps freed memory for reuse (tformer.fast.malloc)
    shares_cores: bool  # threads follow the other busy tformer processes (tformer.fast.sharing)


def configure_process() -> ProcessSettings:
    """Turn on torch's huge pages for large CPU tensors, keep freed memory for reuse, and
    share the cores with other busy tformer processes (``tformer.fast.sharing``).

    Training allocates its largest tensors afresh at every step, and with 4 KB pages the
    first touch of each page is a page fault; torch's own switch ``THP_MEM_ALLOC_ENABLE``
    aligns allocations of 2 MB and more to huge pages. torch reads it once, at its first
    allocation, so it counts only when set before torch is imported; an explicit setting
    wins (``THP_MEM_ALLOC_ENABLE=0`` turns it off), and so does
    ``TFORMER_KEEP_FREED_MEMORY=0`` for the allocator setting.
    """
    os.environ.setdefault(HUGE_PAGES, "1")
    huge_pages = os.environ[HUGE_PAGES] == "1" and "torch" not in sys.modules
    return ProcessSettings(
        huge_pages=huge_pages,
        keep_freed_memory=keep_freed_memory(),
        shares_cores=sharing.join() is not None,
    )
