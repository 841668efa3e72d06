"""Fine-tuning an imported model: `train --init-from` keeps its tokenizers (two SentencePiece
models over one joint vocabulary, one shared embedding), applies the imported-model defaults
(stated in the run's output, each overridable), and the loss falls."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import write_jsonl
from tests.imports.conftest import MarianCase, lines
from tformer.checkpoint import load_checkpoint
from tformer.cli.commands import app
from tformer.imports import import_model
from tformer.training.configs import IMPORTED_DEFAULTS

STEPS = 40


def pairs(split: str, count: int, toy_data: Path) -> list[dict[str, str]]:
    sources, targets = lines(split, "en", count, toy_data), lines(split, "de", count, toy_data)
    return [{"source": s, "target": t} for s, t in zip(sources, targets, strict=True)]


@pytest.mark.slow
def test_fine_tuning_an_import_keeps_its_tokenizer_and_the_loss_falls(
    marian_case: Callable[[str], MarianCase], toy_data: Path, tmp_path: Path
) -> None:
    imported = import_model(marian_case("swish-shared-tied").folder, tmp_path / "opus")
    data = tmp_path / "mine"
    write_jsonl(data / "train.jsonl", pairs("train", 400, toy_data))
    write_jsonl(data / "validation.jsonl", pairs("val", 20, toy_data))
    out = tmp_path / "tuned"
    result = CliRunner().invoke(app, [
        "train", "--init-from", str(imported), "--data", str(data), "--out", str(out),
        "--max-steps", str(STEPS), "--eval-every", str(STEPS), "--save-every", str(STEPS),
        "--log-every", "5", "--max-tokens", "1024", "--lr", "1e-3", "--warmup-steps", "5",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "an imported model" in result.output and "--schedule constant" in result.output
    tuned = load_checkpoint(out)
    start = load_checkpoint(imported)
    train = tuned.train_config
    # The imported-model defaults, but for the two flags given.
    assert (train.lr, train.warmup_steps) == (1e-3, 5)
    for key in ("schedule", "val_bleu", "best_metric", "patience"):
        assert getattr(train, key) == IMPORTED_DEFAULTS[key], key
    # Its own two tokenizers (one joint vocabulary) and shared embeddings, kept.
    assert not tuned.tokenizers.shared and tuned.model_config.share_embeddings
    for side in ("source", "target"):
        assert getattr(tuned.tokenizers, side).sha256() == getattr(start.tokenizers, side).sha256()
    assert tuned.model_config == start.model_config
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]  # the training loss, every 5 steps
    assert len(losses) == STEPS // 5 and losses[-1] < 0.9 * losses[0], losses
    assert any("val_bleu" in r or "bleu" in r for r in records)  # validation BLEU by default
