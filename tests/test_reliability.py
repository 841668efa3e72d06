"""Reliability: no pickle anywhere, numerical faults, out of memory, rewinding and replacing runs.

Exact resume after real kills is in test_resume.py; bad input in test_bad_input.py.
"""

from __future__ import annotations

import ast
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from tests.conftest import digit_folder, spoil_training_loss
from tformer.checkpoint.run_dir import LATEST, read_metrics, resolve, rewind_run
from tformer.checkpoint.store import load_checkpoint, save_checkpoint
from tformer.cli.commands import app

PACKAGE = Path(__file__).resolve().parents[1] / "tformer"
TINY = [
    "--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--d-ff", "64",
    "--max-len", "48", "--dropout", "0.1", "--vocab-size", "60", "--max-tokens", "256",
    "--warmup-steps", "5", "--lr", "3e-3", "--seed", "5",
]  # fmt: skip


@pytest.fixture(scope="module")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return digit_folder(tmp_path_factory.mktemp("reliability-data"), 21, train=200, validation=10)


def cli(*args: str) -> object:
    return CliRunner().invoke(app, list(args))


def train_run(data: Path, out: Path, *extra: str) -> object:
    return cli("train", "--data", str(data), "--out", str(out), *TINY, *extra)


# -- no pickle anywhere -----------------------------------------------------------------------

_PICKLE_MODULES = {"pickle", "_pickle", "cPickle", "dill", "joblib", "shelve", "marshal"}


def pickle_uses(source: str, filename: str = "<source>") -> list[str]:
    """Every place ``source`` could read or write a pickle: pickle-like modules, torch.load /
    torch.save, and numpy.load(..., allow_pickle=True)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where} import {a.name}" for a in node.names
                      if a.name.split(".")[0] in _PICKLE_MODULES]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[0] in _PICKLE_MODULES:
                found.append(f"{where} from {module} import ...")
            if module in ("torch", "torch.serialization") and any(
                a.name in ("load", "save") for a in node.names
            ):
                found.append(f"{where} from {module} import load/save")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner, attr = node.value.id, node.attr
            if owner in _PICKLE_MODULES or (owner == "torch" and attr in ("load", "save")):
                found.append(f"{where} {owner}.{attr}")
            if owner == "torch" and attr == "serialization":
                found.append(f"{where} torch.serialization")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if func.attr == "load" and isinstance(func.value, ast.Name) and func.value.id in (
                "np", "numpy"
            ):
                for keyword in node.keywords:
                    value = keyword.value
                    if keyword.arg == "allow_pickle" and not (
                        isinstance(value, ast.Constant) and value.value is False
                    ):
                        found.append(f"{where} numpy.load(allow_pickle=...)")
    return found


def test_the_scan_finds_pickle() -> None:
    planted = (
        "import pickle\nimport torch\nimport numpy as np\nfrom torch import load\n"
        "x = torch.load('a.pt')\ny = np.load('a.npy', allow_pickle=True)\n"
        "z = np.load('b.npy')\n"
    )
    assert len(pickle_uses(planted)) == 4  # np.load without allow_pickle is fine


def test_no_code_path_in_the_package_uses_pickle() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 10
    found = [use for path in files for use in pickle_uses(path.read_text(), str(path))]
    assert not found, "pickle is not allowed (safetensors for tensors, JSON for the rest):\n" + (
        "\n".join(found)
    )


def test_train_save_load_resume_generate_without_pickle(
    small_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def refuse(name: str) -> object:
        def forbidden(*args: object, **kwargs: object) -> None:
            calls.append(name)
            raise AssertionError(f"{name} was called")

        return forbidden

    for owner, name in ((torch, "load"), (torch, "save"), (pickle, "load"), (pickle, "loads"),
                        (np, "load")):
        monkeypatch.setattr(owner, name, refuse(f"{owner.__name__}.{name}"))
    out = tmp_path / "run"
    assert train_run(small_data, out, "--max-steps", "4", "--save-every", "2").exit_code == 0
    resumed = cli("train", "--resume", str(out), "--max-steps", "6")
    assert resumed.exit_code == 0, resumed.output
    generated = cli("generate", str(out), "3 1 4")
    assert generated.exit_code == 0, generated.output
    assert cli("verify", str(out), "--all").exit_code == 0
    assert load_checkpoint(out).step == 6
    assert not calls


# -- numerical faults and out of memory -------------------------------------------------------


def test_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(
    small_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spoil_training_loss(monkeypatch, {7}, float("nan"))
    out = tmp_path / "run"
    # fp32 stops at the first non-finite loss (mixed precision skips such a step: see
    # test_precision), so the run is pinned to fp32 on the CPU, also where a GPU is visible.
    result = train_run(small_data, out, "--max-steps", "20", "--save-every", "5",
                       "--log-every", "2", "--eval-every", "100", "--device", "cpu",
                       "--precision", "fp32")  # fmt: skip
    assert result.exit_code == 6, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert "step 7: training diverged (loss nan" in last
    assert "step-000005 is kept" in last and "--lr" in last
    assert "Traceback" not in result.output
    assert (out / LATEST).read_text().strip() == "step-000005"
    assert max(r["step"] for r in read_metrics(out)) == 6  # nothing logged from the bad step
    weights = load_checkpoint(out).model.state_dict()
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_out_of_memory_names_the_batch_size_and_the_flag(
    small_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tformer.model import Transformer

    real = Transformer.forward
    calls = {"n": 0}

    def forward(self: Transformer, *args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Transformer, "forward", forward)
    out = tmp_path / "run"
    result = train_run(small_data, out, "--max-steps", "10", "--save-every", "2",
                       "--eval-every", "100")
    assert result.exit_code == 5, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert "step 4: out of memory" in last
    assert "--max-tokens 256" in last and "lower --max-tokens" in last
    assert "step-000002 is kept" in last
    assert "Traceback" not in result.output


# -- resuming: flags, rewinding, older checkpoints ----------------------------------------------


def test_resume_logs_changed_flags_and_refuses_architecture_changes(
    small_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    assert train_run(small_data, out, "--max-steps", "4", "--save-every", "2").exit_code == 0
    result = cli("train", "--resume", str(out), "--max-steps", "6", "--clip-norm", "0.5")
    assert result.exit_code == 0, result.output
    assert "changed since" in result.stderr
    assert "--max-steps 4 -> 6" in result.stderr and "--clip-norm 1.0 -> 0.5" in result.stderr
    conflict = cli("train", "--resume", str(out), "--n-heads", "4")
    assert conflict.exit_code == 2 and "--n-heads 4 (saved: 2)" in conflict.stderr


def test_resume_from_an_older_checkpoint_replays_the_same_steps(
    small_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = ("--max-steps", "8", "--save-every", "4", "--keep-last", "3", "--log-every", "1")
    assert train_run(small_data, out, *args).exit_code == 0
    original = load_checkpoint(out / "step-000008").model.state_dict()
    losses = [r for r in read_metrics(out) if "loss" in r]
    result = cli("train", "--resume", str(out / "step-000004"))
    assert result.exit_code == 0, result.output
    assert (out / LATEST).read_text().strip() == "step-000008"
    replayed = load_checkpoint(out).model.state_dict()
    assert all(torch.equal(original[k], replayed[k]) for k in original)
    again = [r for r in read_metrics(out) if "loss" in r]
    assert [(r["step"], r["loss"]) for r in again] == [(r["step"], r["loss"]) for r in losses]


def test_rewind_drops_what_came_after_the_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    records = [{"step": s, "loss": 1.0 / s} for s in range(1, 9)]
    text = "".join(json.dumps(r) + "\n" for r in records) + '{"step": 9, "lo'  # torn by a kill
    (run / "metrics.jsonl").write_text(text)
    for name in ("step-000004", "step-000008", ".step-000012.abc", "best/step-000008"):
        (run / name).mkdir(parents=True)
    (run / "best" / LATEST).write_text("step-000008\n")
    (run / LATEST).write_text("step-000004\n")
    rewind_run(run, 4)
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]
    assert sorted(p.name for p in run.iterdir()) == ["latest", "metrics.jsonl", "step-000004"]


def test_overwrite_replaces_only_what_tformer_wrote(small_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert train_run(small_data, out, "--max-steps", "2").exit_code == 0
    (out / "notes.txt").write_text("mine")
    refused = train_run(small_data, out, "--max-steps", "2")
    assert refused.exit_code == 2 and "--overwrite" in refused.stderr
    again = train_run(small_data, out, "--max-steps", "3", "--overwrite")
    assert again.exit_code == 0, again.output
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.glob("step-*")) == ["step-000003"]
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [3]


def test_a_damaged_latest_checkpoint_points_to_an_older_one(
    small_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    assert train_run(small_data, out, "--max-steps", "4", "--save-every", "2").exit_code == 0
    weights = resolve(out) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    result = cli("train", "--resume", str(out), "--max-steps", "6")
    assert result.exit_code == 4
    assert "truncated" in result.stderr
    assert f"--resume {out / 'step-000002'}" in result.stderr


def test_a_best_checkpoint_cannot_be_resumed_but_can_be_used(
    small_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    assert train_run(small_data, out, "--max-steps", "4", "--eval-every", "2").exit_code == 0
    best = resolve(out / "best")
    assert cli("generate", str(out / "best"), "1 2").exit_code == 0
    copy = tmp_path / "copy"
    shutil.copytree(out / "best", copy)
    result = cli("train", "--resume", str(copy))
    assert result.exit_code == 4 and "holds no training state" in result.stderr
    assert best.is_dir()


def test_save_checkpoint_keeps_numeric_order(tmp_path: Path) -> None:
    from tests.checkpoint.test_checkpoint import _model_and_tokenizers
    from tformer.config import TrainConfig

    model, toks = _model_and_tokenizers()
    for step in (999_999, 1_000_000, 1_000_001):  # names grow a digit past step 999999
        save_checkpoint(tmp_path, model=model, train_config=TrainConfig(), tokenizers=toks,
                        step=step, keep_last=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-1000000", "step-1000001"]
