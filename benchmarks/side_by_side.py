"""What the benchmarks' --smoke runs share: their independent commands run side by side, one
torch thread each (two processes of two threads on two cores wait on each other), since a
smoke's timings are not compared. A full run keeps one command at a time, with torch's threads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor


def commands_pool(smoke: bool) -> ThreadPoolExecutor:
    """Commands side by side in a smoke run, one a core; one at a time otherwise."""
    return ThreadPoolExecutor((os.cpu_count() or 1) if smoke else 1)


def with_threads(threads: int | None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) for a command of ``threads`` torch threads (None:
    torch's choice)."""
    env = dict(os.environ if env is None else env)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env
