"""The weights against config.json: an edited config, changed dtypes, tensors that do not fit.

Each case tampers with a real saved checkpoint, then runs the real CLI: ``tformer verify`` must
fail (exit 4) naming what is wrong on one line, and loading (``tformer info``) must refuse it
with exit 4, leaving every file as it was.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner, Result

from tests.checkpoint.test_checkpoint import _resumable
from tformer.checkpoint import CONFIG, MANIFEST, WEIGHTS, load_checkpoint, verify_checkpoint
from tformer.checkpoint.files import write_manifest
from tformer.cli.commands import app
from tformer.training.run import TrainResult


def cli(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def snapshot(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def refused(folder: Path, *parts: str) -> str:
    """``verify`` and ``info`` both refuse ``folder`` with exit 4 and one line; no file changes."""
    before = snapshot(folder)
    for command in ("verify", "info"):
        result = cli(command, str(folder))
        assert result.exit_code == 4, (command, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.output, result.output
        for part in parts:
            assert part in lines[0], (command, lines[0])
    assert snapshot(folder) == before
    return lines[0]


def edit_config(folder: Path, **model: object) -> None:
    config = json.loads((folder / CONFIG).read_text())
    config["model"].update(model)
    (folder / CONFIG).write_text(json.dumps(config, indent=2))


def rewrite_weights(folder: Path, tensors: dict[str, torch.Tensor], **metadata: str) -> None:
    save_file(tensors, str(folder / WEIGHTS), metadata=metadata or None)
    write_manifest(folder)


def test_the_weights_record_the_model_configuration(tmp_path: Path) -> None:
    folder = _resumable(tmp_path)
    with safe_open(str(folder / WEIGHTS), framework="pt") as handle:
        recorded = json.loads(handle.metadata()["model"])
    assert recorded == json.loads((folder / CONFIG).read_text())["model"]
    assert cli("verify", str(folder)).exit_code == 0
    _, checks = verify_checkpoint(folder)
    row = next(c for c in checks if c.name == "architecture")
    assert row.ok and "configuration the weights were saved with" in row.detail


def test_an_edited_config_alone_fails_its_hash(tmp_path: Path) -> None:
    folder = _resumable(tmp_path)
    edit_config(folder, n_heads=4)
    line = refused(folder, "config.json")
    assert "manifest.json" in line


@pytest.mark.parametrize(
    ("field", "value", "saved"),
    [("n_heads", 4, "2"), ("n_heads", 1, "2"), ("activation", "gelu", "'relu'"),
     ("norm", "pre", "'post'"), ("tie_embeddings", False, "True")],
)
def test_an_edited_config_with_a_rewritten_manifest_is_caught(
    tmp_path: Path, field: str, value: object, saved: str
) -> None:
    # Shapes alone cannot tell: none of these fields changes a tensor's shape (or it changes
    # which names are stored); the weights' own record of their configuration does.
    folder = _resumable(tmp_path)
    edit_config(folder, **{field: value})
    write_manifest(folder)
    shown = repr(value) if isinstance(value, str) else str(value)
    refused(folder, f"says {field} {shown}, the weights were saved with {saved}")


def test_several_edited_fields_are_all_named(tmp_path: Path) -> None:
    folder = _resumable(tmp_path)
    edit_config(folder, n_heads=4, activation="gelu")
    write_manifest(folder)
    refused(folder, "activation 'gelu'", "n_heads 4")


def test_heads_that_do_not_divide_the_width_are_refused(tmp_path: Path) -> None:
    folder = _resumable(tmp_path)
    edit_config(folder, n_heads=3)
    write_manifest(folder)
    refused(folder, "--n-heads 3 must divide --d-model 16")


def test_a_config_whose_shapes_differ_names_the_tensors_on_one_short_line(
    tmp_path: Path,
) -> None:
    folder = _resumable(tmp_path)
    edit_config(folder, d_ff=64)
    write_manifest(folder)
    _, checks = verify_checkpoint(folder)
    header = next(c for c in checks if c.name == f"{WEIGHTS} header")
    assert not header.ok
    assert "shape differs for 'decoder.layers.0.feed_forward.w1.bias'" in header.detail
    assert "[32]" in header.detail and "[64]" in header.detail and "more" in header.detail
    assert "says d_ff 64, the weights were saved with 32" in refused(folder, "d_ff")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int8, torch.float64])
def test_a_tensor_of_another_dtype_is_refused(tmp_path: Path, dtype: torch.dtype) -> None:
    folder = _resumable(tmp_path)
    tensors = load_file(folder / WEIGHTS)
    name = "encoder.layers.0.feed_forward.w1.weight"
    tensors[name] = tensors[name].to(dtype)
    with safe_open(str(folder / WEIGHTS), framework="pt") as handle:
        metadata = handle.metadata()
    rewrite_weights(folder, tensors, **metadata)
    refused(folder, name, "F32")


def test_missing_and_unexpected_tensors_are_named_and_cut(tmp_path: Path) -> None:
    folder = _resumable(tmp_path)
    tensors = load_file(folder / WEIGHTS)
    del tensors["encoder.layers.0.norm1.weight"]
    for i in range(3000):  # a hostile file with thousands of names
        tensors[f"junk.{i}.{'x' * 50}"] = torch.zeros(1)
    rewrite_weights(folder, tensors)
    _, checks = verify_checkpoint(folder)
    detail = next(c for c in checks if c.name == f"{WEIGHTS} header").detail
    assert "missing 'encoder.layers.0.norm1.weight'" in detail
    assert "unexpected 'junk.0." in detail and "2,997 more" in detail
    assert len(detail) < 600
    line = refused(folder, "model.safetensors")
    assert len(line) < 800


def test_an_old_checkpoint_without_the_record_still_verifies_and_loads(tmp_path: Path) -> None:
    folder = _resumable(tmp_path)
    rewrite_weights(folder, load_file(folder / WEIGHTS), format="tformer-checkpoint")
    result = cli("verify", str(folder))
    assert result.exit_code == 0, result.output
    _, checks = verify_checkpoint(folder)
    row = next(c for c in checks if c.name == "architecture")
    assert row.ok and "not recorded in model.safetensors" in row.detail
    load_checkpoint(folder)
    assert cli("info", str(folder)).exit_code == 0


def test_a_record_that_is_not_json_is_refused(tmp_path: Path) -> None:
    folder = _resumable(tmp_path)
    rewrite_weights(folder, load_file(folder / WEIGHTS), model="{not json")
    refused(folder, "model configuration in its header is not JSON")
    assert (folder / MANIFEST).is_file()


# -- verify --all and folders tformer did not write ---------------------------------------------


def test_verify_all_skips_a_step_folder_holding_only_a_users_files(tmp_path: Path) -> None:
    folder = _resumable(tmp_path)
    run = folder.parent
    mine = run / "step-000009"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    before = snapshot(mine)
    result = cli("verify", "--all", str(run))
    assert result.exit_code == 0, result.output
    assert "skipped" in result.stdout and "not a tformer checkpoint" in result.stdout
    assert result.stdout.count("skipped") == 1
    assert snapshot(mine) == before
    # A checkpoint of tformer whose manifest is gone is damaged, not someone else's folder.
    (mine / CONFIG).write_bytes((folder / CONFIG).read_bytes())
    result = cli("verify", "--all", str(run))
    assert result.exit_code == 4 and "manifest.json: missing" in result.stderr


def test_verify_all_on_a_run_of_only_foreign_step_folders_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run" / "step-000001").mkdir(parents=True)
    (tmp_path / "run" / "step-000001" / "x.bin").write_bytes(b"\0")
    result = cli("verify", "--all", str(tmp_path / "run"))
    assert result.exit_code == 4 and "holds no tformer checkpoint" in result.stderr


def test_verify_all_on_a_trained_run_checks_best_and_skips_only_the_users_folder(
    trained: TrainResult, tmp_path: Path
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained.run_dir, run)
    (run / "step-999999").mkdir()
    (run / "step-999999" / "notes.txt").write_text("mine")
    result = cli("verify", "--all", str(run))
    assert result.exit_code == 0, result.output
    assert result.stdout.count("skipped") == 1
    assert "best" in result.stdout
