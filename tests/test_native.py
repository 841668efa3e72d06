"""Ctrl-C during a long native call: ``interruptible`` and the tokenizer training that uses it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tformer.native import interruptible


def test_returns_the_result_and_raises_the_calls_own_error() -> None:
    assert interruptible(lambda: 6 * 7) == 42
    with pytest.raises(ZeroDivisionError):
        interruptible(lambda: 1 / 0)


def test_runs_directly_outside_the_main_thread() -> None:
    names: list[str] = []
    thread = threading.Thread(
        target=lambda: names.append(interruptible(lambda: threading.current_thread().name)),
        name="caller",
    )
    thread.start()
    thread.join()
    assert names == ["caller"]


def test_ctrl_c_interrupts_the_wait_while_the_call_still_runs() -> None:
    never = threading.Event()
    stop = threading.Event()
    interrupts: list[int] = []

    def first_only(signum: int, frame: object) -> None:
        # Python's own SIGINT handler, once: later signals from the sender are ignored.
        if not interrupts:
            interrupts.append(signum)
            raise KeyboardInterrupt

    def sender() -> None:
        # Ctrl-C until the wait is over, and after 10 s end the call itself, so a lost signal
        # fails this test instead of hanging the suite.
        for _ in range(50):
            if stop.wait(0.2):
                return
            os.kill(os.getpid(), signal.SIGINT)
        never.set()

    previous = signal.signal(signal.SIGINT, first_only)
    unblocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    thread = threading.Thread(target=sender)
    started = time.monotonic()
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            interruptible(never.wait)  # blocks in its own thread until the sender gives up
    finally:
        stop.set()
        thread.join()
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        never.set()  # the worker thread ends too
    assert time.monotonic() - started < 5


# The merges of a 30,000-piece BPE over 60,000 random lines run for several seconds in Rust
# after the last line is read; without the worker thread Ctrl-C waits for all of them.
_CHILD = textwrap.dedent(
    """
    import random, signal, sys
    # As a shell starts a command: Ctrl-C neither ignored nor blocked, whatever the test
    # process that starts this one had set at that moment.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    from tformer.data.tokenizer import train_tokenizer
    rng = random.Random(0)
    def lines():
        for _ in range(60_000):
            yield " ".join(
                "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
                for _ in range(12)
            )
        print("read", flush=True)
    try:
        train_tokenizer(lines(), vocab_size=30_000, min_frequency=0)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
    print("finished", flush=True)
    """
)


@pytest.mark.slow
def test_ctrl_c_stops_tokenizer_training_inside_its_native_merges() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "read"
    time.sleep(0.2)  # inside the native merges
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=60)
    waited = time.monotonic() - sent
    assert (child.returncode, out.strip()) == (130, "interrupted")
    assert waited < 2.0, f"Ctrl-C took {waited:.1f}s to stop tokenizer training"
