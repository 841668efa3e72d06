"""Hostile files and folders: no data loss, no escape from the run folder (issue 27, classes 1-2).

Each case runs the real CLI against real files in a temporary folder and checks the exit code,
a one-line message without a traceback, and that every file that existed before is
byte-identical afterwards (the tree is hashed before and after; links and FIFOs are recorded
as such, never followed or opened). docs/reliability.md states what these tests guarantee.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from tests.conftest import digit_folder
from tformer.checkpoint.files import write_text_atomic
from tformer.checkpoint.lock import LOCK, RunLock
from tformer.checkpoint.run_dir import LATEST, is_run_dir, remove_run, resolve
from tformer.checkpoint.store import SLOW_SAVE_ENV, load_checkpoint, save_checkpoint
from tformer.cli.commands import app
from tformer.data.tokenizer import train_tokenizer
from tformer.errors import CheckpointError, ConfigError
from tformer.paths import excerpt

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX files and signals")

TINY = [
    "--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--d-ff", "64",
    "--max-len", "48", "--dropout", "0.0", "--vocab-size", "60", "--max-tokens", "256",
    "--warmup-steps", "5", "--lr", "3e-3", "--seed", "5",
]  # fmt: skip
SECRET = "TOP-SECRET-LINE do not print me\n" * 50


# -- helpers ----------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a regular file's SHA-256, a link's target, a FIFO's kind."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            mode = os.lstat(path).st_mode
            key = str(path.relative_to(root))
            if stat.S_ISLNK(mode):
                found[key] = "link -> " + os.readlink(path)
            elif stat.S_ISDIR(mode):
                found[key] = "dir"
            elif stat.S_ISREG(mode):
                found[key] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                found[key] = f"special {stat.S_IFMT(mode)}"
    return found


def cli(*args: str) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def refused(result: Result, code: int, *parts: str) -> str:
    """The one-line message of a clean refusal with ``code`` that contains ``parts``."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    message = " ".join(result.stderr.split())
    assert message.startswith("error:"), result.stderr
    assert len(result.stderr.strip().splitlines()) <= 3  # one line (soft-wrapped at worst)
    for part in parts:
        assert part in message, message
    return message


def train(data: Path, out: Path, *extra: str) -> Result:
    return cli("train", "--data", data, "--out", out, *TINY, *extra)


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return digit_folder(tmp_path_factory.mktemp("hostile-data"), 31, train=200, validation=10)


@pytest.fixture(scope="module")
def template(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run: step-000002, step-000004, best/ and metrics.jsonl."""
    out = tmp_path_factory.mktemp("hostile-run") / "run"
    result = train(data, out, "--max-steps", "4", "--save-every", "2", "--eval-every", "2")
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def world(template: Path, tmp_path: Path) -> Path:
    """A workspace: a copy of the run, a folder of someone's files, a fake run, a checkpoint
    with a file changed by hand, and a file of secrets outside every run."""
    root = tmp_path / "w"
    shutil.copytree(template, root / "run", symlinks=True)
    (root / "foreign").mkdir()
    (root / "foreign" / "thesis.tex").write_text("years of work\n")
    fake = root / "fake"  # a `latest` file and a step folder, but no manifest: not a run
    (fake / "step-000001").mkdir(parents=True)
    (fake / LATEST).write_text("step-000001\n")
    (fake / "step-000001" / "model.safetensors").write_bytes(b"someone's weights")
    (fake / "metrics.jsonl").write_text("my own notes\n")
    (root / "secret.txt").write_text(SECRET)
    return root


# -- class 1: average never writes over a run or into a folder that is not one -----------------

S2, S4 = "{w}/run/step-000002", "{w}/run/step-000004"
AVERAGE_REFUSALS = [
    ("into-its-own-run", f"average {S2} {S4} --out {{w}}/run", 2, ["already holds a run"]),
    ("into-its-own-run-overwrite", f"average {S2} {S4} --out {{w}}/run --overwrite", 2,
     ["a checkpoint it is made from"]),
    ("into-a-step-folder", f"average {S2} {S4} --out {S4}", 2, ["is one checkpoint of a run"]),
    ("into-a-foreign-folder", f"average {S2} {S4} --out {{w}}/foreign", 2,
     ["not a tformer run"]),
    ("into-a-foreign-folder-overwrite", f"average {S2} {S4} --out {{w}}/foreign --overwrite", 2,
     ["--overwrite only replaces tformer runs"]),
    ("into-a-fake-run-overwrite", f"average {S2} {S4} --out {{w}}/fake --overwrite", 2,
     ["not a tformer run"]),
    ("into-a-file", f"average {S2} {S4} --out {{w}}/secret.txt", 2, ["exists and is a file"]),
]  # fmt: skip


@pytest.mark.parametrize(("command", "code", "parts"), [c[1:] for c in AVERAGE_REFUSALS],
                         ids=[c[0] for c in AVERAGE_REFUSALS])  # fmt: skip
def test_average_refuses_to_clobber_and_changes_nothing(
    world: Path, command: str, code: int, parts: list[str]
) -> None:
    before = snapshot(world)
    refused(cli(*command.format(w=world).split()), code, *parts)
    assert snapshot(world) == before


def test_average_into_a_new_folder_leaves_its_inputs_alone(world: Path) -> None:
    before = snapshot(world)
    result = cli("average", world / "run/step-000002", world / "run/step-000004",
                 "--out", world / "avg")  # fmt: skip
    assert result.exit_code == 0, result.output
    after = snapshot(world)
    assert {k: v for k, v in after.items() if not k.startswith("avg")} == before
    assert resolve(world / "avg").name == "step-000004"
    assert cli("train", "--resume", world / "run", "--max-steps", "5").exit_code == 0


def test_average_overwrite_replaces_only_what_tformer_wrote(world: Path, template: Path) -> None:
    other = world / "other"
    shutil.copytree(template, other)
    mine = {other / "notes.txt": "mine", other / "step-000004" / "mine.txt": "mine too"}
    for path, text in mine.items():
        path.write_text(text)
    result = cli("average", world / "run/step-000002", world / "run/step-000004",
                 "--out", other, "--overwrite")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert all(path.read_text() == text for path, text in mine.items())
    assert not (other / "step-000002").exists() and not (other / "best").exists()
    assert resolve(other).name == "step-000004"  # the average, in place of the old checkpoint


# -- class 1: --overwrite deletes only the files tformer wrote ---------------------------------


def test_overwrite_keeps_files_tformer_did_not_write(world: Path, data: Path) -> None:
    run = world / "run"
    best = resolve(run / "best")
    mine = {
        run / "notes.txt": "mine",
        run / "step-000002" / "mine.txt": "in a checkpoint",
        best / "mine.txt": "in the best checkpoint",
        run / "best" / "mine.txt": "beside it",
    }
    for path, text in mine.items():
        path.write_text(text)
    changed = run / "step-000004" / "trainer_state.json"  # listed, but changed by hand
    changed.write_text(changed.read_text().replace("{", "{ ", 1))
    changed_bytes = changed.read_bytes()
    result = train(data, run, "--max-steps", "3", "--save-every", "3", "--eval-every", "3",
                   "--overwrite")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert all(path.read_text() == text for path, text in mine.items())
    assert changed.read_bytes() == changed_bytes
    assert sorted(p.name for p in (run / "step-000002").iterdir()) == ["mine.txt"]
    assert sorted(p.name for p in (run / "step-000004").iterdir()) == ["trainer_state.json"]
    assert resolve(run).name == "step-000003"


OVERWRITE_REFUSALS = [
    ("fake-run", "train --data {d} --out {w}/fake --overwrite", 2, ["not a tformer run"]),
    ("fake-run-resume", "train --resume {w}/fake", 4, ["points at 'step-000001'"]),
    ("foreign", "train --data {d} --out {w}/foreign --overwrite", 2, ["not a tformer run"]),
]  # fmt: skip


@pytest.mark.parametrize(("command", "code", "parts"), [c[1:] for c in OVERWRITE_REFUSALS],
                         ids=[c[0] for c in OVERWRITE_REFUSALS])  # fmt: skip
def test_a_folder_with_a_latest_file_is_not_a_run(
    world: Path, data: Path, command: str, code: int, parts: list[str]
) -> None:
    before = snapshot(world)
    args = command.format(w=world, d=data).split()
    refused(cli(*args, *(TINY if "--data" in args else [])), code, *parts)
    assert snapshot(world) == before
    assert not is_run_dir(world / "fake")


# -- class 1: one writer per run -----------------------------------------------------------------

HOLD_LOCK = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from tformer.checkpoint import lock\n"
    "getattr(lock, sys.argv[1])(Path(sys.argv[2])).acquire()\n"
    "print('locked', flush=True)\n"
    "time.sleep(600)\n"
)


@contextmanager
def lock_held(kind: str, path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``tformer.checkpoint.lock.<kind>(path)`` while the block runs."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, kind, str(path)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def holder(world: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process that holds the lock of ``world/run``."""
    with lock_held("RunLock", world / "run") as proc:
        yield proc


LOCKED = [
    ("train-overwrite", "train --data {d} --out {w}/run --overwrite " + " ".join(TINY)),
    ("train-resume", "train --resume {w}/run --max-steps 6"),
    ("average-overwrite", "average {w}/avg-in/a {w}/avg-in/b --out {w}/run --overwrite"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("command", [c[1] for c in LOCKED], ids=[c[0] for c in LOCKED])
def test_a_second_writer_is_refused_naming_the_first(
    world: Path, data: Path, holder: subprocess.Popen[str], command: str
) -> None:
    (world / "avg-in").mkdir()
    for name, step in (("a", "step-000002"), ("b", "step-000004")):
        shutil.copytree(world / "run" / step, world / "avg-in" / name)
    before = snapshot(world)
    start = time.monotonic()
    refused(cli(*command.format(w=world, d=data).split()), 2, f"PID {holder.pid}",
            str(world / "run"))  # fmt: skip
    assert time.monotonic() - start < 30  # at once: before any data or model is loaded
    assert snapshot(world) == before


@pytest.mark.slow
def test_the_lock_of_a_killed_process_is_taken_over(
    world: Path, holder: subprocess.Popen[str]
) -> None:
    with pytest.raises(ConfigError, match=f"PID {holder.pid}"):
        RunLock(world / "run").acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (world / "run" / LOCK).read_text().strip() == str(holder.pid)  # left behind
    result = cli("train", "--resume", world / "run", "--max-steps", "6")
    assert result.exit_code == 0, result.output
    assert not (world / "run" / LOCK).exists()  # released on exit
    assert resolve(world / "run").name == "step-000006"


def test_a_lock_file_with_a_dead_pid_is_taken_over(world: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (world / "run" / LOCK).write_text(f"{dead.pid}\n")
    result = cli("train", "--resume", world / "run", "--max-steps", "6")
    assert result.exit_code == 0, result.output
    assert not (world / "run" / LOCK).exists()


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 180
    while not condition():
        assert proc.poll() is None, f"the trainer ended early (rc {proc.returncode})"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_two_real_trainers_on_one_out(world: Path, data: Path, tmp_path: Path) -> None:
    """A live trainer is named by PID; SIGTERM releases its lock; kill -9 leaves one to take."""
    run = world / "new"
    args = ["train", "--data", str(data), "--out", str(run), *TINY, "--max-steps", "400",
            "--save-every", "1"]  # fmt: skip
    env = {**os.environ, SLOW_SAVE_ENV: "0.5"}  # each save pauses: the trainer stays alive

    def start(command: list[str]) -> subprocess.Popen[bytes]:
        log = open(tmp_path / f"{command[-1]}-{time.monotonic()}.log", "wb")  # noqa: SIM115
        return subprocess.Popen([sys.executable, "-m", "tformer", *command], env=env,
                                stdout=log, stderr=log)  # fmt: skip

    first, second = start(args), None
    try:
        wait_until(lambda: (run / LOCK).is_file() and (run / LATEST).is_file(), first)
        refused(train(data, run, "--max-steps", "2", "--overwrite"), 2, f"PID {first.pid}")
        refused(cli("train", "--resume", run), 2, f"PID {first.pid}")
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 143
        assert not (run / LOCK).exists()
        second = start(["train", "--resume", str(run), "--max-steps", "400"])
        wait_until(lambda: _lock_pid(run) == second.pid, second)
        second.send_signal(signal.SIGKILL)
        second.wait()
        step = int(resolve(run).name.removeprefix("step-"))
        result = cli("train", "--resume", run, "--max-steps", step + 1)
        assert result.exit_code == 0, result.output  # the dead trainer's lock did not block
        assert not (run / LOCK).exists()
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait()


def _lock_pid(run: Path) -> int | None:
    try:
        text = (run / LOCK).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


# -- class 1: train-tokenizer --out -----------------------------------------------------------


def test_train_tokenizer_does_not_replace_a_file_without_overwrite(
    world: Path, data: Path
) -> None:
    target = world / "foreign" / "thesis.tex"
    before = snapshot(world)
    refused(cli("train-tokenizer", "--data", data, "--vocab-size", "60", "--out", target), 2,
            f"--out {target}: already exists", "--overwrite")  # fmt: skip
    assert snapshot(world) == before
    (world / "tok.target.json").write_text("mine")
    before = snapshot(world)
    refused(cli("train-tokenizer", "--data", data, "--vocab-size", "60", "--separate-vocab",
                "--out", world / "tok.json"), 2, "tok.target.json: already exists")  # fmt: skip
    assert snapshot(world) == before  # checked before training: not even tok.source.json
    result = cli("train-tokenizer", "--data", data, "--vocab-size", "60", "--out", target,
                 "--overwrite")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert '"model"' in target.read_text()


# -- class 2: no write replaces or follows what is not a regular file ------------------------


@pytest.fixture
def specials(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a link to a file outside, and a folder: targets no write may replace."""
    outside = tmp_path / "outside.txt"
    outside.write_text(SECRET)
    fifo, link, folder = tmp_path / "fifo", tmp_path / "link", tmp_path / "folder"
    os.mkfifo(fifo)
    link.symlink_to(outside)
    folder.mkdir()
    return {"a FIFO": fifo, "a symbolic link": link, "a folder": folder}


@pytest.mark.parametrize("kind", ["a FIFO", "a symbolic link", "a folder"])
def test_atomic_writes_refuse_targets_that_are_not_regular_files(
    tmp_path: Path, specials: dict[str, Path], kind: str
) -> None:
    target = specials[kind]
    tokenizer = train_tokenizer(["one two three"] * 10, vocab_size=30, min_frequency=1)
    before = snapshot(tmp_path)
    for write in (lambda: write_text_atomic(target, "x"), lambda: tokenizer.save(target)):
        with pytest.raises(CheckpointError) as info:
            write()
        assert str(info.value).startswith(f"{target}: exists and is {kind}")
    assert snapshot(tmp_path) == before  # no temporary left either


@pytest.mark.parametrize("kind", ["a FIFO", "a symbolic link"])
def test_train_tokenizer_never_replaces_a_fifo_or_a_link(
    tmp_path: Path, specials: dict[str, Path], data: Path, kind: str
) -> None:
    before = snapshot(tmp_path)
    result = cli("train-tokenizer", "--data", data, "--vocab-size", "60", "--overwrite",
                 "--out", specials[kind])  # fmt: skip
    refused(result, 2, f"--out {specials[kind]}: exists and is {kind}")
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_a_fifo_in_a_run_is_refused_not_waited_on(world: Path) -> None:
    metrics = world / "run" / "metrics.jsonl"
    metrics.unlink()
    os.mkfifo(metrics)
    result = subprocess.run(
        [sys.executable, "-m", "tformer", "train", "--resume", str(world / "run"),
         "--max-steps", "6"], capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 4, result.stderr
    assert f"{metrics}: exists and is a FIFO" in " ".join(result.stderr.split())
    assert stat.S_ISFIFO(os.lstat(metrics).st_mode)
    assert "Traceback" not in result.stderr


# -- class 2: messages quote no file, links lead nowhere outside the run ------------------------


def _link_latest_out(world: Path) -> None:
    (world / "run" / LATEST).unlink()
    (world / "run" / LATEST).symlink_to(world / "secret.txt")


def _junk_latest(world: Path) -> None:
    (world / "run" / LATEST).write_text("\x1b[31m" + SECRET)


def _link_step_out(world: Path) -> None:
    outside = world / "outside-step"
    shutil.move(world / "run" / "step-000004", outside)
    (world / "run" / "step-000004").symlink_to(outside)


ESCAPES = [
    ("latest-links-out", _link_latest_out, "a symbolic link out of the run folder"),
    ("latest-holds-junk", _junk_latest, "points at '\\x1b[31mTOP-SECRET"),
    ("step-links-out", _link_step_out, "a symbolic link out of the run folder"),
]
COMMANDS = ["generate {r} 1", "verify {r}", "train --resume {r} --max-steps 6",
            "evaluate {r} --data {d} --split validation --out {w}/eval"]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS, ids=[c.split()[0] for c in COMMANDS])
@pytest.mark.parametrize(("make", "part"), [c[1:] for c in ESCAPES], ids=[c[0] for c in ESCAPES])
def test_no_message_prints_a_file_and_no_link_leads_out_of_a_run(
    world: Path, data: Path, make: Callable[[Path], None], part: str, command: str
) -> None:
    make(world)
    before = snapshot(world)
    args = command.format(r=world / "run", w=world, d=data).split()
    result = cli(*args)
    assert result.exit_code in (2, 4), result.output
    message = refused(result, result.exit_code)
    assert message.count("TOP-SECRET") <= 2  # at most a 60-character excerpt of 1,650
    assert "\x1b" not in result.stderr and len(message) < 400
    if args[0] == "generate":
        assert part in message
    assert snapshot(world) == before


def test_excerpt_is_short_and_escaped() -> None:
    shown = excerpt("\x1b[2J" + "y" * 500 + "\n")
    assert "\x1b" not in shown and "\n" not in shown and len(shown) < 100
    assert excerpt("step-000001") == "'step-000001'"


# -- saving beside what --overwrite left; the lock within one process ---------------------------


def _save(run: Path, step: int) -> Path:
    from tests.checkpoint.test_checkpoint import _model_and_tokenizers
    from tformer.config import TrainConfig

    model, tokenizers = _model_and_tokenizers()
    return save_checkpoint(run, model=model, train_config=TrainConfig(), tokenizers=tokenizers,
                           step=step)  # fmt: skip


def test_a_save_goes_beside_files_overwrite_left(tmp_path: Path) -> None:
    run = tmp_path / "run"
    folder = _save(run, 1)
    (folder / "eval-test").mkdir()
    (folder / "eval-test" / "result.md").write_text("my evaluation")
    remove_run(run)
    assert [p.name for p in folder.iterdir()] == ["eval-test"]
    assert _save(run, 1) == folder
    assert (folder / "eval-test" / "result.md").read_text() == "my evaluation"
    assert load_checkpoint(run).step == 1
    remove_run(run)  # and again: only the checkpoint's own files go
    assert [p.name for p in folder.iterdir()] == ["eval-test"]


def test_a_save_never_replaces_a_file_it_did_not_write(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "step-000001").mkdir(parents=True)
    (run / "step-000001" / "model.safetensors").write_bytes(b"someone's weights")
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError, match="model.safetensors: not written by tformer"):
        _save(run, 1)
    assert snapshot(tmp_path) == before  # no temporary folder left either


def test_one_process_cannot_take_a_lock_twice_through_two_locks(tmp_path: Path) -> None:
    first = RunLock(tmp_path)
    with first:
        assert (tmp_path / LOCK).read_text().strip() == str(os.getpid())
        with pytest.raises(ConfigError, match=f"PID {os.getpid()}"):
            RunLock(tmp_path).acquire()
    assert not (tmp_path / LOCK).exists()
    with RunLock(tmp_path):  # released: free again
        pass


# -- forged checkpoints: non-finite weights, impossible positions and values (issue 36) ---------


def forge(step: Path, config: Callable[[dict], None] | None = None,
          state: Callable[[dict], None] | None = None, weight: float | None = None,
          record: bool = False) -> None:
    """Edit a checkpoint's config.json / trainer_state.json / one weight, and write its
    manifest again: a forgery the manifest cannot catch. With ``record``, the weights' own
    record of their configuration is rewritten to match the edited config.json too."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from tformer.checkpoint.files import write_manifest

    for name, edit in (("config.json", config), ("trainer_state.json", state)):
        if edit is not None:
            data = json.loads((step / name).read_text())
            edit(data)
            (step / name).write_text(json.dumps(data))
    if weight is not None or record:
        path = str(step / "model.safetensors")
        with safe_open(path, "pt") as handle:
            metadata = handle.metadata()
        tensors = load_file(path)
        if weight is not None:
            tensors[sorted(tensors)[0]].view(-1)[0] = weight
        if record:
            model = json.loads((step / "config.json").read_text())["model"]
            metadata["model"] = json.dumps(model, sort_keys=True)
        save_file(tensors, path, metadata=metadata)
    write_manifest(step)


def _position(key: str, value: object) -> Callable[[dict], None]:
    return lambda state: state["position"].__setitem__(key, value)


def _model(key: str, value: object) -> Callable[[dict], None]:
    return lambda config: config["model"].__setitem__(key, value)


def _train(key: str, value: object) -> Callable[[dict], None]:
    return lambda config: config["train"].__setitem__(key, value)


FORGED = [
    ("nan-weight", {"weight": float("nan")}, ["non-finite values (NaN or infinity) in"]),
    ("inf-weight", {"weight": float("-inf")}, ["non-finite values"]),
    ("n-heads-true", {"config": _model("n_heads", True)},
     ["config.json", "model.n_heads: true is a boolean, not a whole number"]),
    ("max-steps-fraction", {"config": _train("max_steps", 2.5)},
     ["train.max_steps: 2.5 is a fractional number"]),
    ("dropout-string", {"config": _model("dropout", "0.1")}, ["model.dropout: '0.1' is a string"]),
    ("data-list", {"config": _train("data", ["a"])}, ["train.data: ['a'] is a list"]),
    ("config-step-elsewhere", {"config": lambda c: c.__setitem__("step", 9)},
     ["step 9 contradicts the folder's name step-000004"]),
    ("config-step-huge", {"config": lambda c: c.__setitem__("step", 10**40)},
     ["is not a step number"]),
    ("max-len-huge", {"config": _model("max_len", 2**31 - 1)}, ["--max-len 2147483647 is over"]),
    ("data-empty", {"config": _train("data", "")}, ["train.data: an empty string"]),
    # config.json, the weights' record and the manifest forged together: shapes still disagree
    ("d-ff-consistent", {"config": _model("d_ff", 96), "record": True},
     ["config.json implies [96]"]),
    ("d-model-consistent", {"config": _model("d_model", 64), "record": True},
     ["config.json implies [60, 64]"]),
]  # fmt: skip
USERS = [
    ("generate", "generate {s} 1"),
    ("verify", "verify {s}"),
    ("average", "average {s} {w}/run/step-000002 --out {w}/avg"),
    ("init-from", "train --data {d} --out {w}/tuned --init-from {s} --max-steps 2"),
    ("resume", "train --resume {s} --max-steps 6"),
]


@pytest.mark.parametrize(("use", "command"), USERS, ids=[u[0] for u in USERS])
@pytest.mark.parametrize(("edits", "parts"), [c[1:] for c in FORGED], ids=[c[0] for c in FORGED])
def test_a_forged_checkpoint_is_refused_by_every_command_that_loads_it(
    world: Path, data: Path, edits: dict[str, object], parts: list[str], use: str, command: str
) -> None:
    step = world / "run" / "step-000004"
    forge(step, **edits)  # type: ignore[arg-type]
    before = snapshot(world)
    args = command.format(s=step, w=world, d=data).split()
    if use == "verify":  # verify lists every check it ran, the failed ones named
        result = cli(*args)
        assert result.exit_code == 4 and "Traceback" not in result.output
        assert parts[0] in " ".join(result.output.split())
    else:
        refused(cli(*args), 4, *parts)
    assert snapshot(world) == before  # nothing written: no average, no tuned run, no step


POSITIONS = [
    ("negative", "step", -5, "position.step -5 is not a count"),
    ("fraction", "step", 2.5, "position.step 2.5 is not a count"),
    ("string", "step", "4", "position.step '4' is not a count"),
    ("huge", "step", 10**30, "is not a count from 0 to 2,147,483,647"),
    ("another-step", "step", 99, "position.step 99 contradicts the folder's step 4"),
    ("boolean-tokens", "tokens", True, "position.tokens True is not a count"),
    ("negative-epoch", "epoch", -1, "position.epoch -1"),
    ("nan-elapsed", "elapsed", float("nan"), "position.elapsed nan is not a duration"),
    ("unknown-key", "rewind", 1, "unknown position key 'rewind'"),
]


@pytest.mark.parametrize(("key", "value", "message"), [p[1:] for p in POSITIONS],
                         ids=[p[0] for p in POSITIONS])  # fmt: skip
def test_an_impossible_trainer_position_is_refused_on_resume(
    world: Path, key: str, value: object, message: str
) -> None:
    step = world / "run" / "step-000004"
    forge(step, state=_position(key, value))
    before = snapshot(world)
    refused(cli("train", "--resume", step, "--max-steps", "6"), 4, "trainer_state.json", message)
    assert snapshot(world) == before


def _state(key: str, value: object) -> Callable[[dict], None]:
    return lambda state: state.__setitem__(key, value)


STATES = [
    ("best-value-string", _state("best", {"metric": "val_loss", "value": "x"}),
     "best.value 'x' is not a number or null"),
    ("window-loss-string", _state("window", {"loss": "x", "tokens": 1}), "window.loss 'x'"),
    ("skipped-negative", _state("skipped", -1), "skipped -1 is not a count from 0"),
    ("best-not-object", _state("best", 5), "'window' and 'best' must be objects"),
    ("rng-junk", _state("rng", {"python": "junk"}), "random states unusable"),
    ("rng-list", _state("rng", []), "random states unusable ('rng' is list"),
    ("deep-json", None, "training state unreadable (nested too deeply"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "message"), [c[1:] for c in STATES], ids=[c[0] for c in STATES])
def test_a_forged_trainer_state_is_refused_on_resume(
    world: Path, edit: Callable[[dict], None] | None, message: str
) -> None:
    step = world / "run" / "step-000004"
    if edit is None:  # nesting deeper than Python's JSON reader can follow
        (step / "trainer_state.json").write_text('{"position": ' + "[" * 100_000 + "]" * 100_000)
    forge(step, state=edit)
    before = snapshot(world)
    refused(cli("train", "--resume", step, "--max-steps", "6"), 4, "step-000004", message)
    assert snapshot(world) == before


@pytest.mark.parametrize("name", ["config.json", "manifest.json"])
def test_deeply_nested_json_in_a_checkpoint_is_one_line(world: Path, name: str) -> None:
    step = world / "run" / "step-000004"
    (step / name).write_text("[" * 100_000 + "]" * 100_000)
    if name != "manifest.json":
        forge(step)
    for command in (["generate", step, "1"], ["info", step], ["verify", step]):
        result = cli(*command)
        assert result.exit_code == 4 and "Traceback" not in result.output, result.output
        assert f"{name}: unreadable (nested too deeply" in " ".join(result.output.split())


def test_resume_names_nan_weights_and_an_earlier_checkpoint(world: Path) -> None:
    forge(world / "run" / "step-000004", weight=float("nan"))
    refused(cli("train", "--resume", world / "run", "--max-steps", "6"), 4,
            "non-finite values (NaN or infinity)", "--resume", "step-000002")  # fmt: skip


def test_an_average_that_overflows_is_refused_before_writing(world: Path) -> None:
    for step in ("step-000002", "step-000004"):
        forge(world / "run" / step, weight=3e38)  # finite, but twice that is not in float32
    before = snapshot(world)
    result = cli("average", world / "run/step-000002", world / "run/step-000004",
                 "--out", world / "avg")  # fmt: skip
    refused(result, 4, "the average of 2 checkpoints", "too large")
    assert snapshot(world) == before


# -- evaluate / score / align / ablate without --data: the data the checkpoint was trained on ---


ON_RECORDED_DATA = [
    ("evaluate", "evaluate {r} --split validation --limit 3 --max-new-tokens 4 --out {w}/ev"),
    ("score", "score {r} --split validation --limit 3"),
    ("align", "align {r} --split validation --limit 3"),
    ("ablate", "ablate {r} --split validation --limit 3 --top 1"),
]


@pytest.mark.parametrize("command", [c[1] for c in ON_RECORDED_DATA],
                         ids=[c[0] for c in ON_RECORDED_DATA])  # fmt: skip
def test_without_data_a_command_reads_the_data_the_checkpoint_was_trained_on(
    world: Path, data: Path, command: str
) -> None:
    result = cli(*command.format(r=world / "run", w=world).split())
    assert result.exit_code == 0, result.output
    assert f"no --data: reading {data}, the data" in " ".join(result.stderr.split())
    moved = data.with_name(data.name + "-moved")
    data.rename(moved)
    try:
        result = cli(*command.format(r=world / "run", w=world).split())
        refused(result, 3, f"was trained on --data {data}, which is not found here", "--data")
    finally:
        moved.rename(data)


def test_evaluate_cards_name_the_recorded_data_and_bundled_means_bundled(
    world: Path, data: Path
) -> None:
    import json

    run = world / "run"
    result = cli("evaluate", run, "--split", "validation", "--limit", "2", "--max-new-tokens",
                 "2", "--out", world / "ev")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads((world / "ev" / "result.json").read_text())["data"] == str(data)
    forge(run / "step-000004", config=_train("data", None))  # as trained on the bundled dates
    result = cli("evaluate", run, "--split", "test", "--limit", "2", "--max-new-tokens", "2",
                 "--out", world / "ev2")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "no --data" not in result.stderr
    assert json.loads((world / "ev2" / "result.json").read_text())["data"].startswith("bundled")


# -- files a user reads follow the umask --------------------------------------------------------


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*")}


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_weights_exports_and_averages_follow_the_umask(world: Path, mask: int) -> None:
    from tformer.export.folder import EXPORT

    before = os.umask(mask)
    try:
        result = cli("average", world / "run/step-000002", world / "run/step-000004",
                     "--out", world / "avg")  # fmt: skip
        assert result.exit_code == 0, result.output
        write_text_atomic(world / "notes.txt", "text\n")
        # what every export writes through
        with EXPORT.staging(world / "export", overwrite=False) as tmp:
            (tmp / "model.bin").write_bytes(b"weights")
            os.chmod(tmp / "model.bin", 0o600)  # as a library writing weights leaves them
    finally:
        os.umask(before)
    modes = {**_modes(world / "avg"), **_modes(world / "export"),
             "notes.txt": stat.S_IMODE((world / "notes.txt").stat().st_mode)}  # fmt: skip
    assert "step-000004/model.safetensors" in modes and "model.bin" in modes
    for name, mode in modes.items():
        folder = (world / "avg" / name).is_dir() or (world / "export" / name).is_dir()
        assert mode == (0o777 if folder else 0o666) & ~mask, (name, oct(mode))


def test_a_training_run_writes_its_weights_like_any_other_file(template: Path) -> None:
    step = template / "step-000004"
    assert {stat.S_IMODE((step / n).stat().st_mode) for n in os.listdir(step)} == {
        0o666 & ~_umask()
    }


def _umask() -> int:
    from tformer.paths import current_umask

    mask = os.umask(0o022)
    os.umask(mask)
    assert current_umask() == mask  # read without changing it
    return mask
