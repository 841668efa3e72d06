"""Validation that means something: BLEU / chrF while training, best by metric, patience, EMA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.conftest import tiny_model
from tformer.checkpoint.run_dir import BEST, resolve
from tformer.checkpoint.store import load_checkpoint, read_config
from tformer.cli.commands import app
from tformer.config import TrainConfig
from tformer.errors import ConfigError
from tformer.model import Transformer
from tformer.training.ema import WeightAverage
from tformer.training.run import train


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def config(data: Path, **overrides: object) -> TrainConfig:
    values: dict[str, object] = dict(
        data=str(data), max_tokens=512, lr=3e-3, warmup_steps=5, max_steps=40, log_every=10,
        eval_every=10, save_every=10, label_smoothing=0.0, seed=0,
        device="cpu",  # exact comparisons: the CPU's kernels, also where a GPU is visible
    )  # fmt: skip
    values.update(overrides)
    return TrainConfig(**values)  # type: ignore[arg-type]


@pytest.mark.slow
def test_validation_bleu_is_logged_and_picks_the_best_checkpoint(
    toy_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    train(tiny_model(), config(toy_data, val_bleu=40, best_metric="bleu"), out=out, vocab_size=64)
    evals = [r for r in records(out) if "val_loss" in r]
    assert [r["step"] for r in evals] == [10, 20, 30, 40]
    assert all(0.0 <= r["val_bleu"] <= 100.0 and 0.0 <= r["val_chrf"] <= 100.0 for r in evals)
    assert evals[-1]["val_chrf"] > evals[0]["val_chrf"]  # it learns the digit words
    best = max(evals, key=lambda r: (r["val_bleu"], -r["step"]))  # the first of the highest
    assert [r["step"] for r in evals if r.get("best")][-1] == best["step"]
    best_dir = resolve(out / BEST)
    metrics = read_config(best_dir)["metrics"]
    assert metrics["val_bleu"] == best["val_bleu"] and read_config(best_dir)["step"] == best["step"]

    # The logged figure is sacreBLEU's own: `tformer evaluate` on the same pairs agrees.
    result = CliRunner().invoke(
        app,
        ["evaluate", str(out / BEST), "--data", str(toy_data), "--split", "validation",
         "--limit", "40", "--max-new-tokens", "64", "--out", str(tmp_path / "eval")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    card = json.loads((tmp_path / "eval" / "result.json").read_text())
    assert card["metrics"]["bleu"] == best["val_bleu"]
    assert card["metrics"]["chrf"] == best["val_chrf"]


def test_patience_stops_a_run_that_does_not_improve(toy_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    # So small a learning rate that no output is right: BLEU stays 0 after the first eval.
    cfg = config(toy_data, lr=1e-7, val_bleu=20, best_metric="bleu", patience=2, eval_every=2,
                 max_steps=100)  # fmt: skip
    result = train(tiny_model(), cfg, out=out, vocab_size=64)
    assert result.stopped_early and result.step == 6
    evals = [r for r in records(out) if "val_bleu" in r]
    assert [r["val_bleu"] for r in evals] == [0.0, 0.0, 0.0]
    assert resolve(out).name == "step-000006"  # the stop is saved like any other


def test_best_metric_needs_translations() -> None:
    with pytest.raises(ConfigError, match="--best-metric bleu needs --val-bleu"):
        TrainConfig(best_metric="bleu")
    with pytest.raises(ConfigError, match="--patience 0 must be >= 1"):
        TrainConfig(patience=0)
    with pytest.raises(ConfigError, match="--ema-decay 1.0 must be in"):
        TrainConfig(ema_decay=1.0)


def test_weight_average_is_the_exponential_moving_average() -> None:
    torch.manual_seed(0)
    model = Transformer(tiny_model())
    first = {n: p.detach().clone() for n, p in model.named_parameters()}
    ema = WeightAverage(model, decay=0.75)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    ema.update()
    for name in first:
        w0, w1, w2 = first[name], first[name] + 1.0, (first[name] + 1.0) * 2.0
        expected = 0.75 * (0.75 * w0 + 0.25 * w1) + 0.25 * w2
        torch.testing.assert_close(ema.average[name], expected)
    raw = {n: p.detach().clone() for n, p in model.named_parameters()}
    average = {n: a.clone() for n, a in ema.average.items()}
    ema.swap()  # the model now holds the average, and the average slot the raw weights
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), average[name])
        assert torch.equal(ema.average[name], raw[name])
    ema.swap()
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), raw[name])


@pytest.mark.slow
def test_ema_checkpoints_hold_the_average_and_resume_exactly(
    toy_data: Path, tmp_path: Path
) -> None:
    # One step by hand: the saved weights are decay * initial + (1 - decay) * trained.
    one = train(tiny_model(), config(toy_data, max_steps=1, ema_decay=0.9), out=tmp_path / "one",
                vocab_size=64)  # fmt: skip
    saved = load_checkpoint(tmp_path / "one")
    torch.manual_seed(0)
    initial = dict(Transformer(saved.model_config).named_parameters())
    trained = dict(one.model.named_parameters())  # type: ignore[union-attr]
    for name, p in saved.model.named_parameters():
        expected = 0.9 * initial[name].detach() + 0.1 * trained[name].detach()
        torch.testing.assert_close(p.detach(), expected, rtol=1e-5, atol=1e-6)

    # Interrupted at step 20 and resumed: the same averaged and raw weights as straight through.
    straight = train(tiny_model(), config(toy_data, ema_decay=0.9), out=tmp_path / "a",
                     vocab_size=64)  # fmt: skip
    train(tiny_model(), config(toy_data, ema_decay=0.9, max_steps=20), out=tmp_path / "b",
          vocab_size=64)  # fmt: skip
    resumed = train(None, config(toy_data, ema_decay=0.9), out=tmp_path / "b", resume=True)
    a, b = load_checkpoint(tmp_path / "a").model, load_checkpoint(tmp_path / "b").model
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    for x, y in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):  # type: ignore[union-attr]
        assert torch.equal(x, y)
    assert [r for r in records(tmp_path / "a") if "val_loss" in r] == [
        r for r in records(tmp_path / "b") if "val_loss" in r
    ]
