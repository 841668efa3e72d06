"""The run fingerprints its training data; `--resume` on changed data is refused, naming it.

Real runs through the CLI on real files: a change to the train or validation split is refused
(exit 3) naming the split and file, before anything is written; `--allow-data-change` trains
on and says so; checkpoints saved before fingerprints resume as they did.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.conftest import digit_pairs, write_jsonl
from tformer.checkpoint.files import TRAINER_STATE, write_manifest
from tformer.cli.commands import app
from tformer.data.fingerprint import changes, pairs_sha256

runner = CliRunner()
TINY = ["--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--d-ff", "64", "--max-len",
        "48", "--vocab-size", "60", "--log-every", "2", "--eval-every", "4", "--save-every", "4",
        "--warmup-steps", "2", "--no-cache"]  # fmt: skip


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fingerprint")
    data = root / "data"
    write_jsonl(data / "train.jsonl", digit_pairs(400, seed=1))
    write_jsonl(data / "validation.jsonl", digit_pairs(20, seed=2))
    write_jsonl(data / "test.jsonl", digit_pairs(20, seed=3))
    result = runner.invoke(app, ["train", "--data", str(data), "--out", str(root / "run"),
                                 "--max-steps", "4", *TINY])  # fmt: skip
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture
def world(saved: Path, tmp_path: Path) -> Path:
    shutil.copytree(saved, tmp_path / "w")
    return tmp_path / "w"


def resume(world: Path, *args: str) -> Any:
    return runner.invoke(app, ["train", "--resume", str(world / "run"), "--data",
                               str(world / "data"), "--max-steps", "6", *args])  # fmt: skip


def refused(world: Path, *parts: str) -> str:
    before = snapshot(world / "run")
    result = resume(world)
    assert result.exit_code == 3, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for part in parts:
        assert part in lines[0], (part, lines[0])
    assert snapshot(world / "run") == before
    return lines[0]


def _latest(world: Path) -> Path:
    run = world / "run"
    return run / (run / "latest").read_text().strip()


def test_each_checkpoint_records_the_data(world: Path) -> None:
    state = json.loads((_latest(world) / TRAINER_STATE).read_text())
    train = state["data"]["splits"]["train"]
    size = (world / "data" / "train.jsonl").stat().st_size
    assert train["files"] == [{"name": "train.jsonl", "size": size}]
    assert train["pairs"] == 400 and len(train["sha256"]) == 64
    assert set(state["data"]["splits"]) == {"train", "validation"}


def test_the_same_data_resumes(world: Path) -> None:
    result = resume(world)
    assert result.exit_code == 0, result.output
    assert "data changed" not in result.output


def test_changed_training_pairs_are_refused(world: Path) -> None:
    path = world / "data" / "train.jsonl"
    path.write_text(path.read_text().replace("three", "thrEE", 1))  # same size, other text
    refused(world, "the train split ('train.jsonl'", "other text of the same size",
            "--allow-data-change")  # fmt: skip


def test_a_changed_or_removed_validation_split_is_refused(world: Path) -> None:
    write_jsonl(world / "data" / "validation.jsonl", digit_pairs(25, seed=9))
    refused(world, "the validation split ('validation.jsonl'", "20 pairs ->", "25 pairs")
    (world / "data" / "validation.jsonl").unlink()
    refused(world, "the validation split was removed")


def test_the_test_split_is_not_part_of_training(world: Path) -> None:
    write_jsonl(world / "data" / "test.jsonl", digit_pairs(30, seed=9))
    assert resume(world).exit_code == 0


def test_allow_data_change_trains_on_and_says_so(world: Path) -> None:
    write_jsonl(world / "data" / "train.jsonl", digit_pairs(500, seed=5))
    result = resume(world, "--allow-data-change")
    assert result.exit_code == 0, result.output
    assert "training data changed" in result.output and "400 pairs -> " in result.output
    state = json.loads((_latest(world) / TRAINER_STATE).read_text())
    assert state["data"]["splits"]["train"]["pairs"] == 500  # the new data from now on


def test_a_checkpoint_without_a_fingerprint_resumes_as_before(world: Path) -> None:
    folder = _latest(world)
    state = json.loads((folder / TRAINER_STATE).read_text())
    del state["data"]
    (folder / TRAINER_STATE).write_text(json.dumps(state) + "\n")
    write_manifest(folder)
    write_jsonl(world / "data" / "train.jsonl", digit_pairs(500, seed=5))
    result = resume(world)
    assert result.exit_code == 0, result.output


def test_the_hash_tells_pairs_apart() -> None:
    assert pairs_sha256([("ab", "c")]) != pairs_sha256([("a", "bc")])
    assert pairs_sha256([("a", "b"), ("c", "d")]) != pairs_sha256([("a", "bc"), ("", "d")])
    now = {"splits": {"train": {"files": [], "pairs": 1, "sha256": "0" * 64}}}
    assert changes(now, now) == []
    assert changes({"splits": "junk"}, now) == ["the train split was added"]
