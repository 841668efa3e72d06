"""--fit-budget: dropout, attention dropout and --keep-last fitted to the run's length, once,
by the rule in tformer.training.fit; given values stay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.conftest import Messages, digit_folder, tiny_model
from tformer import checkpoint as ckpt
from tformer.cli.commands import app
from tformer.config import ModelConfig, TrainConfig
from tformer.fast.accelerate import accelerate
from tformer.model import build_model
from tformer.training.budget import FIT_PACE_SHARE, MAX_RESERVE_SHARE, PACE_STEPS
from tformer.training.fit import FIT_FIELDS, LONG_RUN, LONG_RUN_EPOCHS, fit, set_dropout
from tformer.training.run import train

MODEL = ModelConfig(dropout=0.25, attention_dropout=0.0)
TRAIN = TrainConfig(save_every=200, keep_last=8)


def test_a_short_run_keeps_its_dropout_and_averages_at_most_two_thirds_of_it() -> None:
    fitted = fit(MODEL, TRAIN, 1063, 12.2, FIT_FIELDS)
    assert (fitted.model.dropout, fitted.model.attention_dropout) == (0.25, 0.0)
    assert fitted.train.keep_last == 3  # 3 x 200 steps <= 2/3 x 1,063 < 4 x 200
    assert fitted.changes(MODEL, TRAIN) == ["--keep-last 8 -> 3"]
    assert fit(MODEL, TRAIN, 2492, 28.6, FIT_FIELDS).train.keep_last == 8  # 1,600 <= 1,661
    assert fit(MODEL, TRAIN, 250, 3.0, FIT_FIELDS).train.keep_last == 1  # at least one


def test_a_long_run_is_regularised_harder_but_never_less() -> None:
    fitted = fit(MODEL, TRAIN, 3600, LONG_RUN_EPOCHS, FIT_FIELDS)
    assert fitted.model.dropout == LONG_RUN["dropout"] > MODEL.dropout
    assert fitted.model.attention_dropout == LONG_RUN["attention_dropout"] > 0
    assert fitted.train.keep_last == 8
    changes = ["--dropout 0.25 -> 0.3", "--attention-dropout 0.0 -> 0.1"]
    assert fitted.changes(MODEL, TRAIN) == changes
    heavy = ModelConfig(dropout=0.4, attention_dropout=0.2)
    assert fit(heavy, TRAIN, 3600, 50.0, FIT_FIELDS).model == heavy
    assert fit(MODEL, TRAIN, 3600, LONG_RUN_EPOCHS - 0.1, FIT_FIELDS).model == MODEL


def test_only_the_free_settings_change() -> None:
    fitted = fit(MODEL, TRAIN, 1000, 50.0, ("attention_dropout",))
    assert fitted.model.dropout == 0.25 and fitted.model.attention_dropout == 0.1
    assert fitted.train.keep_last == 8


def test_a_built_model_given_new_dropout_trains_as_one_built_with_it() -> None:
    """Every dropout of the model, the faster CPU one included, reads the new values: the same
    weights and the same random draws give the outputs of a model built with them."""
    light = tiny_model()
    heavy = ModelConfig(**{**light.to_dict(), "dropout": 0.3, "attention_dropout": 0.1})
    torch.manual_seed(0)
    changed = accelerate(build_model(light)).train()
    built = accelerate(build_model(heavy)).train()
    built.load_state_dict(changed.state_dict())
    src = torch.randint(4, 60, (3, 9))
    tgt = torch.randint(4, 60, (3, 7))

    def logits(model: torch.nn.Module) -> torch.Tensor:
        torch.manual_seed(1)
        return model(src, tgt).logits

    before = logits(changed)
    set_dropout(changed, heavy)
    assert changed.config == heavy
    assert torch.equal(logits(changed), logits(built))
    assert not torch.allclose(logits(changed), before)


@pytest.fixture(scope="module")
def few_pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sixteen training pairs, one batch an epoch: a run of a few dozen steps is long."""
    return digit_folder(tmp_path_factory.mktemp("few"), 1, train=16, validation=8)


def fitted_lines(lines: list[str]) -> list[str]:
    """The regularisation's line (the size's has its own: tests/training/test_sizing.py)."""
    return [line for line in lines if line.startswith("--fit-budget: a run of")]


def saved(run: Path) -> tuple[dict[str, object], dict[str, object], dict[str, object]]:
    folder = ckpt.resolve(run)
    config = json.loads((folder / "config.json").read_text())
    state = json.loads((folder / "trainer_state.json").read_text())
    return config["model"], config["train"], state["fitted"]


def test_a_time_budget_is_fitted_once_and_a_resumed_run_keeps_it(
    few_pairs: Path, tmp_path: Path
) -> None:
    """Fitted from the pace of the steps in the first FIT_PACE_SHARE of the budget (not only
    its first few steps): the checkpoints hold the fitted configs, and a resumed run does not
    fit again."""
    config = TrainConfig(data=str(few_pairs), max_tokens=512, lr=1e-3, warmup_steps=5,
                         time_budget=3.0, fit_budget=True, log_every=1, eval_every=10_000,
                         save_every=4, keep_last=50, final_eval="none")  # fmt: skip
    messages = Messages()
    first = train(tiny_model(), config, out=tmp_path / "run", vocab_size=64, reporter=messages)
    lines = fitted_lines(messages.lines)
    assert len(lines) == 1 and "at this speed in --time-budget" in lines[0], messages.lines
    model, train_config, state = saved(first.run_dir)
    # The rule applied to the length saved (timing decides it: a loaded machine takes fewer
    # steps; the test below has a length that does not depend on the machine).
    steps, epochs = int(state["steps"]), float(state["epochs"])  # type: ignore[call-overload,arg-type]
    expected = fit(tiny_model(), config, steps, epochs, FIT_FIELDS)
    for name in ("dropout", "attention_dropout"):
        assert model[name] == getattr(expected.model, name), (name, state)
    assert train_config["keep_last"] == expected.train.keep_last
    assert epochs == pytest.approx(steps, abs=1)  # one batch an epoch
    # Made after the first step that had timed PACE_STEPS steps and its share of the budget
    # since the first step (the training budget is --time-budget less at most
    # MAX_RESERVE_SHARE of it; the metrics hold times to 0.01 s).
    elapsed = {r["step"]: r["elapsed"] for r in ckpt.read_metrics(first.run_dir) if "loss" in r}
    at = int(state["at_step"])  # type: ignore[call-overload]
    assert at >= 1 + PACE_STEPS, state
    assert elapsed[at] - elapsed[1] >= FIT_PACE_SHARE * (1 - MAX_RESERVE_SHARE) * 3.0 - 0.01
    if at - 1 >= 1 + PACE_STEPS:  # then the step before had not timed its share
        assert elapsed[at - 1] - elapsed[1] < FIT_PACE_SHARE * 3.0 + 0.01, elapsed
    longer = TrainConfig(**{**config.to_dict(), "time_budget": 30.0, "max_steps": first.step + 3})
    again = Messages()
    train(None, longer, out=tmp_path / "run", resume=True, reporter=again)
    assert fitted_lines(again.lines) == [], again.lines
    assert saved(tmp_path / "run")[2] == state


def test_a_time_budget_that_its_step_limit_ends_first_is_fitted_to_the_limit(
    few_pairs: Path, tmp_path: Path
) -> None:
    """Twelve steps take far less than a twentieth of five minutes: the step limit ends the
    run, so it is fitted to 12 steps once PACE_STEPS have timed the pace, not left unfitted."""
    config = TrainConfig(data=str(few_pairs), max_tokens=512, lr=1e-3, warmup_steps=5,
                         time_budget=300.0, max_steps=12, fit_budget=True, log_every=4,
                         eval_every=10_000, save_every=4, keep_last=50,
                         final_eval="none")  # fmt: skip
    messages = Messages()
    result = train(tiny_model(), config, out=tmp_path / "run", vocab_size=64, reporter=messages)
    assert result.step == 12
    lines = fitted_lines(messages.lines)
    assert len(lines) == 1 and "a run of about 12 steps (12 epochs)" in lines[0], messages.lines
    model, train_config, state = saved(result.run_dir)
    assert state == {"steps": 12, "epochs": 12.0, "at_step": 1 + PACE_STEPS}
    assert train_config["keep_last"] == 2  # 2 x 4 steps <= 2/3 x 12


@pytest.mark.parametrize("given", [[], ["--dropout", "0.05"]])
def test_the_cli_fits_a_step_limited_run_before_its_first_step(
    few_pairs: Path, tmp_path: Path, given: list[str]
) -> None:
    """A run of known length (40 steps, 40 epochs) is fitted before it starts; a --dropout
    or --keep-last given stays as given."""
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "train", "--data", str(few_pairs), "--out", str(out), "--preset", "tiny",
        "--vocab-size", "64", "--max-tokens", "512", "--max-steps", "40", "--save-every", "5",
        "--keep-last", "8", "--eval-every", "40", "--warmup-steps", "5", "--fit-budget",
        *given,
    ], catch_exceptions=False)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "--fit-budget: a run of about 40 steps (40 epochs)" in result.output, result.output
    model, train_config, state = saved(out)
    assert model["dropout"] == (0.05 if given else LONG_RUN["dropout"])
    assert model["attention_dropout"] == LONG_RUN["attention_dropout"]
    assert train_config["keep_last"] == 8  # given, though it spans all 40 steps
    assert state == {"steps": 40, "epochs": 40.0, "at_step": 0}  # before the first step
