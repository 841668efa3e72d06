"""Sharing the cores: busy tformer processes each take their part of the threads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tformer.fast import sharing
from tformer.fast.sharing import CoreShare

# A second process that registers in FOLDER, says so, and stays until its stdin closes.
CHILD = """
import sys
from pathlib import Path
from tformer.fast.sharing import CoreShare
share = CoreShare(Path(sys.argv[1]), 2)
if "train" in sys.argv:
    share.hold()
if "turn" in sys.argv:
    with share.turn():
        print(share.path, flush=True)
        sys.stdin.read()
else:
    print(share.path, flush=True)
    sys.stdin.read()
share.close()
"""


@pytest.fixture(autouse=True)
def _threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> None:
    """rebalance looks at the others on every call, not once a second."""
    monkeypatch.setattr(sharing, "CHECK_SECONDS", 0.0)


def other_process(folder: Path, *roles: str) -> tuple[subprocess.Popen[str], Path]:
    """A process registered in ``folder``: decoding, or with "train" training and with "turn"
    in the middle of a training step, until its stdin closes."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(folder), *roles],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    return child, Path(child.stdout.readline().strip())


def test_a_busy_process_halves_the_threads_and_its_end_gives_them_back(
    tmp_path: Path, now: None
) -> None:
    mine = CoreShare(tmp_path, cores=4)
    assert mine.rebalance() == 4 and torch.get_num_threads() == 4
    child, _ = other_process(tmp_path)
    assert mine.busy_others() == 1
    assert mine.rebalance() == 2 and torch.get_num_threads() == 2
    child.communicate("")  # it closes its registration and ends
    assert mine.rebalance() == 4 and torch.get_num_threads() == 4
    mine.close()
    assert list(tmp_path.iterdir()) == []


def test_a_killed_process_no_longer_counts_and_its_file_is_removed(
    tmp_path: Path, now: None
) -> None:
    mine = CoreShare(tmp_path, cores=2)
    child, path = other_process(tmp_path)
    assert mine.rebalance() == 1
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert path.exists()  # nothing ran at its end
    assert mine.rebalance() == 2
    assert not path.exists()
    mine.close()


def test_a_process_registering_is_never_taken_for_a_dead_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process counts the busy ones just before the new one locks its file: a file it
    # saw unlocked under its real name would be removed as a dead process's, and the new
    # process would then run unseen by every other.
    other = CoreShare(tmp_path, cores=2)
    lock = sharing.fcntl.flock

    def look_then_lock(fd: int, operation: int) -> None:
        if operation == sharing.fcntl.LOCK_EX:
            other.busy_others()
        lock(fd, operation)

    monkeypatch.setattr(sharing.fcntl, "flock", look_then_lock)
    monkeypatch.setattr(sharing.os, "getpid", lambda: os.getppid())  # another process's name
    share = CoreShare(tmp_path, cores=2)
    monkeypatch.undo()
    assert share.path.exists()
    assert other.busy_others() == 1
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".busy", ".busy"]
    share.close()
    other.close()


def test_an_idle_process_does_not_count(tmp_path: Path, now: None) -> None:
    mine = CoreShare(tmp_path, cores=2)
    child, path = other_process(tmp_path)
    idle_since = time.time() - sharing.BUSY_SECONDS - 1
    os.utime(path, (idle_since, idle_since))  # as if it waited at a prompt since then
    assert mine.busy_others() == 0 and mine.rebalance() == 2
    os.utime(path)  # busy again
    assert mine.rebalance() == 1
    child.communicate("")
    mine.close()


def test_at_least_one_thread_and_at_most_once_a_second(tmp_path: Path) -> None:
    mine = CoreShare(tmp_path, cores=1)
    child, _ = other_process(tmp_path)
    assert mine.rebalance() == 1  # 1 // 2 cores would be none
    child.communicate("")
    mine.cores = 2
    assert mine.rebalance() == 1  # within the second: the last choice, not a new count
    mine.close()


def test_a_training_keeps_its_threads_beside_others_and_makes_them_room(
    tmp_path: Path, now: None
) -> None:
    mine = CoreShare(tmp_path, cores=4)
    child, _ = other_process(tmp_path)
    assert mine.rebalance() == 2  # lowered while it decoded ...
    assert mine.hold() == 4 and torch.get_num_threads() == 4  # ... its own count once it trains
    assert mine.rebalance() == 4 and torch.get_num_threads() == 4  # whatever the other does
    assert mine.busy_others(training=True) == 0  # the other decodes
    child.communicate("")
    mine.close()


@pytest.mark.slow
def test_trainings_take_turns_a_step_at_a_time(tmp_path: Path) -> None:
    mine = CoreShare(tmp_path, cores=2)
    mine.hold()
    child, _ = other_process(tmp_path, "train", "turn")  # stops in the middle of a step
    assert mine.busy_others(training=True) == 1
    stepped = threading.Event()

    def step() -> None:
        with mine.turn():
            stepped.set()

    waiting = threading.Thread(target=step)
    waiting.start()
    assert not stepped.wait(0.5)  # its step waits for the other's to end
    child.communicate("")
    assert stepped.wait(30)
    waiting.join()
    with mine.turn():  # free again at once
        pass
    mine.close()


@pytest.mark.parametrize("setting", [{"TFORMER_CPU_SHARING": "0"}, {"OMP_NUM_THREADS": "3"}])
def test_an_explicit_choice_keeps_the_process_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: dict[str, str]
) -> None:
    monkeypatch.setattr(sharing, "_share", None)
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    assert sharing.join(tmp_path) is None
    assert list(tmp_path.iterdir()) == []


# The command line as a shell starts it: Ctrl-C neither ignored nor blocked, whatever state the
# test process had when it started this one (a trainer that inherited an ignored SIGINT ran its
# whole time budget before the test could go on).
INTERRUPTIBLE_CLI = """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
from tformer.cli import main
main()
"""


def test_the_command_line_registers_while_it_trains(tmp_path: Path, toy_data: Path) -> None:
    """A real `tformer train` marks itself busy in the user's folder (TMPDIR moves it here)."""
    env = {k: v for k, v in os.environ.items() if k not in {"OMP_NUM_THREADS"}}
    env.update(TMPDIR=str(tmp_path), TFORMER_CPU_SHARING="1")
    command = [sys.executable, "-c", INTERRUPTIBLE_CLI, "train",
               "--data", str(toy_data), "--preset", "tiny", "--max-steps", "100000",
               "--time-budget", "20s", "--eval-every", "100000", "--save-every", "100000",
               "--out", str(tmp_path / "run")]  # fmt: skip
    trainer = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    folder = tmp_path / f"tformer-{os.getuid()}-cores"
    try:
        deadline = time.monotonic() + 60
        watcher: CoreShare | None = None
        while time.monotonic() < deadline and trainer.poll() is None:
            if folder.is_dir():
                watcher = watcher or CoreShare(folder, cores=2)
                if watcher.busy_others() == 1:
                    break
            time.sleep(0.2)
        else:
            pytest.fail(f"the trainer never registered in {folder}")
    finally:
        trainer.send_signal(signal.SIGINT)  # registered at start-up: it may not train yet
        trainer.communicate(timeout=120)
    assert watcher is not None
    assert watcher.busy_others() == 0  # its registration ended with it
    watcher.close()
