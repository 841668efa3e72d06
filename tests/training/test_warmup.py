"""--warmup-share: the warm-up cut to a share of the run, by steps or by time budget."""

from __future__ import annotations

from tformer.config import ModelConfig, TrainConfig
from tformer.training.optim import capped_warmup, lr_at, warmup_at

CUT = TrainConfig(lr=1e-3, warmup_steps=200, warmup_share=0.1, schedule="constant")


def test_a_step_limited_run_warms_up_over_a_tenth_of_its_steps() -> None:
    # The user study's case: --warmup-steps 200 against a 161-step run.
    assert warmup_at(1, CUT, 161, None) == capped_warmup(CUT, 161) == 16
    assert warmup_at(1, CUT, 10_000, None) == 200  # a long run keeps its warm-up
    model = ModelConfig()
    assert lr_at(8, model, CUT, 161) == 1e-3 * 8 / 16
    assert lr_at(16, model, CUT, 161) == 1e-3


def test_under_a_time_budget_a_tenth_of_the_steps_it_allows() -> None:
    # 10 steps done in 5% of the budget: about 200 steps in all, a warm-up of 20.
    assert warmup_at(11, CUT, None, 0.05) == 20
    assert warmup_at(1, CUT, None, 0.0) == 200  # nothing measured yet
    assert warmup_at(11, CUT, 150, 0.05) == 15  # the fewer steps win


def test_without_a_share_the_warm_up_is_as_given() -> None:
    given = TrainConfig(lr=1e-3, warmup_steps=200, schedule="constant")
    assert warmup_at(11, given, 161, 0.05) == 200
