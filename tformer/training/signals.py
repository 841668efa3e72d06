"""Stopping on SIGINT / SIGTERM: finish the step, save, exit 130 / 143."""

from __future__ import annotations

import signal
import threading
from typing import Any

from tformer.errors import Aborted

# The shell's convention: 128 + the signal number.
SIGNAL_EXIT_CODES: dict[int, int] = {int(signal.SIGINT): 130, int(signal.SIGTERM): 143}


def exit_code(signum: int) -> int:
    return SIGNAL_EXIT_CODES.get(signum, 130)


class StopOnSignal:
    """SIGINT / SIGTERM ask training to stop after the current step, with a checkpoint.

    The handler only records the request: the loop finishes the step, saves, and raises
    ``TrainingInterrupted``. A second signal raises ``Aborted`` at once; saves are atomic, so
    stopping in the middle of one leaves the previous checkpoint intact. Handlers are installed
    only in the main thread (Python allows nothing else) and restored on exit.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNAL_EXIT_CODES:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is not None:
            self._restore()
            raise Aborted(exit_code(signum))
        self.received = signum

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
