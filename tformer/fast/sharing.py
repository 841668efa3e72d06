"""Sharing the CPU cores with other tformer processes: each busy one takes its part.

torch gives a process one thread per core, and its OpenMP threads spin for a while when they
wait for each other. Two such processes on the same cores (training, and ``tformer generate``
on one of its checkpoints) mostly wait for each other: a tiny training run fell to 1-2% of its
speed. Making the threads sleep at once instead costs a process running alone a third or more of
its speed; one thread per process, when two share two cores, costs each almost nothing
(benchmarks/sharing.py; docs/performance.md has the figures).

So each command-line process registers itself (:func:`join`) as a file in a folder of the
user's, locked for as long as the process lives. From its busy loops (a training step, a batch
of decoding) it calls :func:`rebalance`, which at most once a second marks the process busy and
counts the processes busy in the last few seconds; it then uses ``cores // busy`` threads, at
least one. A process that idles (an interactive prompt) stops counting after a few seconds;
one that died unlocks its file, and the next count removes it.

Training never adapts (:func:`hold`): fewer threads change the order of floating-point sums,
and a run's weights must not depend on what else ran beside it. A training process keeps the
threads it started with (one per physical core, or ``--threads``) for the whole run and still
marks itself busy, so the decoding processes beside it make room. Trainings on the same cores
take turns instead (:func:`turn`): each step runs under a lock they share, so a step has all
the threads and the cores to itself, and none waits on threads that another has descheduled.

It stays out of the way of explicit choices: ``--threads N`` or ``OMP_NUM_THREADS`` fix the
thread count, and ``TFORMER_CPU_SHARING=0`` turns this off. Python callers of the library are
not registered unless they call :func:`join` themselves.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

CPU_SHARING = "TFORMER_CPU_SHARING"
CHECK_SECONDS = 1.0  # how often a busy loop looks at the others (a listing and a few locks)
BUSY_SECONDS = 5.0  # a process that has not marked itself busy for this long is left out
HOLDING = b"train"  # a held process's file says so, for the trainings that start beside it
TURNS = "turns.lock"  # the lock that trainings on the same cores take a step at a time
QUEUE = "queue.lock"  # held by the one waiting next for TURNS


def default_folder() -> Path:
    """Where the processes of this user register (one per user: no one else's counts)."""
    return Path(tempfile.gettempdir()) / f"tformer-{os.getuid()}-cores"


class CoreShare:
    """This process's place among the busy tformer processes of ``folder``."""

    def __init__(self, folder: Path, cores: int | None = None) -> None:
        self.folder, self.cores = folder, cores
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = folder / f"{os.getpid()}.busy"
        # Locked under another name, then renamed: a file seen unlocked under its real name
        # would be taken for a dead process's and removed by another process looking then.
        unlocked = folder / f"{os.getpid()}.new"
        self._fd = os.open(unlocked, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # held until the process ends
        os.replace(unlocked, self.path)
        self._checked = -CHECK_SECONDS
        self.threads: int | None = None  # what rebalance last chose
        self.held = False  # training: the thread count never follows the others
        self._turns: int | None = None  # the folder's TURNS file, opened at the first turn
        self._queue: int | None = None  # and its QUEUE file

    def hold(self) -> int:
        """Keep this process's own thread count from now on (restored if it was lowered) and
        tell the others it trains; still marked busy by :meth:`rebalance`."""
        import torch

        if self.cores is None:
            self.cores = torch.get_num_threads()
        if self.threads is not None and self.threads != self.cores:
            torch.set_num_threads(self.cores)
        self.held, self.threads = True, self.cores
        with contextlib.suppress(OSError):
            os.pwrite(self._fd, HOLDING, 0)
            os.utime(self.path)
        return self.cores

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """One step of a held process, while no other held process of the folder runs one."""
        if self._turns is None:
            self._turns = os.open(self.folder / TURNS, os.O_RDWR | os.O_CREAT, 0o600)
            self._queue = os.open(self.folder / QUEUE, os.O_RDWR | os.O_CREAT, 0o600)
        # The next in line waits for the turn holding the queue, so one that has just had its
        # turn queues behind it instead of taking the turn again at once (flock is not fair).
        assert self._queue is not None
        fcntl.flock(self._queue, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._turns, fcntl.LOCK_EX)
        finally:
            fcntl.flock(self._queue, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._turns, fcntl.LOCK_UN)

    def busy_others(self, *, training: bool = False) -> int:
        """Other processes alive and busy within ``BUSY_SECONDS`` (only those that train, when
        ``training``); the dead are removed."""
        now, count = time.time(), 0
        for path in self.folder.glob("*.busy"):
            if path == self.path:
                continue
            try:
                fresh = now - path.stat().st_mtime < BUSY_SECONDS
                if training and fresh:
                    fresh = path.read_bytes()[: len(HOLDING)] == HOLDING
                if _alive(path):
                    count += fresh
            except OSError:  # it ended while we looked
                continue
        return count

    def rebalance(self) -> int | None:
        """Mark this process busy and take ``cores // busy`` threads; at most once a second."""
        now = time.monotonic()
        if now - self._checked < CHECK_SECONDS or "torch" not in sys.modules:
            return self.threads
        self._checked = now
        with contextlib.suppress(OSError):
            os.utime(self.path)
        if self.held:
            return self.threads
        import torch

        if self.cores is None:  # torch's own choice when alone: one thread per physical core
            self.cores = torch.get_num_threads()
        threads = max(1, self.cores // (1 + self.busy_others()))
        if threads != self.threads:
            torch.set_num_threads(threads)
            self.threads = threads
        return threads

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
            os.close(self._fd)
        for fd in (self._turns, self._queue):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)


def _alive(path: Path) -> bool:
    """True while the process that made ``path`` holds its lock; a dead one's file is removed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        path.unlink(missing_ok=True)  # under its lock: no live process owns it
        return False
    finally:
        os.close(fd)


_share: CoreShare | None = None


def join(folder: Path | None = None, cores: int | None = None) -> CoreShare | None:
    """Register this process, unless the thread count is fixed or sharing is turned off.

    ``cores``: the threads this process takes alone (default: torch's default, one per
    physical core, read when torch has loaded).
    """
    global _share
    if _share is not None:
        return _share
    if os.environ.get(CPU_SHARING, "1") == "0" or "OMP_NUM_THREADS" in os.environ:
        return None
    try:
        _share = CoreShare(folder or default_folder(), cores)
    except OSError:  # no writable temporary folder: run as if alone
        return None
    atexit.register(_share.close)
    return _share


def hold() -> str | None:
    """Called when training starts: keep this process's thread count for the whole run (when
    joined). Returns a note when another tformer training is busy on the same cores."""
    if _share is None or "OMP_NUM_THREADS" in os.environ:
        return None
    threads = _share.hold()
    if not _share.busy_others(training=True):
        return None
    return (
        f"another tformer training is busy on these cores: the two take turns a step at a "
        f"time, each with its {threads} threads, so that neither's weights depend on the other"
    )


def turn() -> contextlib.AbstractContextManager[None]:
    """Around a training step of a held process: one step at a time among the trainings."""
    if _share is None or not _share.held:
        return contextlib.nullcontext()
    return _share.turn()


def rebalance() -> None:
    """Called from busy loops: adjust this process's threads to the others (when joined)."""
    if _share is not None and "OMP_NUM_THREADS" not in os.environ:
        _share.rebalance()
