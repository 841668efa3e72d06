"""--warmup-share: the warm-up cut to a share of the run, by steps or by time budget, fixed
once per run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Messages, tiny_model
from tformer import checkpoint as ckpt
from tformer.config import ModelConfig, TrainConfig
from tformer.training.optim import budget_steps, capped_warmup, lr_at
from tformer.training.run import train

CUT = TrainConfig(lr=1e-3, warmup_steps=200, warmup_share=0.1, schedule="constant")


def test_a_step_limited_run_warms_up_over_a_tenth_of_its_steps() -> None:
    # --warmup-steps 200 against a 161-step run: a warm-up of 16.
    assert capped_warmup(CUT, 161) == 16
    assert capped_warmup(CUT, 10_000) == 200  # a long run keeps its warm-up
    model = ModelConfig()
    assert lr_at(8, model, CUT, 161) == 1e-3 * 8 / 16
    assert lr_at(16, model, CUT, 161) == 1e-3
    # The warm-up the loop fixed wins over the one the steps would give.
    assert lr_at(8, model, CUT, 161, warmup=32) == 1e-3 * 8 / 32


def test_under_a_time_budget_the_steps_it_holds_at_the_pace_so_far() -> None:
    # 11 steps in 10 s, 2 steps a second for the 90 s left: about 191 steps, a warm-up of 19.
    assert budget_steps(11, 10.0, 100.0, 2.0) == 191
    assert capped_warmup(CUT, budget_steps(11, 10.0, 100.0, 2.0)) == 19
    assert budget_steps(11, 120.0, 100.0, 2.0) == 11  # past the budget: the steps done


def test_without_a_share_the_warm_up_is_as_given() -> None:
    given = TrainConfig(lr=1e-3, warmup_steps=200, schedule="constant")
    assert capped_warmup(given, 161) == 200
    assert lr_at(100, ModelConfig(), given, 161) == 1e-3 * 100 / 200


def saved_warmup(run: Path) -> dict[str, object]:
    state = json.loads((ckpt.resolve(run) / "trainer_state.json").read_text())
    return state["warmup"]


def test_a_time_budget_fixes_its_warm_up_once_and_a_resumed_run_keeps_it(
    toy_data: Path, tmp_path: Path
) -> None:
    """The warm-up is cut once, from the pace of the first steps, and saved: a resumed run
    with a longer budget keeps it instead of cutting it again from its own length."""
    config = TrainConfig(data=str(toy_data), max_tokens=512, lr=1e-3, warmup_steps=10_000,
                         warmup_share=0.1, time_budget=3.0, log_every=5, eval_every=10_000,
                         save_every=10_000, final_eval="none")  # fmt: skip
    messages = Messages()
    first = train(tiny_model(), config, out=tmp_path / "run", vocab_size=64, reporter=messages)
    cuts = [line for line in messages.lines if line.startswith("warm-up ")]
    assert len(cuts) == 1 and "cut to --warmup-share 0.1" in cuts[0], messages.lines
    warmup = int(cuts[0].split()[1].replace(",", ""))
    assert 1 <= warmup <= first.step // 5, (cuts, first.step)
    assert saved_warmup(first.run_dir) == {"steps": warmup, "of": [10_000, 0.1]}
    longer = TrainConfig(**{**config.to_dict(), "time_budget": 30.0, "max_steps": first.step + 3})
    again = Messages()
    train(None, longer, out=tmp_path / "run", resume=True, reporter=again)
    assert not any(line.startswith("warm-up ") for line in again.lines), again.lines
    assert saved_warmup(tmp_path / "run")["steps"] == warmup
