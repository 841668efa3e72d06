"""Rules that several commands share, each run against every command that has it, so a new
command without the rule fails a test:

- every command that writes an output folder (import, export, prepare, train, average, shrink,
  filter, distill): one lock against a concurrent writer of that folder, `--overwrite`
  replacing only what the same command wrote, and files and folders that follow the umask;
- every command that reads a split when `--data` is not given (evaluate, score, ablate,
  align, distill): the data the checkpoint records, and for an import (which records none) a
  refusal.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from tests.conftest import digit_pairs, write_jsonl  # noqa: E402
from tests.test_hostile_files import TINY, cli, lock_held, refused, snapshot  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX locks and modes")

Args = Callable[[Path, Path], list[object]]
# Each writer's command line, given the sources folder and OUT.
WRITERS: dict[str, Args] = {
    "import": lambda s, out: ["import", s / "hf", out],
    "export": lambda s, out: ["export", s / "run", out, "--to", "huggingface"],
    "prepare": lambda s, out: ["prepare", "--data", s / "data", "--out", out,
                               "--vocab-size", "60"],
    "train": lambda s, out: ["train", "--data", s / "data", "--out", out, *TINY,
                             "--max-steps", "2"],
    "average": lambda s, out: [
        "average", s / "run" / "step-000002", s / "run" / "step-000004", "--out", out,
    ],
    "shrink": lambda s, out: ["shrink", s / "run", "--out", out, "--n-decoder-layers", "1"],
    "filter": lambda s, out: ["filter", s / "run", "--data", s / "data", "--out", out,
                              "--keep", "0.9"],
    "distill": lambda s, out: ["distill", s / "run", "--data", s / "data", "--out", out,
                               "--beam-size", "1", "--max-new-tokens", "4"],
}  # fmt: skip
# The folder among the sources that each writer wrote (train and average both write runs).
WRITTEN_BY = {
    "import": "imported",
    "export": "hf",
    "prepare": "prepared",
    "train": "run",
    "average": "averaged",
    "shrink": "shrunk",
    "filter": "filtered",
    "distill": "distilled",
}
# train, average and shrink all write runs: each may replace the others'.
RUNS = {"run", "averaged", "shrunk"}
REPLACES = {**{w: {f} for w, f in WRITTEN_BY.items()}, "train": RUNS, "average": RUNS,
            "shrink": RUNS}  # fmt: skip
# Folders no writer may replace but its own kind's: the others' outputs, one checkpoint of a
# run, and a user's folder.
FOLDERS = [*WRITTEN_BY.values(), "run/step-000004", "mine"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One output of every writer, each made by the real CLI."""
    root = tmp_path_factory.mktemp("writers")
    write_jsonl(root / "data" / "train.jsonl", digit_pairs(200, seed=41))
    write_jsonl(root / "data" / "validation.jsonl", digit_pairs(10, seed=42))
    for name, kind in (("run", "train"), ("hf", "export"), ("imported", "import"),
                       ("prepared", "prepare"), ("averaged", "average"),
                       ("shrunk", "shrink"), ("filtered", "filter"),
                       ("distilled", "distill")):  # fmt: skip
        extra = ["--save-every", "2", "--max-steps", "4"] if kind == "train" else []
        result = cli(*WRITERS[kind](root, root / name), *extra)
        assert result.exit_code == 0, result.output
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("years of work\n")
    return root


@pytest.fixture
def world(sources: Path, tmp_path: Path) -> Path:
    root = tmp_path / "w"
    shutil.copytree(sources, root, symlinks=True)
    return root


@pytest.fixture
def holder(world: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process writing ``world/out`` (it holds the folder's writer lock)."""
    with lock_held("writer_lock", world / "out") as proc:
        yield proc


@pytest.mark.parametrize("writer", WRITERS)
def test_a_writer_is_refused_while_another_writes_its_folder(
    world: Path, holder: subprocess.Popen[str], writer: str
) -> None:
    before = snapshot(world)
    refused(cli(*WRITERS[writer](world, world / "out")), 2, f"PID {holder.pid}",
            str(world / "out"))  # fmt: skip
    assert snapshot(world) == before  # OUT not made, nothing else touched


@pytest.mark.parametrize(
    ("writer", "folder"),
    [(w, f) for w in WRITERS for f in FOLDERS if f not in REPLACES[w]],
)
def test_overwrite_replaces_only_what_the_same_command_wrote(
    world: Path, writer: str, folder: str
) -> None:
    before = snapshot(world)
    result = cli(*WRITERS[writer](world, world / folder), "--overwrite")
    refused(result, 2, str(world / folder))
    assert snapshot(world) == before


@pytest.mark.parametrize(
    "writer", ["import", "export", "prepare", "average", "shrink", "filter", "distill"]
)
def test_overwrite_replaces_an_earlier_output_of_the_same_command(
    world: Path, writer: str
) -> None:
    out = world / WRITTEN_BY[writer]
    before = snapshot(world)
    result = cli(*WRITERS[writer](world, out), "--overwrite")
    assert result.exit_code == 0, result.output
    outside = {k: v for k, v in snapshot(world).items() if not k.startswith(out.name)}
    assert outside == {k: v for k, v in before.items() if not k.startswith(out.name)}


def test_an_import_over_a_run_checkpoint_is_refused_and_the_run_resumes(world: Path) -> None:
    """The reported loss: `import HF RUN/step-000004 --overwrite` replaced a run's checkpoint
    (its optimizer and trainer state went, and --resume then refused the run)."""
    step = world / "run" / "step-000004"
    message = refused(cli("import", world / "hf", step, "--overwrite"), 2, str(step))
    assert "not written by `tformer import`" in message
    resumed = cli("train", "--resume", world / "run", "--max-steps", "5")
    assert resumed.exit_code == 0, resumed.output


def test_two_imports_into_one_new_folder_at_once_cannot_both_succeed(world: Path) -> None:
    """Two real processes import into one new OUT at the same moment: one writes it, the other
    is refused (by the lock, or by finding OUT written), never silently replacing it."""
    out = world / "both"
    command = [sys.executable, "-m", "tformer", "import", str(world / "hf"), str(out)]
    procs = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    codes = sorted(proc.wait(timeout=300) for proc in procs)
    errors = [proc.stderr.read() if proc.stderr else "" for proc in procs]
    assert codes == [0, 2], errors
    assert any("is writing this folder now" in e or "not empty" in e for e in errors), errors
    verified = cli("verify", out)
    assert verified.exit_code == 0, verified.output


def _modes(folder: Path) -> set[tuple[str, int]]:
    """(kind, permission bits) of ``folder`` and everything below it."""
    found = {("dir", stat.S_IMODE(folder.stat().st_mode))}
    for path in folder.rglob("*"):
        kind = "dir" if path.is_dir() else "file"
        found.add((kind, stat.S_IMODE(path.stat().st_mode)))
    return found


@pytest.mark.parametrize("umask", [0o022, 0o077])
@pytest.mark.parametrize("writer", WRITERS)
def test_every_writer_follows_the_umask(world: Path, writer: str, umask: int) -> None:
    old = os.umask(umask)
    try:
        result = cli(*WRITERS[writer](world, world / "out"))
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert _modes(world / "out") <= {("dir", 0o777 & ~umask), ("file", 0o666 & ~umask)}


# -- which data a checkpoint goes with --------------------------------------------------------

READERS = {
    "evaluate": ["evaluate", "{c}"],
    "score": ["score", "{c}", "--split", "test"],
    "ablate": ["ablate", "{c}"],
    "align": ["align", "{c}"],
    "distill": ["distill", "{c}", "--out", "{c}-distilled"],
}


@pytest.mark.parametrize("command", READERS)
def test_an_import_without_data_is_refused_by_every_command_that_reads_a_split(
    world: Path, command: str
) -> None:
    """An import records no training data: it is never scored on the bundled data."""
    before = snapshot(world)
    args = [a.format(c=world / "imported") for a in READERS[command]]
    refused(cli(*args), 3, str(world / "imported"), "imported model", "--data")
    assert snapshot(world) == before  # no eval-* written into the import


def test_paired_text_without_languages_names_the_flags(world: Path) -> None:
    folder = world / "m30k"
    folder.mkdir()
    for lang, text in (("en", "a dog runs\n"), ("de", "ein hund rennt\n")):
        (folder / f"train.{lang}").write_text(text * 20)
    before = snapshot(world)
    message = refused(cli("train", "--data", folder, "--out", world / "out", *TINY), 3)
    assert "train.de, train.en" in message and "--src-lang de --tgt-lang en" in message
    assert snapshot(world) == before
