"""``tformer inspect-attention`` end to end on the tiny trained model: views, files, errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.conftest import refusal_lines
from tformer.analysis.attention_files import load_attention
from tformer.cli.commands import app
from tformer.training.run import TrainResult

runner = CliRunner()


@pytest.fixture(scope="module")
def run(trained: TrainResult) -> str:
    return str(trained.run_dir)


def inspect(*args: str) -> object:
    return runner.invoke(app, ["inspect-attention", *args], catch_exceptions=False)


def test_stats_table_has_a_line_per_layer_and_head(run: str) -> None:
    result = inspect(run, "3 1 4", "--kind", "encoder", "--stats")
    assert result.exit_code == 0, result.output
    assert "encoder attention heads" in result.stdout and "pattern" in result.stdout
    rows = [line for line in result.stdout.splitlines() if re.match(r"\s+0\s+\d\s+\d", line)]
    assert len(rows) == 4  # 1 layer x 4 heads
    patterns = ("diagonal", "previous-token", "first-token", "eos", "broad", "focused", "mixed")
    assert all(line.split()[-1] in patterns for line in rows)


def test_layer_all_gives_the_overview(run: str) -> None:
    result = inspect(run, "3 1 4", "--layer", "all", "--head", "all", "--kind", "decoder")
    assert result.exit_code == 0, result.output
    assert "decoder attention · layer all · head all" in result.stdout
    assert "layer 0" in result.stdout and "h3" in result.stdout


def test_negative_numbers_count_from_the_end(run: str) -> None:
    result = inspect(run, "3 1 4", "--layer", "-1", "--head", "-1", "--target", "three one")
    assert result.exit_code == 0, result.output
    assert "cross attention · layer 0 · head 3" in result.stdout
    assert "target (given target): three one" in result.stdout


def test_sampled_targets_are_reproducible_with_a_seed(run: str) -> None:
    args = (run, "3 1 4 1 5", "--temperature", "1.5", "--seed", "7")
    first, second = inspect(*args), inspect(*args)
    assert first.exit_code == 0, first.output
    assert "target (model output)" in first.stdout and first.stdout == second.stdout


def test_save_html_and_npz(run: str, tmp_path: Path) -> None:
    page = tmp_path / "out" / "attention.html"
    result = inspect(run, "3 1 4", "--layer", "0", "--head", "all", "--save", str(page))
    assert result.exit_code == 0, result.output
    assert f"wrote {page}" in result.stderr.replace("\n", "")
    text = page.read_text(encoding="utf-8")
    assert '"initial": {"kind": "cross", "layer": 0, "head": "all"}' in text
    assert "http://" not in text and "https://" not in text

    arrays = tmp_path / "maps.npz"
    result = inspect(run, "3 1 4", "--kind", "encoder", "--layer", "all", "--head", "all",
                     "--target", "three one four", "--save", str(arrays))
    assert result.exit_code == 0, result.output
    saved = load_attention(arrays)
    assert saved.dims == ("layer", "head", "row", "column")
    assert saved.weights.shape[:2] == (1, 4) and saved.rows == saved.columns
    torch.testing.assert_close(saved.weights.sum(-1), torch.ones(saved.weights.shape[:-1]))
    assert saved.source == "3 1 4" and saved.target == "three one four"
    assert saved.checkpoint is not None and Path(saved.checkpoint).is_relative_to(run)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layer", "first"], "--layer 'first' must be a layer number"),
        (["--layer", "3"], "--layer 3 is out of range"),
        (["--layer", "-2"], "--layer -2 is out of range"),
        (["--head", "9"], "--head 9 is out of range"),
        (["--head", "max"], "--head 'max' must be a head number, 'all' or 'mean'"),
        (["--kind", "self"], "--kind 'self' must be one of encoder, decoder, cross"),
        (["--save", "map.gif"], "unsupported file type"),
    ],
)
def test_bad_values_give_one_clear_line(run: str, args: list[str], message: str,
                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["inspect-attention", run, "3 1 4", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(refusal_lines(result.stderr)) == 1
    assert "Traceback" not in result.output
    assert not list(tmp_path.iterdir())  # nothing written


def test_help_shows_an_example() -> None:
    result = runner.invoke(app, ["inspect-attention", "--help"])
    assert result.exit_code == 0
    assert "Example" in result.stdout and "--stats" in result.stdout
