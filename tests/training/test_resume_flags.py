"""`tformer train --resume` with settings that would change the architecture or tokenizer.

Every setting that contradicts the saved run is refused, all of them named in one line (exit 2),
before anything is loaded or written; settings that agree with it are accepted.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tformer.cli.commands import app

runner = CliRunner()
# How the run was made: the command line a user would give again when resuming.
ARCH = ["--preset", "tiny", "--n-layers", "1", "--d-ff", "64", "--max-len", "48",
        "--vocab-size", "60", "--tokenizer-kind", "bpe"]  # fmt: skip
LOOP = ["--log-every", "2", "--eval-every", "4", "--save-every", "4", "--warmup-steps", "2",
        "--no-cache"]  # fmt: skip


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def saved_run(toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("resume-flags") / "run"
    result = runner.invoke(
        app, ["train", "--data", str(toy_data), "--out", str(out), "--max-steps", "4",
              *ARCH, *LOOP]  # fmt: skip
    )
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def run(saved_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(saved_run, copy)
    return copy


def refused(run: Path, *args: str) -> str:
    before = snapshot(run.parent)
    result = runner.invoke(app, ["train", "--resume", str(run), *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert snapshot(run.parent) == before
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--preset", "small"], "--preset small (d_model 256 (saved: 64)"),
        (["--vocab-size", "300"], "--vocab-size 300 (saved: 60)"),
        (["--tokenizer-kind", "unigram"], "--tokenizer-kind 'unigram' (saved: 'bpe')"),
        (["--separate-vocab"], "--separate-vocab (saved: one shared vocabulary)"),
        (["--max-len", "64"], "--max-len 64 (saved: 48)"),
        (["--n-layers", "2"], "--n-layers 2 (saved: 1 / 1)"),
        (["--n-heads", "2"], "--n-heads 2 (saved: 4)"),
        (["--recipe", "dates"], "--recipe dates (d_model 128 (saved: 64)"),
    ],
)
def test_each_contradicting_setting_is_refused(run: Path, args: list[str], named: str) -> None:
    line = refused(run, *args)
    assert named in line and "conflicts with the architecture" in line


def test_every_contradicting_setting_is_named_at_once(run: Path, tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model": {"dropout": 0.3}, "tokenizer": {"vocab_size": 70}}))
    line = refused(run, "--preset", "small", "--vocab-size", "300", "--n-heads", "2",
                   "--separate-vocab", "--config", str(config))  # fmt: skip
    for part in ("--n-heads 2 (saved: 4)", "--preset small (", "--vocab-size 300",
                 "--separate-vocab",
                 f"--config {config}: model.dropout 0.3 (saved: 0.1)"):  # fmt: skip
        assert part in line, (part, line)
    # The flag wins over the file's tokenizer.vocab_size, as in a new run: one is named.
    assert "tokenizer.vocab_size" not in line


def _resume(run: Path, *args: str) -> Any:
    return runner.invoke(app, ["train", "--resume", str(run), "--max-steps", "6", *args])


def test_the_command_line_that_made_the_run_resumes_it(run: Path) -> None:
    result = _resume(run, *ARCH)
    assert result.exit_code == 0, result.output
    assert (run / "latest").read_text().strip() == "step-000006"


def test_a_file_of_the_saved_settings_resumes_it(run: Path, tmp_path: Path) -> None:
    config = tmp_path / "same.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"d_model": 64, "n_heads": 4, "max_len": 48},
        "tokenizer": {"kind": "bpe", "vocab_size": 60, "shared": True},
    }))  # fmt: skip
    result = _resume(run, "--config", str(config))
    assert result.exit_code == 0, result.output


def test_a_run_saved_without_the_tokenizer_record_compares_what_its_files_tell(
    run: Path,
) -> None:
    import json

    from tformer.checkpoint.files import write_manifest

    folder = run / (run / "latest").read_text().strip()
    config = json.loads((folder / "config.json").read_text())
    assert config["tokenizer"]["requested"] == {"kind": "bpe", "vocab_size": 60, "shared": True}
    del config["tokenizer"]["requested"]
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    write_manifest(folder)
    size = config["tokenizer"]["vocab_size"]["source"]
    # The size asked for is unknown: only fewer tokens than the tokenizer has contradicts it.
    assert f"--vocab-size 20 (saved: {size} tokens)" in refused(run, "--vocab-size", "20")
    assert "--tokenizer-kind 'wordpiece'" in refused(run, "--tokenizer-kind", "wordpiece")
    result = _resume(run, "--vocab-size", "300")
    assert result.exit_code == 0, result.output
