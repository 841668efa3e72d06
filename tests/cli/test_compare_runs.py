"""`tformer compare-runs`: the table, --json and --plot on real runs; refusals in one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.conftest import COMPARED_STEPS
from tformer.cli.commands import app

runner = CliRunner()


def invoke(*args: str | Path) -> Any:
    return runner.invoke(app, ["compare-runs", *map(str, args)], catch_exceptions=False)


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_table_shows_the_differing_field_only(compared_runs: dict[str, Path]) -> None:
    runs = list(compared_runs.values())
    before = [snapshot(r) for r in runs]
    result = invoke(*runs)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "four-heads" in out and "two-heads" in out
    row = next(line for line in out.splitlines() if "n_heads" in line)
    assert row.index("4") < row.index("2")  # run order, one column each
    for same in ("d_model", "d_ff", "n_encoder_layers", "dropout", "max_len", "vocab"):
        assert same not in out, same
    for label in ("parameters", "tokens/s (median)", "best val loss", "best val BLEU",
                  "test BLEU", "KV cache B/token"):
        assert label in out, label
    best = min((r["val_loss"], r["step"]) for r in records(runs[1]) if "val_loss" in r)
    assert f"{best[0]:.4f} (step {best[1]})" in out
    assert [snapshot(r) for r in runs] == before  # comparing writes nothing into the runs


def test_json_numbers_are_what_metrics_jsonl_holds(compared_runs: dict[str, Path]) -> None:
    runs = list(compared_runs.values())
    result = invoke(*runs, "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["differing_fields"] == ["n_heads"]
    for run, record in zip(runs, document["runs"], strict=True):
        logged = records(run)
        speeds = sorted(r["tokens_per_s"] for r in logged if "tokens_per_s" in r)
        middle = len(speeds) // 2
        expected = speeds[middle] if len(speeds) % 2 else (speeds[middle - 1] + speeds[middle]) / 2
        assert record["tokens_per_s"] == expected
        assert record["best_val_loss"] == min(r["val_loss"] for r in logged if "val_loss" in r)
        assert record["best_val_bleu"] == max(r["val_bleu"] for r in logged if "val_bleu" in r)
        assert record["steps"] == COMPARED_STEPS
        assert record["path"] == str(run)
        assert record["differences"] == {"n_heads": record["architecture"]["n_heads"]}
        assert record["kv_cache_bytes_per_token"] == 2 * 2 * 64 * 4
    card = runs[0] / f"step-{COMPARED_STEPS:06d}" / "eval-test" / "result.json"
    assert document["runs"][0]["results"]["test"]["bleu"] == json.loads(card.read_text())[
        "metrics"
    ]["bleu"]
    assert document["runs"][1]["results"] == {}


def test_a_checkpoint_folder_stands_for_its_run(compared_runs: dict[str, Path]) -> None:
    a, b = compared_runs.values()
    given = invoke(a / f"step-{COMPARED_STEPS:06d}", b / "best", "--json")
    plain = invoke(a, b, "--json")
    assert given.exit_code == plain.exit_code == 0
    assert json.loads(given.stdout) == json.loads(plain.stdout)


def test_plot_writes_a_png(compared_runs: dict[str, Path], tmp_path: Path) -> None:
    import matplotlib.image

    plot = tmp_path / "curves.png"
    plot.write_bytes(b"an older figure")
    result = invoke(*compared_runs.values(), "--plot", plot, "--json")
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # the message about the figure goes to stderr
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert matplotlib.image.imread(plot).ndim == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png"]


@pytest.mark.parametrize(
    ("make", "code", "message"),
    [
        (lambda t: t, 4, "not a tformer run folder"),
        (lambda t: t / "missing", 4, "no such run folder"),
        (lambda t: (t / "f.txt").write_text("x") and t / "f.txt", 4, "a file, not a run folder"),
    ],
)
def test_a_folder_that_is_not_a_run_is_refused_in_one_line(
    compared_runs: dict[str, Path], tmp_path: Path, make: Any, code: int, message: str
) -> None:
    bad = make(tmp_path)
    result = invoke(compared_runs["four-heads"], bad)
    assert result.exit_code == code
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(bad) in lines[0]
    assert "Traceback" not in result.output


def test_bad_plot_paths_are_refused_before_anything_is_written(
    compared_runs: dict[str, Path], tmp_path: Path
) -> None:
    for plot, message in ((tmp_path / "c.gif", "unsupported file type"), (tmp_path, "is a folder")):
        result = invoke(*compared_runs.values(), "--plot", plot)
        assert result.exit_code == 2, result.output
        assert result.stdout == "" and message in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_one_run_and_help(compared_runs: dict[str, Path]) -> None:
    result = invoke(compared_runs["two-heads"])
    assert result.exit_code == 0, result.output
    assert "no architecture differences" in result.stdout and "n_heads" not in result.stdout
    assert "test BLEU" not in result.stdout  # no run has a card: the rows are left out
    help_text = invoke("--help").stdout
    assert "--plot" in help_text and "Example: tformer compare-runs" in help_text
