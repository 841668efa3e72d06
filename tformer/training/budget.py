"""A run's clock: --time-budget, the warm-up fixed from the run's length, the time kept for
the final validation, and every rank agreeing on when to stop.

:class:`TimeBudget` is the part of ``TrainingLoop`` (tformer.training.loop) that reads the
time; the attributes it declares are the loop's.
"""

from __future__ import annotations

import time
from typing import Any

from tformer.config import ModelConfig, TrainConfig
from tformer.data.batching import BatchPlan
from tformer.model import TransformerBase
from tformer.training import distributed as dist_
from tformer.training.best import BestKeeper
from tformer.training.distributed import World
from tformer.training.fit import fit, set_dropout
from tformer.training.optim import WARMUP_SHARE, budget_steps, capped_warmup
from tformer.training.reporting import Reporter
from tformer.training.saving import RunSaver
from tformer.training.signals import StopOnSignal
from tformer.training.state import Position, steps_per_epoch

# The share of --time-budget the final validation may take after training: the validation
# loss, then translating the split (--final-eval auto) until the run's time is up.
FINAL_EVAL_SHARE = 0.05
# Of that share, what the validation loss may take when translating follows it; training
# keeps back whatever more the loss is expected to take (``final_reserve``).
LOSS_SHARE = 0.5
# The most of --time-budget training keeps back for the final validation.
MAX_RESERVE_SHARE = 0.5
# A forward pass costs about a third of a training step (the backward pass is twice it).
FORWARD_COST = 1 / 3
# Steps timed after a process's first (set-up included) before a time budget's length in
# steps is estimated for --warmup-share (and, with FIT_PACE_SHARE, for --fit-budget).
PACE_STEPS = 3
# The share of the training budget timed before --fit-budget estimates a --time-budget run's
# length: a run's first steps are slower than the rest, so a pace taken over a few of them (as
# the warm-up's is) undercounts the run's steps (docs/training.md).
FIT_PACE_SHARE = 0.05


class TimeBudget:
    """The loop's decisions that read the clock and the run's length."""

    cfg: TrainConfig
    model: TransformerBase
    model_config: ModelConfig
    world: World
    report: Reporter
    keeper: BestKeeper
    saver: RunSaver
    free: tuple[str, ...]
    fitted: dict[str, Any] | None
    device: Any
    time_used: float
    reserve: float
    warmup: int | None
    warmup_noted: bool
    paced_from: tuple[int, int, float] | None
    waited: float
    val_tokens: int
    budget_end: float | None

    def _warmup_basis(self) -> list[Any]:
        """The settings a fixed warm-up was cut from: a resume given others cuts anew."""
        return [self.cfg.warmup_steps, self.cfg.warmup_share]

    def _fix_warmup(self, steps: float, how: str) -> None:
        """Fix the run's warm-up for a run of about ``steps`` steps (--warmup-share), with one
        line when the share cut it."""
        cfg = self.cfg
        self.warmup = capped_warmup(cfg, steps)
        if self.warmup < cfg.warmup_steps and self.world.is_main:
            self.report.message(
                f"warm-up {self.warmup:,} steps: --warmup-steps {cfg.warmup_steps:,} cut to "
                f"--warmup-share {cfg.warmup_share} of the run ({int(steps):,} steps{how})"
            )

    def _fix_warmup_in_budget(self, pos: Position, total_steps: int | None) -> None:
        """Fix the warm-up of a --time-budget run from the steps the budget holds at the pace
        of the steps since this process's first (agreed time, so every rank fixes the same);
        until then the first steps follow --warmup-steps as given."""
        steps = self._budget_length(pos, total_steps)
        if steps is not None:
            self._fix_warmup(steps, ", about, at this speed, in --time-budget")

    def _budget_length(self, pos: Position, total_steps: int | None) -> float | None:
        """About how many steps the run takes: the steps --time-budget holds at the pace since
        this process's first step (agreed time, so every rank finds the same), or the run's
        own limit when that comes first; None before any time has passed."""
        assert self.paced_from is not None and self.cfg.time_budget is not None
        step0, _, used0 = self.paced_from
        if self.time_used <= used0:
            return None
        pace = (pos.step - step0) / (self.time_used - used0)
        steps = budget_steps(pos.step, self.time_used, self._training_budget(), pace)
        return steps if total_steps is None else min(steps, total_steps)

    def _fit_when_due(
        self, pos: Position, total_steps: int | None, plan: BatchPlan
    ) -> TrainConfig:
        """--fit-budget, once: fit the run's regularisation to its length, before its first step
        when the length is known, else once PACE_STEPS steps and FIT_PACE_SHARE of the budget
        have timed --time-budget's pace (PACE_STEPS alone when that pace says the step limit
        ends the run first); one line says what changed. The checkpoints then hold the fitted
        configs and the fit (with the step it was made after) is saved, so a resumed run keeps
        it. Returns the run's TrainConfig."""
        cfg = self.cfg
        if not cfg.fit_budget or self.fitted is not None:
            return cfg
        steps: float | None = total_steps
        if cfg.time_budget is not None:
            if self.paced_from is None or pos.step - self.paced_from[0] < PACE_STEPS:
                return cfg
            steps = self._budget_length(pos, total_steps)
            # A run that its step limit ends first is as long as the limit: no need to wait.
            limited = steps is not None and steps == total_steps
            timed = self.time_used - self.paced_from[2]
            if not limited and timed < FIT_PACE_SHARE * self._training_budget():
                return cfg
        if steps is None:
            return cfg
        per_epoch = steps_per_epoch(plan, pos.epoch, cfg.accumulate, self.world.world_size)
        fitted = fit(self.model_config, cfg, steps, steps / per_epoch, self.free)
        changes = fitted.changes(self.model_config, cfg)
        set_dropout(self.model, fitted.model)
        self.model_config = fitted.model
        self.cfg = self.saver.cfg = self.keeper.cfg = fitted.train
        self.fitted = {
            "steps": fitted.steps, "epochs": round(fitted.epochs, 1), "at_step": pos.step
        }
        if self.world.is_main:
            how = " at this speed in --time-budget" if cfg.time_budget is not None else ""
            self.report.message(
                f"--fit-budget: a run of about {fitted.steps:,} steps ({fitted.epochs:.0f} "
                f"epochs){how}: {', '.join(changes) or 'the settings as they are'}"
            )
        return self.cfg

    def _warn_long_warmup(self, steps: int, how: str) -> None:
        """One warning line when the run ends before its learning-rate warm-up does: the
        schedule would never reach its peak (almost always a mistake)."""
        if self.cfg.warmup_share is not None:  # the share cuts the warm-up to fit the run
            return
        warmup = self.cfg.warmup_steps
        if self.warmup_noted or steps <= 0 or steps >= warmup or not self.world.is_main:
            return
        self.warmup_noted = True
        self.report.message(
            f"warning: --warmup-steps {warmup:,} is longer than the run ({steps:,} steps"
            f"{how}): the learning rate never reaches its peak; give --warmup-steps "
            f"{max(1, round(WARMUP_SHARE * steps)):,} (a tenth of the run), "
            f"--warmup-share {WARMUP_SHARE} or a longer run"
        )

    def final_reserve(self, pos: Position) -> float:
        """Seconds of --time-budget training keeps back for the final validation, so that the
        run ends within FINAL_EVAL_SHARE of its budget (but for the final save): what the
        validation loss is expected to take beyond its part of that share (LOSS_SHARE of it
        when translating follows, which is cut to the time left). Expected: as long as the
        last validation loss took; before any, a forward pass over the split at the training
        pace since this process's first step, turns waited for left out (validation takes
        none). Nothing when that is less than a step (a budget ends on a step anyway); at
        most MAX_RESERVE_SHARE of the budget."""
        budget = self.cfg.time_budget
        if budget is None or not self.val_tokens or not self.world.is_main:
            return 0.0
        if self.paced_from is None or pos.step <= self.paced_from[0]:
            return 0.0  # nothing timed yet
        step0, tokens0, used0 = self.paced_from
        step_seconds = (pos.elapsed - used0) / (pos.step - step0)
        loss = self.keeper.loss_seconds
        if loss is None:
            per_token = max(pos.elapsed - used0 - self.waited, 0.0) / (pos.tokens - tokens0)
            loss = self.val_tokens * per_token * FORWARD_COST
        share = FINAL_EVAL_SHARE * (LOSS_SHARE if self._translates_in_budget() else 1.0)
        beyond = loss - share * budget
        if beyond < step_seconds:
            return 0.0
        return min(beyond, MAX_RESERVE_SHARE * budget)

    def _translates_in_budget(self) -> bool:
        """Whether the last evaluation translates validation pairs within --time-budget: the
        split (--final-eval auto) or the first --val-bleu pairs (--final-eval none)."""
        cfg = self.cfg
        if not self.model.reads_source:
            return False
        return cfg.final_eval == "auto" or (cfg.final_eval == "none" and cfg.val_bleu > 0)

    def _training_budget(self) -> float:
        """The seconds of --time-budget training may use (the rest is kept: final_reserve)."""
        assert self.cfg.time_budget is not None
        return max(self.cfg.time_budget - self.reserve, 1e-9)

    def _agree(
        self,
        stop: bool,
        signals: StopOnSignal | None,
        *,
        elapsed: float | None = None,
        reserve: float | None = None,
    ) -> tuple[bool, int | None]:
        """Whether to stop (and on which signal), the same on every rank.

        The time budget is read from each rank's clock and a signal may reach ranks one step
        apart; one small all-reduce (max) per step makes them all stop after the same step.
        The same all-reduce agrees on the time used (``self.time_used``), from which a
        schedule that decays within the time budget sets the next step's learning rate: every
        rank must take the same one, so the time kept for the final validation (``reserve``,
        measured on rank 0) is agreed too.
        """
        signum = signals.received if signals is not None else None
        if elapsed is None:
            elapsed = self.time_used
        if reserve is None:
            reserve = self.reserve
        if not self.world.distributed:
            self.time_used, self.reserve = elapsed, reserve
            return stop, signum
        flags = dist_.all_reduce_max(
            [float(stop), float(signum or 0), elapsed, reserve], self.device
        )
        self.time_used, self.reserve = flags[2], flags[3]
        return bool(flags[0]), (int(flags[1]) or None)

    def _deadline(self) -> float | None:
        """When translating the validation pairs must stop (--final-eval auto or none under
        --time-budget): FINAL_EVAL_SHARE of the budget after its end, or after now for a run
        that trained no step here (already at its end)."""
        budget = self.cfg.time_budget
        if budget is None or self.cfg.final_eval == "full":
            return None
        if self.budget_end is None or self.paced_from is None:
            return time.perf_counter() + FINAL_EVAL_SHARE * budget
        return self.budget_end + FINAL_EVAL_SHARE * budget
