"""Long native calls that Ctrl-C can still stop.

Python runs its SIGINT handler only between bytecodes of the main thread, so a call into Rust
or C++ that runs for minutes (training a tokenizer on a large corpus) ignores Ctrl-C until it
returns. ``interruptible`` runs such a call in a worker thread and waits in the main thread,
which then receives ``KeyboardInterrupt`` at once. The worker cannot be stopped from outside;
it is a daemon thread, so it ends with the process, and a Python caller that catches the
interrupt and goes on leaves it to finish in the background.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_POLL_SECONDS = 0.1  # how long the main thread waits between looks at pending signals


def interruptible(call: Callable[[], T], *, name: str = "tformer-native") -> T:
    """``call()``, run so that Ctrl-C in the main thread interrupts the wait for it.

    Outside the main thread (where no signal arrives anyway) the call runs directly. An
    exception raised by ``call`` is raised here, with its own type and traceback.
    """
    if threading.current_thread() is not threading.main_thread():
        return call()
    result: list[T] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            result.append(call())
        except BaseException as error:  # handed to the waiting thread, whatever it is
            failure.append(error)

    worker = threading.Thread(target=work, name=name, daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(_POLL_SECONDS)
    if failure:
        raise failure[0]
    return result[0]
