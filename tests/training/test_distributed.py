"""Data-parallel training under torchrun on CPU (gloo): real processes, a tiny model, few steps.

Checks what the scale-out issue asks: identical weights on every rank, the loss curve of a
single process with the same global batch, one run folder written (by rank 0), checkpoints that
load anywhere with identical logits, resume under DDP, and a killed rank ending the job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from tests.conftest import digit_folder
from tests.training.ddp_worker import model_config, train_config
from tformer.checkpoint import load_checkpoint, resolve
from tformer.cli.commands import app
from tformer.data.lm import bundled_text_dir
from tformer.training.run import train

pytestmark = [
    pytest.mark.slow,  # the fast tier (-m "not slow") leaves this file out
    # One worker of a parallel run takes the whole file, so ddp_run (two ranks) runs once.
    pytest.mark.xdist_group("ddp"),
    pytest.mark.skipif(sys.platform != "linux", reason="torchrun + gloo on Linux"),
    pytest.mark.skipif(
        not torch.distributed.is_available(), reason="this torch has no torch.distributed"
    ),
]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8
CLI_ARGS = [
    "--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--d-ff", "64",
    "--max-len", "48", "--dropout", "0", "--vocab-size", "60", "--max-tokens", "256",
    "--warmup-steps", "5", "--lr", "3e-3", "--log-every", "1", "--eval-every", "4",
    "--save-every", "4", "--label-smoothing", "0", "--seed", "0", "--device", "cpu",
]  # fmt: skip
# The checkout first, then whatever the caller's PYTHONPATH already holds (packages kept there).
ENV = {**os.environ, "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return digit_folder(tmp_path_factory.mktemp("ddp-data"), 21, train=300, validation=20)


def torchrun(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--standalone", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=timeout,
                          cwd=ROOT)  # fmt: skip


def tformer(
    *args: str, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tformer", *args], capture_output=True,
                          text=True, env=env or ENV, timeout=timeout, cwd=ROOT)  # fmt: skip


# Loaded by every Python process started with its folder first on PYTHONPATH: in a rank, it
# marks the exit handlers' run and the interpreter's shutdown (a module global's finalizer).
EXIT_MARKS = """
import atexit, os
from pathlib import Path

if "RANK" in os.environ:
    MARKS = Path(os.environ["EXIT_MARKS"])
    atexit.register(lambda: (MARKS / f"atexit-{os.getpid()}").touch())

    class Finalized:
        def __init__(self):
            self.mark = str(MARKS / f"finalized-{os.getpid()}")

        def __del__(self, open=open):  # bound now: modules and builtins are gone by then
            open(self.mark, "w").close()

    finalized = Finalized()
"""


def exit_marks_env(folder: Path) -> dict[str, str]:
    """ENV with EXIT_MARKS' hook loaded, writing its marks into ``folder``."""
    (folder / "hook").mkdir(parents=True)
    (folder / "hook" / "sitecustomize.py").write_text(EXIT_MARKS)
    (folder / "marks").mkdir()
    return {**ENV, "EXIT_MARKS": str(folder / "marks"),
            "PYTHONPATH": os.pathsep.join([str(folder / "hook"), ENV["PYTHONPATH"]])}  # fmt: skip


def losses(run: Path) -> list[float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


@pytest.fixture(scope="module")
def ddp_run(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks, STEPS steps, each rank's final weights dumped."""
    root = tmp_path_factory.mktemp("ddp")
    worker = str(ROOT / "tests" / "training" / "ddp_worker.py")
    result = torchrun(worker, "--data", str(data), "--out", str(root / "run"),
                      "--dump", str(root / "dump"), "--steps", str(STEPS))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return root


def test_ranks_end_with_identical_weights(ddp_run: Path) -> None:
    rank0 = load_file(str(ddp_run / "dump" / "rank0.safetensors"))
    rank1 = load_file(str(ddp_run / "dump" / "rank1.safetensors"))
    assert rank0.keys() == rank1.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name


def test_only_rank_0_writes_one_run_folder(ddp_run: Path) -> None:
    assert sorted(p.name for p in ddp_run.iterdir()) == ["dump", "run"]
    run = ddp_run / "run"
    assert sorted(p.name for p in run.glob("step-*")) == ["step-000004", "step-000008"]
    # One line per step: rank 1 logged nothing of its own.
    assert len(losses(run)) == STEPS


def test_two_ranks_follow_one_process_with_the_same_global_batch(
    ddp_run: Path, data: Path, tmp_path: Path
) -> None:
    single = train(model_config(), train_config(str(data), STEPS, accumulate=2),
                   out=tmp_path / "single", vocab_size=60)  # fmt: skip
    ddp, one = losses(ddp_run / "run"), losses(tmp_path / "single")
    assert len(ddp) == len(one) == STEPS
    for a, b in zip(ddp, one, strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6), (ddp, one)
    # (The weights are not compared: Adam divides by sqrt(v) + 1e-9, which turns rounding
    # noise in gradients that are zero in exact arithmetic into lr-sized steps.)
    assert single.model is not None


def test_a_ddp_checkpoint_loads_in_one_process_with_identical_logits(ddp_run: Path) -> None:
    loaded = load_checkpoint(ddp_run / "run")  # a plain model: no `module.` prefixes
    rank0 = load_file(str(ddp_run / "dump" / "rank0.safetensors"))
    reference = type(loaded.model)(loaded.model_config)
    reference.load_state_dict(rank0)
    reference.eval()
    src = torch.tensor([[5, 6, 7, 8, 2]])
    tgt = torch.tensor([[1, 9, 10]])
    with torch.no_grad():
        assert torch.equal(loaded.model(src, tgt).logits, reference(src, tgt).logits)


def test_nproc_launches_torchrun_on_a_prepared_folder_and_resume_follows_the_text_run(
    ddp_run: Path, data: Path, tmp_path: Path
) -> None:
    """The same batches on each rank from memory-mapped ids; stopped half-way and resumed:
    the straight-through text run's trajectory and weights."""
    prepared = tmp_path / "prepared"
    made = tformer("prepare", "--data", str(data), "--out", str(prepared), "--vocab-size", "60")
    assert made.returncode == 0, made.stderr[-3000:]
    out = tmp_path / "run"
    first = tformer("train", "--nproc", "2", "--data", str(prepared), "--out", str(out),
                    *CLI_ARGS, "--max-steps", str(STEPS // 2))  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    assert "global batch 2 rank(s) x 1 accumulated x 256 tokens = 512" in first.stderr
    second = tformer("train", "--nproc", "2", "--resume", str(out), "--max-steps", str(STEPS))
    assert second.returncode == 0, second.stderr[-3000:]
    assert losses(out) == pytest.approx(losses(ddp_run / "run"), rel=1e-6)
    rank0 = load_file(str(ddp_run / "dump" / "rank0.safetensors"))
    resumed = load_checkpoint(out).model.state_dict()
    for name, tensor in rank0.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-6)
    assert resolve(out).name == f"step-{STEPS:06d}"


def test_fine_tuning_under_ddp_logs_to_tensorboard(
    ddp_run: Path, data: Path, tmp_path: Path
) -> None:
    """--init-from and --log-to with --nproc: rank 0 writes the events, the run records its
    start, and the events hold what metrics.jsonl holds. The ranks run their exit handlers
    and leave without the interpreter's shutdown, where tearing down gloo's threads was seen to
    abort a rank that had finished well; the events are complete all the same."""
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    from tests.training.test_loggers import assert_events_equal_metrics

    env = exit_marks_env(tmp_path)
    marks = tmp_path / "marks"
    # The hook's control: a process with RANK set that is not a rank of several shuts down.
    subprocess.run([sys.executable, "-c", "pass"], env={**env, "RANK": "0"}, check=True)
    assert len(list(marks.glob("atexit-*"))) == len(list(marks.glob("finalized-*"))) == 1
    for mark in marks.iterdir():
        mark.unlink()
    out = tmp_path / "tuned"
    tuned = tformer("train", "--nproc", "2", "--data", str(data), "--init-from",
                    str(ddp_run / "run"), "--log-to", "tensorboard", "--max-steps", "3",
                    "--log-every", "1", "--eval-every", "3", "--val-bleu", "20",
                    "--device", "cpu", "--out", str(out), env=env)  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    assert len(list(marks.glob("atexit-*"))) == 2  # both ranks
    assert list(marks.glob("finalized-*")) == []
    assert "fine-tuning from" in tuned.stderr
    assert_events_equal_metrics(out)
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1  # rank 0 only
    state = json.loads((resolve(out) / "trainer_state.json").read_text())
    assert state["init_from"]["step"] == STEPS and state["position"]["step"] == 3


def _rank_pid(parent: int, rank: int) -> int | None:
    """The pid of the child process started with RANK=<rank> (Linux /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


def test_a_killed_rank_stops_the_job_and_is_named(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    stderr = tmp_path / "stderr"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tformer", "train", "--nproc", "2", "--data", str(data),
         "--out", str(out), *CLI_ARGS, "--max-steps", "1000000"],
        stdout=subprocess.DEVNULL, stderr=open(stderr, "wb"), env=ENV, cwd=ROOT,  # noqa: SIM115
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not (out / "metrics.jsonl").is_file() or not losses(out):
            assert proc.poll() is None, stderr.read_text()[-3000:]
            assert time.monotonic() < deadline, "no step was logged"
            time.sleep(0.2)
        pid = _rank_pid(proc.pid, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        rc = proc.wait(timeout=90)
        assert time.monotonic() - killed_at < 90
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc != 0
    text = stderr.read_text()
    assert "rank 1" in text and "SIGKILL" in text, text[-3000:]
    assert "Traceback" not in text.split("error:")[-1]


def test_a_single_process_run_resumes_under_ddp_with_accumulation(
    data: Path, tmp_path: Path
) -> None:
    """4 batches a step either way: 1 process x 4 accumulated, then 2 ranks x 2 (no_sync on
    the first micro-batch of each rank). The resumed run follows the single-process one."""
    reference = train(model_config(), train_config(str(data), STEPS, accumulate=4),
                      out=tmp_path / "reference", vocab_size=60)  # fmt: skip
    assert reference.step == STEPS
    out = tmp_path / "run"
    train(model_config(), train_config(str(data), STEPS // 2, accumulate=4), out=out,
          vocab_size=60)  # fmt: skip
    resumed = tformer("train", "--nproc", "2", "--resume", str(out), "--accumulate", "2",
                      "--max-steps", str(STEPS))  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "changed since" in resumed.stderr and "accumulate" in resumed.stderr
    assert "global batch 2 rank(s) x 2 accumulated" in resumed.stderr
    assert losses(out) == pytest.approx(losses(tmp_path / "reference"), rel=1e-5, abs=1e-6)


def test_an_epoch_under_ddp_is_an_epoch(data: Path, tmp_path: Path) -> None:
    """--epochs counts passes over the data whatever the ranks: 2 ranks x 2 accumulated take
    4 batches a step, so one epoch ends after a quarter of its batches' count in steps."""
    out = tmp_path / "run"
    result = tformer("train", "--nproc", "2", "--data", str(data), "--out", str(out), *CLI_ARGS,
                     "--accumulate", "2", "--epochs", "1")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    epochs = [r["epoch"] for r in records if "loss" in r]
    per_step = epochs[0]  # 4 batches of the epoch's count, logged after the first step
    # ceil(batches / 4) steps: the epoch's last step may take up to 3 batches of the next.
    assert 1.0 <= epochs[-1] < 1.0 + per_step, epochs
    assert len(epochs) >= 2


def test_each_cuda_process_needs_its_own_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from tformer.errors import DeviceError
    from tformer.training.distributed import check_gpus_per_process

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    check_gpus_per_process(torch.device("cuda"), 1)
    check_gpus_per_process(torch.device("cpu"), 4)  # gloo: any number of CPU processes
    with pytest.raises(DeviceError, match=r"--nproc 2: .* 1 CUDA device\(s\) are visible"):
        check_gpus_per_process(torch.device("cuda"), 2)
    with pytest.raises(DeviceError, match=r"use torchrun --nproc-per-node 1 or fewer"):
        check_gpus_per_process(torch.device("cuda"), 3, option="torchrun --nproc-per-node")


@pytest.mark.parametrize(
    "variant",
    [["--positions", "rope", "--kv-heads", "1", "--activation", "swiglu", "--normalization",
      "rmsnorm", "--norm", "pre"],
     ["--arch", "encoder-only"]],  # its masks are keyed by example: the same on any rank
    ids=["variants", "encoder-only"],
)  # fmt: skip
def test_an_architecture_variant_trains_under_ddp_as_in_one_process(
    variant: list[str], data: Path, tmp_path: Path
) -> None:
    text = bundled_text_dir() / "validation.txt"
    source = str(text) if "--arch" in variant else str(data)
    common = [*CLI_ARGS, *variant, "--data", source, "--max-steps", str(STEPS)]
    ddp = tformer("train", "--nproc", "2", "--out", str(tmp_path / "ddp"), *common)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    # The same command in one process, run here: a second subprocess would only import again.
    one = CliRunner().invoke(app, ["train", "--accumulate", "2", "--out", str(tmp_path / "one"),
                                   *common])  # fmt: skip
    assert one.exit_code == 0, one.output[-3000:]
    a, b = losses(tmp_path / "ddp"), losses(tmp_path / "one")
    assert len(a) == len(b) == STEPS
    for x, y in zip(a, b, strict=True):
        assert x == pytest.approx(y, rel=1e-5, abs=1e-6), (a, b)
    config = load_checkpoint(tmp_path / "ddp").model_config
    assert (config.positions, config.arch) == (
        ("rope", "encoder-decoder") if "--arch" not in variant else ("sinusoidal", "encoder-only")
    )
