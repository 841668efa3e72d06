"""Evaluation: sacreBLEU reproduced exactly, result cards complete, averaging correct."""

from __future__ import annotations

import json
import math
import platform
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tformer.checkpoint.averaging import average_checkpoints
from tformer.checkpoint.store import load_checkpoint
from tformer.cli.commands import app
from tformer.errors import CheckpointError
from tformer.metrics import corpus_scores
from tformer.training.run import TrainResult


def test_scores_reproduce_sacrebleu_exactly() -> None:
    import sacrebleu

    hyps = ["the cat sat on the mat .", "a dog runs in the park", "two men play chess"]
    refs = ["the cat sat on a mat .", "a dog is running in the park", "two men are playing chess"]
    scores = corpus_scores(hyps, refs)
    assert scores.bleu == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
    assert scores.chrf == round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)
    assert scores.bleu_signature.startswith("nrefs:1|case:mixed")
    assert corpus_scores(refs, refs).bleu == 100.0


@pytest.mark.slow
def test_evaluate_cli_writes_a_complete_card(trained: TrainResult, toy_data: Path,
                                             tmp_path: Path) -> None:
    out = tmp_path / "eval"
    result = CliRunner().invoke(app, ["evaluate", str(trained.run_dir), "--data", str(toy_data),
                                      "--split", "test", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "sacreBLEU" in result.stdout
    card = json.loads((out / "result.json").read_text())
    for key in ("tformer_version", "git_commit", "checkpoint", "data_sha256", "metrics",
                "model", "train", "decoding", "hardware", "wall_time_s", "new_tokens_per_s"):
        assert key in card, key
    # The toy model learns the task (BLEU 78-90 by thread count: its training's float sums).
    assert card["metrics"]["bleu"] > 60
    if platform.machine() == "x86_64" and Path("/proc/cpuinfo").exists():
        assert card["hardware"]["cpu"] not in ("", "x86_64")  # the model, not the architecture
    assert set(card["hardware"]["cpu_features"]) <= {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}
    assert "nrefs:1" in card["metrics"]["bleu_signature"]
    hyps = (out / "hypotheses.txt").read_text().splitlines()
    assert len(hyps) == card["pairs"] == 200
    assert "sacreBLEU" in (out / "result.md").read_text()


def test_average_of_two_checkpoints_is_their_mean(trained: TrainResult, tmp_path: Path) -> None:
    steps = sorted(p for p in trained.run_dir.glob("step-*"))
    assert len(steps) >= 2
    folder = average_checkpoints(steps[-2:], tmp_path / "avg")
    a, b = (load_checkpoint(p).model.state_dict() for p in steps[-2:])
    avg = load_checkpoint(folder).model.state_dict()
    for name in avg:
        torch.testing.assert_close(avg[name], (a[name] + b[name]) / 2)
    with pytest.raises(CheckpointError, match="at least two"):
        average_checkpoints(steps[-1:], tmp_path / "x")


def test_evaluate_on_a_prepared_folder_scores_its_kept_test_pairs(
    trained: TrainResult, toy_data: Path, tmp_path: Path
) -> None:
    prepared = tmp_path / "prepared"
    made = CliRunner().invoke(app, ["prepare", "--data", str(toy_data), "--out", str(prepared),
                                    "--tokenizer", str(trained.checkpoint / "tokenizer.json")])
    assert made.exit_code == 0, made.output
    cards = []
    for data, name in ((toy_data, "text"), (prepared, "prepared")):
        result = CliRunner().invoke(app, ["evaluate", str(trained.run_dir), "--data", str(data),
                                          "--split", "test", "--limit", "40",
                                          "--out", str(tmp_path / f"eval-{name}")])
        assert result.exit_code == 0, result.output
        cards.append(json.loads((tmp_path / f"eval-{name}" / "result.json").read_text()))
    assert cards[0]["metrics"] == cards[1]["metrics"]  # no test pair was too long: the same
    assert cards[0]["data_sha256"] == cards[1]["data_sha256"]
    refused = CliRunner().invoke(app, ["train-tokenizer", "--data", str(prepared),
                                       "-o", str(tmp_path / "tok.json")])
    assert refused.exit_code == 3 and "keeps token ids, not the training text" in refused.output


def test_perplexities_are_printed_readably() -> None:
    """Three decimals below a million, scientific notation above (a random model's e^50)."""
    from tformer.metrics import perplexity_text

    assert perplexity_text(12.34567) == "12.346"
    assert perplexity_text(999_999.4) == "999999.400"
    assert perplexity_text(math.exp(50)) == "5.185e+21"
    assert perplexity_text(float("inf")) == "inf"
