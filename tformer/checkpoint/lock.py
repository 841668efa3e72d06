"""One writer per output folder: the ``.lock`` file that a training run (or an average) holds,
and ``.OUT.lock`` beside every folder a command writes (``writer_lock``).

The lock is an exclusive ``fcntl.flock`` on ``<run>/.lock``, which holds the holder's PID for
the message a second writer gets. The kernel drops a flock when its holder dies, even by
``kill -9``, so a lock left by a killed run never blocks: the next writer takes it over (the
PID in the file is then stale and only rewritten). Every exit through tformer (SIGINT and
SIGTERM during training included) deletes the file. Only the process that writes the run
(rank 0 under DDP) takes it. Where ``fcntl`` is missing (Windows) runs are not locked.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

from tformer.errors import CheckpointError, ConfigError
from tformer.paths import check_replaceable, read_small_text

try:
    import fcntl
except ImportError:  # Windows has no flock: runs are not locked there
    _FLOCK = False
else:
    _FLOCK = True

LOCK = ".lock"


class RunLock:
    """The lock of one run folder; ``acquire`` takes it (or refuses), ``release`` gives it back.

    Usable as a context manager; acquiring an already held lock does nothing.
    """

    def __init__(self, run_dir: Path, flag: str = "--out") -> None:
        self.run_dir, self.flag = Path(run_dir), flag
        self.path = self.run_dir / LOCK
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock of an existing run folder.

        Raises:
            ConfigError: another live process holds it (naming its PID), or ``.lock`` is not
                a regular file.
            CheckpointError: the lock file cannot be created (a read-only folder).
        """
        if self._fd is not None or not _FLOCK:
            return
        check_replaceable(self.path, self.flag, ConfigError)
        for _ in range(10):  # retried only when the file was replaced while we locked it
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ConfigError(self._held_by_another()) from None
            if self._same_file(fd):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self._fd = fd
                return
            os.close(fd)  # its holder deleted it on release: lock the new file instead
        raise ConfigError(f"{self.flag} {self.run_dir}: cannot take {self.path}; try again")

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise CheckpointError(
                f"{self.flag} {self.run_dir}: cannot create the lock file {self.path} "
                f"({error.strerror or error}); fix the permissions or choose another {self.flag}"
            ) from error

    def _same_file(self, fd: int) -> bool:
        try:
            return os.fstat(fd).st_ino == os.lstat(self.path).st_ino
        except FileNotFoundError:
            return False

    def _held_by_another(self) -> str:
        text = (read_small_text(self.path, limit=32) or "").strip()
        who = f"another tformer process (PID {text})" if text.isdigit() else "another process"
        return (
            f"{self.flag} {self.run_dir}: {who} is writing this run (it holds {self.path}); "
            f"wait for it to finish or stop it, or choose another {self.flag}"
        )

    def release(self) -> None:
        """Delete the lock file and let go of it (nothing when not held)."""
        if self._fd is None:
            return
        try:
            if self._same_file(self._fd):
                self.path.unlink()
        except OSError:
            pass  # the folder went away or became read-only: the kernel still drops the lock
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def writer_lock(out: Path, option: str = "OUT") -> RunLock:
    """The one lock of output folder ``out`` that every command writing it holds (import,
    prepare, export, train, average), so two writers of one folder are never at work at once,
    whatever their commands: ``.OUT.lock`` beside ``out`` (which may not exist yet)."""
    return _SiblingLock(out.absolute(), option)


class _SiblingLock(RunLock):
    """The lock of an output folder, ``.OUT.lock`` beside it (``OUT`` may not exist yet):
    ``RunLock``'s flock, so a lock left by a killed writer never blocks."""

    def __init__(self, out: Path, option: str) -> None:
        super().__init__(out.parent, option)
        self.out = out
        self.path = out.parent / f".{out.name}.lock"

    def _held_by_another(self) -> str:
        text = (read_small_text(self.path, limit=32) or "").strip()
        who = f"another tformer process (PID {text})" if text.isdigit() else "another process"
        return (
            f"{self.flag} {self.out}: {who} is writing this folder now (it holds {self.path}); "
            f"wait for it to finish, or choose another {self.flag}"
        )


class RunLocks:
    """A run folder's locks: ``writer_lock`` beside it, which every command writing a folder
    takes, then ``RUN/.lock`` inside it (the run's own, taken once the folder exists)."""

    def __init__(self, run_dir: Path, flag: str = "--out") -> None:
        self.beside = writer_lock(Path(run_dir), flag)
        self.inside = RunLock(Path(run_dir), flag)

    def acquire(self) -> None:
        """Take both that can be taken now: a folder not made yet gets ``RUN/.lock`` from
        ``create_output``; a parent not made yet is made by the run, under that lock.

        Raises:
            ConfigError: another process holds either (naming its PID).
        """
        if self.inside.run_dir.absolute().parent.is_dir():
            self.beside.acquire()
        if self.inside.run_dir.is_dir():
            self.inside.acquire()

    def release(self) -> None:
        self.inside.release()
        self.beside.release()
