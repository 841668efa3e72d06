"""compare_runs: real run folders read back, each figure checked against the files themselves."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import COMPARED_HEADS, COMPARED_STEPS
from tformer.analysis.run_plot import plot_curves
from tformer.analysis.runs import (
    architecture_value,
    compare_runs,
    differing_fields,
    find_run,
    kv_cache_bytes_per_token,
    summarize_run,
)
from tformer.checkpoint.store import load_checkpoint
from tformer.errors import CheckpointError, ConfigError, DataError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def median(values: list[float]) -> float:
    ordered, n = sorted(values), len(values)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


@pytest.mark.slow
def test_summary_figures_are_what_the_run_folder_holds(compared_runs: dict[str, Path]) -> None:
    for name, run in compared_runs.items():
        records = metrics(run)
        summary = summarize_run(run)
        assert summary.name == name and summary.path == run
        speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
        assert len(speeds) >= 4 and summary.tokens_per_s == median(speeds)
        evals = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
        assert [step for step, _ in evals] == [10, 20]
        best_step, best = min(evals, key=lambda e: e[1])
        assert (summary.best_val_loss, summary.best_val_loss_step) == (best, best_step)
        assert summary.best_val_bleu == max(r["val_bleu"] for r in records if "val_bleu" in r)
        assert summary.best_val_chrf == max(r["val_chrf"] for r in records if "val_chrf" in r)
        exact = [r["validation_exact_match"] for r in records if "validation_exact_match" in r]
        assert summary.exact_match == exact[-1]
        latest = (run / "latest").read_text().strip()
        assert summary.checkpoint == run / latest and summary.steps == COMPARED_STEPS
        assert latest == f"step-{COMPARED_STEPS:06d}"
        model = load_checkpoint(run).model  # parameters() yields a tied matrix once
        assert summary.parameters == sum(p.numel() for p in model.parameters())
        assert summary.architecture == json.loads((run / latest / "config.json").read_text())[
            "model"
        ]
        assert summary.architecture["n_heads"] == COMPARED_HEADS[name]
        assert summary.curves["val_loss"] == evals


def test_only_the_differing_field_is_reported(compared_runs: dict[str, Path]) -> None:
    comparison = compare_runs(list(compared_runs.values()))
    assert comparison.differing == ["n_heads"]
    assert [comparison.differences(r) for r in comparison.runs] == [{"n_heads": 4}, {"n_heads": 2}]
    record = comparison.to_json()
    assert record["differing_fields"] == ["n_heads"]
    assert [r["name"] for r in record["runs"]] == list(COMPARED_HEADS)
    json.dumps(record)  # plain data, nothing a script cannot read


def test_kv_cache_bytes_per_token_of_the_tiny_decoder(compared_runs: dict[str, Path]) -> None:
    # Both runs: 2 decoder layers x (K and V) x d_model 64 x 4 bytes, whatever the head count.
    for run in compared_runs.values():
        assert summarize_run(run).kv_cache_bytes_per_token == 2 * 2 * 64 * 4


def test_kv_cache_formula_with_and_without_kv_heads() -> None:
    base = {"d_model": 512, "n_heads": 8, "n_decoder_layers": 6}
    assert kv_cache_bytes_per_token(base) == 2 * 6 * 512 * 4
    assert kv_cache_bytes_per_token({}) == 2 * 6 * 512 * 4  # ModelConfig's defaults
    assert kv_cache_bytes_per_token({**base, "kv_heads": 8}) == 2 * 6 * 512 * 4
    assert kv_cache_bytes_per_token({**base, "kv_heads": 2}) == 2 * 6 * 2 * 64 * 4
    assert kv_cache_bytes_per_token({**base, "kv_heads": 1}, dtype_bytes=2) == 2 * 6 * 64 * 2
    assert kv_cache_bytes_per_token({**base, "d_model": "wide"}) is None


def test_missing_fields_count_as_the_default_or_as_missing() -> None:
    assert differing_fields([{"norm": "post"}, {}]) == []  # post is ModelConfig's default
    assert differing_fields([{"norm": "pre"}, {}]) == ["norm"]
    assert differing_fields([{"d_model": 64, "n_heads": 4}, {"d_model": 64, "n_heads": 2}]) == [
        "n_heads"
    ]
    # A field this version does not know (written by another one) is missing, not a default.
    assert differing_fields([{"rope_theta": 10000.0}, {}]) == ["rope_theta"]
    assert architecture_value({}, "rope_theta") is None
    assert architecture_value({}, "dropout") == 0.1
    assert differing_fields([{"dropout": 0.1}, {"dropout": 0.1}, {}]) == []
    assert differing_fields([{"tie_embeddings": True}, {"tie_embeddings": 1}]) == [
        "tie_embeddings"
    ]


def test_result_card_of_evaluate_is_found(compared_runs: dict[str, Path]) -> None:
    run = compared_runs["four-heads"]
    card_path = run / f"step-{COMPARED_STEPS:06d}" / "eval-test" / "result.json"
    card = json.loads(card_path.read_text())
    test = summarize_run(run).results["test"]
    assert (test["bleu"], test["chrf"], test["loss"]) == (
        card["metrics"]["bleu"],
        card["metrics"]["chrf"],
        card["metrics"]["loss"],
    )
    assert test["step"] == COMPARED_STEPS and test["pairs"] == 16 and test["card"] == str(card_path)
    assert summarize_run(compared_runs["two-heads"]).results == {}


def test_unreadable_cards_are_passed_over(compared_runs: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "copy"
    shutil.copytree(compared_runs["four-heads"], run)
    (run / "eval-broken").mkdir()
    (run / "eval-broken" / "result.json").write_text("{not json")
    (run / "eval-list").mkdir()
    (run / "eval-list" / "result.json").write_text("[1, 2]")
    assert list(summarize_run(run).results) == ["test"]


def test_a_checkpoint_stands_for_its_run(compared_runs: dict[str, Path]) -> None:
    run = compared_runs["four-heads"]
    best = run / "best"
    assert best.is_dir()
    for given in (run, run / f"step-{COMPARED_STEPS:06d}", best, *best.glob("step-*")):
        assert find_run(given) == run, given


def test_what_is_not_a_run_is_refused(compared_runs: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    lonely = tmp_path / "lonely"
    shutil.copytree(compared_runs["two-heads"] / f"step-{COMPARED_STEPS:06d}", lonely)
    cases = [
        (tmp_path, "not a tformer run folder"),
        (tmp_path / "missing", "no such run folder"),
        (tmp_path / "notes.txt", "a file, not a run folder"),
        (lonely, "a checkpoint outside any run folder"),
    ]
    for path, message in cases:
        with pytest.raises(CheckpointError, match=message) as error:
            compare_runs([compared_runs["four-heads"], path])
        assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_plot_is_a_png_written_atomically(compared_runs: dict[str, Path], tmp_path: Path) -> None:
    import matplotlib.image

    comparison = compare_runs(list(compared_runs.values()))
    path = tmp_path / "figures" / "curves.png"
    assert plot_curves(comparison, path) == path
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    height, width, _ = matplotlib.image.imread(path).shape
    assert width > 2 * height  # three panels side by side: loss, BLEU, chrF
    assert sorted(p.name for p in path.parent.iterdir()) == ["curves.png"]  # no temporaries


def test_plot_refusals(compared_runs: dict[str, Path], tmp_path: Path) -> None:
    comparison = compare_runs(list(compared_runs.values()))
    with pytest.raises(ConfigError, match="unsupported file type"):
        plot_curves(comparison, tmp_path / "curves.gif")
    with pytest.raises(ConfigError, match="is a folder"):
        plot_curves(comparison, tmp_path)
    silent = dataclasses.replace(
        comparison, runs=[dataclasses.replace(r, curves={}) for r in comparison.runs]
    )
    with pytest.raises(DataError, match="none of the runs logged a validation loss"):
        plot_curves(silent, tmp_path / "curves.png")
    assert list(tmp_path.iterdir()) == []


def test_damaged_metric_records_are_passed_over(
    compared_runs: dict[str, Path], tmp_path: Path
) -> None:
    run = tmp_path / "four-heads"
    shutil.copytree(compared_runs["four-heads"], run)
    before = summarize_run(run)
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 21, "val_loss": "low"}\n')
        handle.write('{"step": 22, "val_loss": NaN, "tokens_per_s": Infinity}\n')
        handle.write('{"step": true, "val_loss": 0.0001}\n')
        handle.write("[1, 2]\n")
        handle.write('{"step": 23, "val_lo')  # torn by a crash
    after = summarize_run(run)
    assert (after.best_val_loss, after.tokens_per_s, after.curves) == (
        before.best_val_loss,
        before.tokens_per_s,
        before.curves,
    )


def test_runs_of_the_same_name_are_told_apart_by_path(
    compared_runs: dict[str, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "four-heads"
    shutil.copytree(compared_runs["four-heads"], copy)
    comparison = compare_runs([compared_runs["four-heads"], copy])
    assert [r.name for r in comparison.runs] == [str(compared_runs["four-heads"]), str(copy)]
    assert comparison.differing == []
