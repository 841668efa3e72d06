"""Exact resume after real kills: SIGKILL at a random step (with another training beside the
run) and during a save, SIGINT, SIGTERM.

Each test stops a real ``python -m tformer train`` process, resumes the run, and compares every
logged loss, learning rate and validation loss, and the final weights, with one uninterrupted
run of the same command: they must be identical, bit for bit, on a CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.conftest import DEFAULT_THREADS, digit_folder
from tformer.checkpoint.run_dir import LATEST
from tformer.checkpoint.store import SLOW_SAVE_ENV, load_checkpoint
from tformer.checkpoint.verify import verify_checkpoint
from tformer.cli.commands import app
from tformer.fast.sharing import CoreShare

pytestmark = [
    pytest.mark.slow,  # the fast tier (-m "not slow") leaves this file out
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
]

MAX_STEPS = 40
RUN_ARGS = [
    "--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--d-ff", "64",
    "--max-len", "48", "--dropout", "0.1", "--vocab-size", "60", "--max-tokens", "256",
    "--warmup-steps", "5", "--lr", "3e-3", "--log-every", "3", "--eval-every", "6",
    "--save-every", "4", "--keep-last", "2", "--max-steps", str(MAX_STEPS), "--seed", "7",
]  # fmt: skip


# Logging every 3 steps and saving every 4 puts checkpoints between log lines: the running
# loss of the next line must survive the restart.


@pytest.fixture(scope="module", autouse=True)
def _default_threads() -> Iterator[None]:
    """Every run here, in this process or started by it, with the thread count a fresh process
    takes and core sharing on, whatever the test process runs with (a worker of a parallel test
    run has one thread): the runs compared must have the same count, and the SIGKILL test is
    about what sharing does to it."""
    before = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("OMP_NUM_THREADS", raising=False)
        torch.set_num_threads(DEFAULT_THREADS)
        yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About a dozen batches an epoch, so 40 steps cross epoch boundaries; dropout is on, so the
    RNG state matters as much as the data position."""
    return digit_folder(tmp_path_factory.mktemp("resume-data"), 11, train=300, validation=20)


def train_args(data: Path, out: Path) -> list[str]:
    return ["train", "--data", str(data), "--out", str(out), *RUN_ARGS]


@pytest.fixture(scope="module")
def reference(small_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run, never interrupted."""
    out = tmp_path_factory.mktemp("reference") / "run"
    result = CliRunner().invoke(app, train_args(small_data, out))
    assert result.exit_code == 0, result.output
    return out


def start(args: list[str], workdir: Path, **env: str) -> subprocess.Popen[bytes]:
    """``python -m tformer ARGS`` in the background; its output goes to files in ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "tformer", *args],
        stdout=open(workdir / "stdout", "wb"),  # noqa: SIM115 (closed with the process)
        stderr=open(workdir / "stderr", "wb"),  # noqa: SIM115
        env={**os.environ, **env},
        cwd=workdir,
    )


def wait_for(
    condition: Callable[[], bool], proc: subprocess.Popen[bytes], workdir: Path, what: str
) -> None:
    deadline = time.monotonic() + 240
    while not condition():
        if proc.poll() is not None:
            stderr = (workdir / "stderr").read_text(errors="replace")
            pytest.fail(f"the run ended (rc {proc.returncode}) before {what}:\n{stderr[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def logged_step(run: Path) -> int:
    """The last step with a loss line in metrics.jsonl (0 before the first)."""
    step = 0
    path = run / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line being written right now
                continue
            if "loss" in record:
                step = record["step"]
    return step


def trajectory(run: Path) -> list[tuple]:
    """Every logged loss, learning rate and validation loss, in order (timings left out)."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    keep = ("step", "epoch", "loss", "lr", "val_loss", "validation_exact_match")
    return [tuple((k, r[k]) for k in keep if k in r) for r in records]


def saving(run: Path) -> bool:
    """A checkpoint (a step or the best one) is being written right now."""
    return any(run.glob(".step-*")) or any(run.glob("best/.step-*"))


def resume_in_process(run: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--resume", str(run)])
    assert result.exit_code == 0, result.output


def assert_same_run(run: Path, reference: Path) -> None:
    assert trajectory(run) == trajectory(reference)
    assert len([t for t in trajectory(run) if "loss" in dict(t)]) == MAX_STEPS // 3 + 1
    a = load_checkpoint(run).model.state_dict()
    b = load_checkpoint(reference).model.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert (run / "best" / LATEST).read_text() == (reference / "best" / LATEST).read_text()


@contextlib.contextmanager
def another_training(data: Path, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Another tformer training busy on the same cores for the length of the block: registered
    in the same folder (``TMPDIR``, in the environment yielded), as two runs of one user are."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    env = {"TMPDIR": str(folder), "TFORMER_CPU_SHARING": "1"}
    args = ["train", "--data", str(data), "--out", str(tmp_path / "other"), *RUN_ARGS,
            "--max-steps", "100000", "--time-budget", "300s", "--eval-every", "100000",
            "--save-every", "100000"]  # fmt: skip
    other = start(args, tmp_path / "other-output", **env)
    cores = folder / f"tformer-{os.getuid()}-cores"
    watcher: list[CoreShare] = []

    def busy() -> bool:
        if not watcher and cores.is_dir():
            watcher.append(CoreShare(cores, cores=2))
        # Its file says it trains only once it holds its threads; a busy file alone may belong
        # to a run still loading its data, which the run under test would not yet see as one.
        return bool(watcher) and watcher[0].busy_others(training=True) == 1

    try:
        wait_for(busy, other, tmp_path / "other-output", "the other training")
        yield env
        assert busy(), "the other training was busy all along"
    finally:
        other.send_signal(signal.SIGINT)
        other.wait(timeout=120)
        for share in watcher:
            share.close()


def test_sigkill_at_a_random_step_and_during_a_save_then_resume_exactly(
    small_data: Path, reference: Path, tmp_path: Path
) -> None:
    """The first part runs with another training beside it, which then goes: a run that
    followed the other's threads would train with fewer, and its sums would differ."""
    run = tmp_path / "run"
    kill_at = random.Random(2024).randint(5, 30)  # seeded: the same "random" step every time
    with another_training(small_data, tmp_path) as env:
        proc = start(train_args(small_data, run), tmp_path / "first", **env)
        wait_for(lambda: logged_step(run) >= kill_at, proc, tmp_path / "first", f"step {kill_at}")
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed_at = logged_step(run)
    stderr = " ".join((tmp_path / "first" / "stderr").read_text().split())  # lines wrapped
    assert "another tformer training is busy on these cores" in stderr

    # Resume, and kill again while the next checkpoint is being written.
    before = (run / LATEST).read_text()
    proc = start(["train", "--resume", str(run)], tmp_path / "second", **{SLOW_SAVE_ENV: "60"})
    wait_for(lambda: saving(run), proc, tmp_path / "second", "a save to start")
    proc.kill()
    proc.wait(timeout=60)
    assert saving(run), "the kill was meant to land in the middle of a save"
    assert (run / LATEST).read_text() == before  # the half-written checkpoint is not used
    _, checks = verify_checkpoint(run)
    assert all(c.ok for c in checks), checks

    resume_in_process(run)
    assert not saving(run), "temporaries of the interrupted save are cleaned up"
    assert_same_run(run, reference)
    assert killed_at < MAX_STEPS


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_sigint_and_sigterm_save_a_resumable_checkpoint(
    sig: signal.Signals, code: int, small_data: Path, reference: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    proc = start(train_args(small_data, run), tmp_path / "proc")
    wait_for(lambda: logged_step(run) >= 6, proc, tmp_path / "proc", "step 6")
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == code
    stderr = (tmp_path / "proc" / "stderr").read_text()
    assert f"stopped by {sig.name}" in stderr
    assert f"Resume with: tformer train --resume {run}" in stderr
    assert "Traceback" not in stderr
    # The step being run when the signal came was finished and saved.
    stopped = int((run / LATEST).read_text().strip().removeprefix("step-"))
    assert 6 <= stopped < MAX_STEPS
    assert f"after step {stopped};" in stderr
    resume_in_process(run)
    assert_same_run(run, reference)


def test_a_second_ctrl_c_stops_at_once_and_leaves_nothing_half_written(
    small_data: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    proc = start(train_args(small_data, run), tmp_path / "proc", **{SLOW_SAVE_ENV: "60"})
    wait_for(lambda: saving(run), proc, tmp_path / "proc", "a save to start")
    proc.send_signal(signal.SIGINT)  # asks for a stop after the save ...
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)  # ... and this one stops at once, mid-save
    started = time.monotonic()
    assert proc.wait(timeout=60) == 130
    assert time.monotonic() - started < 30  # did not sit out the 60 s pause
    assert not list(run.glob(".step-*")) and not list(run.glob("step-*"))
    assert not (run / LATEST).exists()
    assert "Traceback" not in (tmp_path / "proc" / "stderr").read_text()

