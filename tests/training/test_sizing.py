"""--fit-budget's size: a run whose budget holds many epochs trains the narrower, deeper model
(tformer.training.sizing), chosen before its first step; given sizes stay."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.conftest import Messages, digit_folder, tiny_model
from tformer import checkpoint as ckpt
from tformer.cli.commands import app
from tformer.config import ModelConfig, TrainConfig
from tformer.data.batching import BatchPlan
from tformer.fast.accelerate import accelerate
from tformer.model import build_model
from tformer.training.configs import Settings
from tformer.training.distributed import World
from tformer.training.fit import FIT_FIELDS, SIZE_FIELDS
from tformer.training.precision import resolve_precision
from tformer.training.run import plan_job, train
from tformer.training.sizing import (
    NARROWINGS,
    PROBE_STEPS,
    Narrowing,
    narrower,
    narrowing_for,
    time_steps,
)

RECIPE = "multi30k-pre-swiglu-rope"


def test_the_recipe_is_narrowed_to_the_models_its_long_runs_were_measured_with() -> None:
    """The recipe's model at half and three quarters of its width, one layer deeper, are the
    models of the Multi30k runs that chose the rule (docs/training.md): d_model 128, d_ff 512,
    lr 5e-3 with 400 warm-up steps from 20 epochs, d_model 192, d_ff 768, lr 4e-3 with 300
    from 32; 4 heads and 4+4 layers each."""
    job = plan_job(None, None, settings=Settings(recipe=RECIPE))
    assert job.train.fit_budget and set(SIZE_FIELDS) <= set(job.free)
    assert job.model is not None
    assert narrowing_for(19.9) is None
    measured = {20.0: (128, 512, 0.005, 400), 31.9: (128, 512, 0.005, 400),
                32.0: (192, 768, 0.004, 300), 500.0: (192, 768, 0.004, 300)}  # fmt: skip
    for epochs, (d_model, d_ff, lr, warmup) in measured.items():
        narrowing = narrowing_for(epochs)
        assert narrowing is not None
        narrow = narrower(job.model, job.train, job.free, narrowing)
        assert narrow is not None
        model, train_config = narrow
        assert (model.d_model, model.n_heads, model.d_ff) == (d_model, 4, d_ff)
        assert (model.n_encoder_layers, model.n_decoder_layers) == (4, 4)
        assert (train_config.lr, train_config.warmup_steps) == (lr, warmup)
        assert (model.norm, model.activation, model.positions) == ("pre", "swiglu", "rope")
        # A learning rate given stays as given; the paper's own rate (None) follows d_model.
        kept = narrower(job.model, job.train, ("warmup_steps",), narrowing)
        assert kept is not None and kept[1].lr == 0.003
        paper = narrower(job.model, TrainConfig(lr=None), FIT_FIELDS, narrowing)
        assert paper is not None and paper[1].lr is None


@pytest.mark.parametrize("narrowing", NARROWINGS, ids=lambda n: f"width-{n.width}")
def test_a_width_that_narrows_into_no_valid_model_is_kept(narrowing: Narrowing) -> None:
    # 24 at 1/2 is 3 dimensions a head over 4 heads, odd, which rotary positions cannot use;
    # at 3/4 18, which 4 heads do not divide.
    rotary = ModelConfig(d_model=24, n_heads=4, d_ff=64, positions="rope")
    cases = [rotary, ModelConfig(d_model=8, n_heads=8, d_ff=16),
             ModelConfig(d_model=64, n_heads=4, d_ff=99)]  # fmt: skip
    for model in cases:
        assert narrower(model, TrainConfig(), FIT_FIELDS, narrowing) is None, model


@pytest.fixture(scope="module")
def few_pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sixteen training pairs, one batch an epoch: a step is an epoch."""
    return digit_folder(tmp_path_factory.mktemp("few"), 1, train=16, validation=8)


def sizing_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "epochs at this size" in line]


def saved_model(run: Path) -> dict[str, object]:
    config = json.loads((ckpt.resolve(run) / "config.json").read_text())
    return {**config["model"], **{k: config["train"][k] for k in ("lr", "warmup_steps")}}


FROM = sorted(int(n.from_epochs) for n in NARROWINGS)  # 20, 32


@pytest.mark.parametrize("steps", [FROM[0] - 1, FROM[0], FROM[1]])
def test_a_run_of_known_length_is_sized_before_its_first_step(
    few_pairs: Path, tmp_path: Path, steps: int
) -> None:
    """One batch an epoch: --max-steps N is N epochs, known without timing anything. From
    20 epochs the run trains (and saves) half the width, from 32 three quarters, each at its
    learning rate."""
    config = TrainConfig(data=str(few_pairs), max_tokens=512, lr=1e-3, warmup_steps=5,
                         max_steps=steps, fit_budget=True, eval_every=10_000, save_every=100,
                         final_eval="none")  # fmt: skip
    messages = Messages()
    result = train(tiny_model(), config, out=tmp_path / "run", vocab_size=64, reporter=messages)
    assert result.step == steps
    lines = sizing_lines(messages.lines)
    assert len(lines) == 1, messages.lines
    assert f"about {steps} epochs at this size:" in lines[0]
    assert "timed" not in lines[0]
    model = saved_model(result.run_dir)
    if steps < FROM[0]:
        assert lines[0].endswith("the size as it is")
        assert (model["d_model"], model["n_encoder_layers"], model["lr"]) == (64, 1, 1e-3)
        return
    half, three_quarters = (32, 64, 0.00166667, 10), (48, 96, 0.00133333, 8)
    width, d_ff, lr, warmup = half if steps < FROM[1] else three_quarters
    assert lines[0].endswith(
        f"--d-model 64 -> {width}, --d-ff 128 -> {d_ff}, --n-encoder-layers 1 -> 2, "
        f"--n-decoder-layers 1 -> 2, --lr 0.001 -> {lr}, --warmup-steps 5 -> {warmup}"
    )
    assert (model["d_model"], model["d_ff"], model["n_heads"]) == (width, d_ff, 4)
    assert (model["n_encoder_layers"], model["n_decoder_layers"]) == (2, 2)
    assert (model["lr"], model["warmup_steps"]) == (lr, warmup)
    loaded = ckpt.load_checkpoint(result.run_dir)  # the saved weights are the narrower model's
    assert loaded.model_config.d_model == width
    shapes = {tuple(v.shape) for v in loaded.model.state_dict().values()}
    built = build_model(loaded.model_config).state_dict().values()
    assert shapes == {tuple(v.shape) for v in built} and (width, d_ff) in shapes


def test_a_time_budget_times_a_few_steps_and_the_timing_counts_in_the_budget(
    few_pairs: Path, tmp_path: Path
) -> None:
    """Five seconds of a tiny model on one batch an epoch (far more than 32 epochs on an idle
    machine): the size is chosen after timing PROBE_STEPS steps, and the
    run's clock starts at the time that took. A resumed run keeps its size and times nothing."""
    config = TrainConfig(data=str(few_pairs), max_tokens=512, lr=1e-3, warmup_steps=5,
                         time_budget=5.0, fit_budget=True, log_every=1, eval_every=10_000,
                         save_every=4, final_eval="none")  # fmt: skip
    messages = Messages()
    result = train(tiny_model(), config, out=tmp_path / "run", vocab_size=64, reporter=messages)
    lines = sizing_lines(messages.lines)
    assert len(lines) == 1 and f"its steps timed over {PROBE_STEPS} in" in lines[0], lines
    # The timing decides (a loaded machine holds fewer epochs); the rule follows it.
    epochs = int(re.search(r"about ([\d,]+) epochs", lines[0])[1].replace(",", ""))  # type: ignore[index]
    narrowing = narrowing_for(epochs)
    width = int(64 * narrowing.width) if narrowing else 64
    assert (f"--d-model 64 -> {width}" in lines[0]) == (width < 64), lines[0]
    assert saved_model(result.run_dir)["d_model"] == width
    spent = float(re.search(r"in ([\d.]+) s of the budget", lines[0])[1])  # type: ignore[index]
    first = next(r for r in ckpt.read_metrics(result.run_dir) if "loss" in r)
    # The line gives the seconds to 0.1 s; the first step's clock includes them.
    assert first["step"] == 1 and first["elapsed"] >= spent - 0.05
    longer = TrainConfig(**{**config.to_dict(), "max_steps": result.step + 2, "time_budget": 30.0})
    again = Messages()
    resumed = train(None, longer, out=tmp_path / "run", resume=True, reporter=again)
    assert sizing_lines(again.lines) == [], again.lines
    assert resumed.step == result.step + 2
    assert saved_model(resumed.run_dir)["d_model"] == width


def test_timing_leaves_the_model_and_every_random_stream_as_they_were(few_pairs: Path) -> None:
    """The steps are taken by a copy with its own optimizer: the run's model keeps its initial
    weights, and the random streams that shape training are where they were."""
    model_config = tiny_model()
    model_config = ModelConfig(**{**model_config.to_dict(), "src_vocab_size": 64,
                                  "tgt_vocab_size": 64, "dropout": 0.1})  # fmt: skip
    torch.manual_seed(0)
    model = accelerate(build_model(model_config)).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pairs = [([5 + i % 7, 6, 7], [8, 9 + i % 5]) for i in range(32)]
    plan = BatchPlan(pairs, 64, 0)
    train_config = TrainConfig(max_tokens=64, lr=1e-2)
    precision = resolve_precision("fp32", torch.device("cpu"), model_config)
    state = torch.get_rng_state()
    seconds_per_step, spent = time_steps(model, train_config, plan, precision, World())
    assert torch.equal(torch.get_rng_state(), state)
    assert 0 < seconds_per_step * PROBE_STEPS <= spent
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize(
    "given", [["--preset", "tiny"], ["--config", "SIZE"], ["--d-model", "64"]]
)
def test_a_size_given_any_way_is_kept(few_pairs: Path, tmp_path: Path, given: list[str]) -> None:
    """A preset, a --config file or a flag that names the size keeps it: nothing is timed."""
    size = tmp_path / "size.yaml"
    size.write_text("model:\n  d_model: 64\n  n_heads: 4\n  n_encoder_layers: 1\n"
                    "  n_decoder_layers: 1\n  d_ff: 128\n  max_len: 64\n")  # fmt: skip
    given = [str(size) if arg == "SIZE" else arg for arg in given]
    out = tmp_path / "run"
    small = ["--n-heads", "4", "--n-encoder-layers", "1", "--n-decoder-layers", "1",
             "--d-ff", "128", "--max-len", "64"]  # fmt: skip
    result = CliRunner().invoke(app, [
        "train", "--data", str(few_pairs), "--out", str(out), *given,
        *(small if given[0] == "--d-model" else []), "--vocab-size", "64",
        "--max-tokens", "512", "--max-steps", "25", "--eval-every", "25", "--warmup-steps", "5",
        "--fit-budget",
    ], catch_exceptions=False)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "epochs at this size" not in result.output, result.output
    assert "--fit-budget: a run of about 25 steps" in result.output  # the dropout's fit runs
    assert saved_model(out)["d_model"] == 64
