"""The optimisation loop proper: steps, and when to log, evaluate, save and stop.

``train()`` (tformer.training.run) sets a run up; ``TrainingLoop`` runs it, with its parts in
their own modules: the data position and RNG (state), the clock and --time-budget (budget),
run checkpoints (saving), validation and best/ (best), signals, numerical faults (faults) and
reporting. A resumed run repeats an uninterrupted one bit for bit on a CPU. Under torchrun
every rank runs the loop; only rank 0 evaluates, logs and saves.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tformer import checkpoint as ckpt
from tformer.config import ModelConfig, TrainConfig
from tformer.data.batching import Batch, BatchPlan
from tformer.data.pairs import EncodedSplit
from tformer.errors import (
    OutOfMemoryError,
    TrainingInterrupted,
)
from tformer.fast import sharing
from tformer.model import TransformerBase
from tformer.training.best import BestKeeper
from tformer.training.budget import PACE_STEPS, TimeBudget
from tformer.training.distributed import World, wrap_for_training
from tformer.training.ema import WeightAverage, averaged
from tformer.training.faults import NumericsGuard, is_out_of_memory, last_good
from tformer.training.loggers import MetricLogger, Records
from tformer.training.loss import scaled_loss
from tformer.training.optim import lr_at
from tformer.training.precision import Precision
from tformer.training.reporting import LossWindow, Reporter, TrainResult
from tformer.training.saving import RunSaver
from tformer.training.signals import StopOnSignal, exit_code
from tformer.training.state import Position, batch_stream, kept_rng, step_batches
from tformer.training.threads import threads_state
from tformer.training.validation import FinalScores, final_scores

Micro = tuple[int, int, np.ndarray]  # (epoch, batch index, example indices)
class TrainingLoop(TimeBudget):
    """Runs the steps of one run and decides when to log, evaluate, save and stop."""

    def __init__(
        self,
        model: TransformerBase,
        optimizer: torch.optim.Optimizer,
        cfg: TrainConfig,
        model_config: ModelConfig,
        tokenizers: ckpt.Tokenizers,
        splits: dict[str, EncodedSplit],
        device: torch.device,
        out: Path,
        report: Reporter,
        *,
        precision: Precision,
        world: World,
        data: dict[str, Any] | None = None,
        init_from: dict[str, Any] | None = None,
        loggers: Sequence[MetricLogger] = (),
        free: tuple[str, ...] = (),
    ) -> None:
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.model_config, self.tokenizers, self.splits = model_config, tokenizers, splits
        self.device, self.out, self.report = device, out, report
        self.precision, self.world = precision, world
        self.data = data  # the training data's fingerprint, saved with each checkpoint
        self.init_from = init_from  # fine-tuning: the checkpoint the run started from
        self.records = Records(out, report, loggers)
        self.scaler = precision.scaler()
        self.forward = wrap_for_training(model, device, world, cfg.compile)
        # Only rank 0 evaluates and saves, so only it needs the average.
        self.ema = (
            WeightAverage(model, cfg.ema_decay) if cfg.ema_decay > 0 and world.is_main else None
        )
        self.guard = NumericsGuard(device, out, precision.name)
        self.window = LossWindow(device, world)
        self.keeper = BestKeeper(cfg, out, tokenizers, self.records)
        self.saver = RunSaver(model, optimizer, cfg, tokenizers, out, self.ema)
        self.last_train: float | None = None
        self.time_used = 0.0  # seconds of the time budget used, agreed by every rank
        self.saved_step: int | None = None
        self.warmup_noted = False
        # The run's warm-up in steps once fixed (--warmup-share cuts it to the run's length):
        # fixed once and saved, so a resumed or longer run keeps it.
        self.warmup: int | None = None if cfg.warmup_share is not None else cfg.warmup_steps
        # --fit-budget: the settings it may choose, and the run's length once fitted (saved).
        self.free, self.fitted = free, None
        # (step, tokens, time used) after this process's first step: the pace is timed from
        # there, without that step's one-off set-up.
        self.paced_from: tuple[int, int, float] | None = None
        self.waited = 0.0  # seconds this process waited for its turn to step (fast.sharing)
        # Seconds of --time-budget training keeps back for the final validation (agreed by
        # every rank); training stops that long before the budget ends.
        self.reserve = 0.0
        self.budget_end: float | None = None  # when --time-budget ends, on perf_counter()
        self.final: FinalScores | None = None  # the last evaluation's greedy outputs, scored
        split = splits.get("validation")
        self.val_tokens = sum(len(t) for _, t in split.pairs) if split is not None else 0

    def restore(self, state: dict[str, Any], extra: dict[str, torch.Tensor]) -> None:
        """Take back the bookkeeping saved in a checkpoint's trainer state."""
        self.window.restore(state.get("window", {}))
        self.last_train = state.get("last_train")
        self.init_from = state.get("init_from", self.init_from)
        self.guard.skipped = int(state.get("skipped", 0))
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.keeper.restore(state)
        self.saver.restore(extra)
        fixed = state.get("warmup")
        if isinstance(fixed, dict) and fixed.get("of") == self._warmup_basis():
            self.warmup = int(fixed["steps"])
        self.fitted = state.get("fitted")

    def run(self, plan: BatchPlan, pos: Position, total_steps: int | None) -> TrainResult:
        if self._should_stop(pos, total_steps):
            self.report.message(
                f"the run is already at step {pos.step}, where it was set to stop; raise "
                "--max-steps, --epochs or --time-budget to train further"
            )
        try:
            with StopOnSignal() as signals:
                self._train(plan, pos, total_steps, signals)
        except RuntimeError as error:
            if not is_out_of_memory(error):
                raise
            raise OutOfMemoryError(
                f"step {pos.step + 1}: out of memory on {self.device} with batches of up to "
                f"{self.cfg.max_tokens} padded tokens (--max-tokens {self.cfg.max_tokens}, "
                f"--accumulate {self.cfg.accumulate}); lower --max-tokens (and raise "
                f"--accumulate to keep the effective batch){last_good(self.out)}"
            ) from error
        return self._finish(pos, plan)

    def _train(
        self, plan: BatchPlan, pos: Position, total_steps: int | None, signals: StopOnSignal
    ) -> None:
        cfg, world = self.cfg, self.world
        stream = batch_stream(plan, pos)
        started = time.perf_counter() - pos.elapsed
        if cfg.time_budget is not None:
            self.budget_end = started + cfg.time_budget
        self.time_used = pos.elapsed
        window_start, window_tokens_seen = time.perf_counter(), 0
        stop = self._should_stop(pos, total_steps)
        if self.warmup is None and total_steps is not None and cfg.time_budget is None:
            self._fix_warmup(total_steps, "")
        if total_steps is not None:
            self._warn_long_warmup(total_steps, "")
        cfg = self._fit_when_due(pos, total_steps, plan)
        while not stop:
            # One optimizer step takes ranks x accumulate batches of the one global order;
            # rank r computes every world-th of them, so the step equals a single process
            # accumulating them all.
            micro = [next(stream) for _ in range(step_batches(cfg.accumulate, world.world_size))]
            sharing.rebalance()  # marks the run busy; its own threads stay (training.threads)
            # Ranks of one run step together; separate runs take turns (fast.sharing).
            queued = time.perf_counter()
            with sharing.turn() if world.world_size == 1 else contextlib.nullcontext():
                self.waited += time.perf_counter() - queued
                loss_sum, n_tokens = self._step(plan, micro, pos.step + 1, total_steps)
            pos.step += 1
            last_epoch, last_index, _ = micro[-1]
            pos.epoch, pos.batch = last_epoch, last_index + 1
            pos.tokens += n_tokens
            self.window.add(loss_sum, n_tokens)
            window_tokens_seen += n_tokens
            pos.elapsed = time.perf_counter() - started
            reserve = self.final_reserve(pos)
            stop, signalled = self._agree(
                self._should_stop(pos, total_steps, reserve),
                signals,
                elapsed=pos.elapsed,
                reserve=reserve,
            )
            if self.paced_from is None:
                self.paced_from, self.waited = (pos.step, pos.tokens, self.time_used), 0.0
            elif self.warmup is None and pos.step - self.paced_from[0] >= PACE_STEPS:
                self._fix_warmup_in_budget(pos, total_steps)
            cfg = self._fit_when_due(pos, total_steps, plan)
            on_cadence = pos.step % cfg.log_every == 0
            if on_cadence or stop:
                now = time.perf_counter()
                self._log(
                    pos, plan, total_steps, window_tokens_seen / max(now - window_start, 1e-9)
                )
                window_start, window_tokens_seen = now, 0
                if cfg.time_budget is not None and pos.elapsed > 0:
                    reach = int(pos.step * self._training_budget() / pos.elapsed)
                    self._warn_long_warmup(reach, ", about, at this speed, in --time-budget")
                if on_cadence:  # a final off-cadence line leaves the window to a resumed run
                    self.window.reset()
            if pos.step % cfg.eval_every == 0 or stop:
                self._evaluate(pos, final=stop)
                if self._agree(self.keeper.stopped_early, None)[0] and not stop:
                    self.keeper.stopped_early = stop = True
            if pos.step % cfg.save_every == 0 or stop:
                self._save(pos)
            if signalled is not None and not stop:
                self._stop_on_signal(pos, signalled)

    def _stop_on_signal(self, pos: Position, signum: int) -> None:
        if self.saved_step != pos.step:
            self._save(pos)
        name = signal.Signals(signum).name
        raise TrainingInterrupted(
            f"stopped by {name} after step {pos.step}; checkpoint "
            f"{self.out / ckpt.checkpoint_name(pos.step)} saved. Resume with: "
            f"tformer train --resume {self.out}",
            exit_code(signum),
        )

    def _step(
        self, plan: BatchPlan, micro: list[Micro], step: int, total_steps: int | None
    ) -> tuple[torch.Tensor, int]:
        """One optimizer step over the micro-batches; returns the summed loss and tokens."""
        world = self.world
        # Normalise by the target tokens of the whole (global) step, so accumulating k batches
        # equals one batch k times larger, and n ranks equal one process. Every rank knows
        # every batch of the step, so this needs no communication.
        n_tokens = sum(plan.target_tokens(indices, epoch) for epoch, _, indices in micro)
        mine = micro[world.rank :: world.world_size]
        batches = [plan.collate(indices, epoch) for epoch, _, indices in mine]
        budget = self.cfg.time_budget
        fraction = min(self.time_used / self._training_budget(), 1.0) if budget else None
        lr = lr_at(step, self.model_config, self.cfg, total_steps, fraction, self.warmup)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            total += self._backward(batch, n_tokens, last=i == len(batches) - 1)
        self._update(step, total)
        self.optimizer.zero_grad(set_to_none=True)
        return total, n_tokens

    def _backward(self, batch: Batch, n_tokens: int, *, last: bool) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns its (detached) summed loss."""
        world = self.world
        batch = batch.to(self.device)
        # Gradients are all-reduced once per step, on the last micro-batch only.
        sync = last or not world.distributed
        # DDP averages gradients over ranks; we want the sum.
        factor = (world.world_size if world.distributed else 1) / n_tokens
        with contextlib.nullcontext() if sync else self.forward.no_sync():  # type: ignore[operator]
            with self.precision.autocast():
                logits = self.forward(batch.src, batch.tgt_in).logits
                loss, scaled = scaled_loss(
                    logits, batch.tgt_out, self.cfg.label_smoothing, factor, fused=self.cfg.compile
                )
            if self.scaler is not None:
                scaled = self.scaler.scale(scaled)
            scaled.backward()
        return loss.detach()

    def _update(self, step: int, loss: torch.Tensor) -> None:
        """Clip and apply the gradients (mixed precision skips a step that overflowed)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.cfg.clip_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.clip_norm)
        else:
            grad_norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad.detach()) for p in params])  # type: ignore[union-attr]
            )
        if not self.precision.mixed:
            self.guard.watch(step, loss, grad_norm)
            self.optimizer.step()
        elif self.scaler is not None:
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)  # skips the update itself on inf / NaN gradients
            self.scaler.update()
            skipped = self.scaler.get_scale() < before
            self.guard.count(step, skipped)
            if skipped:
                return
        else:
            # The finiteness check reads one value from the device per step.
            skipped = not bool(torch.isfinite(grad_norm))
            if not skipped:
                self.optimizer.step()
            self.guard.count(step, skipped)
            if skipped:
                return
        if self.ema is not None:
            self.ema.update()

    def _should_stop(self, pos: Position, total_steps: int | None, reserve: float = 0.0) -> bool:
        """Whether the run is at its end: its steps, or its time budget but for ``reserve``
        seconds kept for the final validation."""
        if total_steps is not None and pos.step >= total_steps:
            return True
        budget = self.cfg.time_budget
        return budget is not None and pos.elapsed + reserve >= budget

    def _log(
        self, pos: Position, plan: BatchPlan, total_steps: int | None, tokens_per_s: float
    ) -> None:
        # Reading the loss synchronises with the device: only at log intervals.
        self.guard.check()
        self.last_train = self.window.mean()
        if not self.world.is_main:
            return
        record = {
            "step": pos.step,
            "epoch": round(pos.fractional_epoch(plan), 4),
            "loss": self.last_train,
            "lr": self.optimizer.param_groups[0]["lr"],
            "tokens_per_s": round(tokens_per_s, 1),
            "elapsed": round(pos.elapsed, 2),
            "total_steps": total_steps,
            "time_budget": self.cfg.time_budget,
        }
        if self.cfg.time_budget is not None:  # the rest is kept for the final validation
            record["training_budget"] = round(self._training_budget(), 3)
        if self.precision.mixed:
            record["skipped_steps"] = self.guard.skipped
        self.records.write(record)

    def _evaluate(self, pos: Position, *, final: bool = False) -> None:
        """Validate; the ``final`` evaluation translates the validation pairs once, for its
        BLEU and for the run's final scores (``self.final``)."""
        split = self.splits.get("validation")
        if split is None or not split.pairs or not self.world.is_main:
            return
        self.guard.check()
        translate = self._translate if final and self.model.reads_source else None
        # Kept: the last evaluation falls where the run stops, and a longer or resumed run
        # must draw the same dropout after it as one that never stopped there.
        with averaged(self.ema), kept_rng():
            self.keeper.evaluate(
                self.model, split, pos.step, self.device, self.precision, translate
            )
            if translate is not None and self.cfg.final_eval != "none":
                translate()  # no --val-bleu: the final scores alone
            self.records.attention(self.model, split, pos.step)
        self.keeper.check_patience()

    def _translate(self) -> list[str]:
        """The greedy outputs of the validation split, decoded (and scored) once: all its pairs
        (--final-eval auto / full) or the first --val-bleu (--final-eval none); with auto
        or none under --time-budget, as many as the budget's end allows."""
        if self.final is None:
            cfg, split = self.cfg, self.splits["validation"]
            limit = cfg.val_bleu if cfg.final_eval == "none" else None
            if cfg.final_eval != "none":
                self.report.message(f"translating the validation split ({len(split.pairs)} pairs)")
            self.final = final_scores(
                self.model, split, self.tokenizers, deadline=self._deadline(), limit=limit
            )
        return self.final.outputs

    def _save(self, pos: Position) -> Path | None:
        self.guard.check()
        window = self.window.global_loss()  # a collective: every rank takes part
        if not self.world.is_main:
            self.saved_step = pos.step
            return None
        state: dict[str, Any] = {
            "window": self.window.state(window),
            "last_val": self.keeper.last_val,
            "last_train": self.last_train,
            "skipped": self.guard.skipped,
            "best": self.keeper.state(),
            **threads_state(self.device),
        }
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        if self.data is not None:
            state["data"] = self.data
        if self.init_from is not None:
            state["init_from"] = self.init_from
        if self.fitted is not None:
            state["fitted"] = self.fitted
        if self.cfg.warmup_share is not None and self.warmup is not None:
            state["warmup"] = {"steps": self.warmup, "of": self._warmup_basis()}
        folder = self.saver.save(pos, state)
        self.saved_step = pos.step
        return folder

    def _finish(self, pos: Position, plan: BatchPlan) -> TrainResult:
        epoch = pos.fractional_epoch(plan)
        if not self.world.is_main:
            return TrainResult(self.out, self.out, pos.step, epoch, pos.elapsed, model=self.model)
        result = TrainResult(
            run_dir=self.out,
            checkpoint=ckpt.resolve(self.out),
            step=pos.step,
            epoch=epoch,
            elapsed=pos.elapsed,
            train_loss=self.last_train,
            val_loss=self.keeper.last_val,
            stopped_early=self.keeper.stopped_early,
            skipped_steps=self.guard.skipped,
            model=self.model,
        )
        if self.keeper.best_value is not None:
            result.best = {self.cfg.best_metric: self.keeper.best_value}
        self._measure_exact_match(result, pos.step)
        self.report.finish(result)
        return result

    def _measure_exact_match(self, result: TrainResult, step: int) -> None:
        """``--final-eval``: BLEU / chrF (and exact match for short targets) of greedy outputs
        on the validation split; the test split is for ``tformer evaluate``. The last
        evaluation decoded them (a run stopped early or already at its end decodes them
        here); under a time budget (auto) decoding stops at the budget's end."""
        split = self.splits.get("validation")
        if split is None or not split.pairs or not self.model.reads_source:
            return  # a language model has no output to compare: its loss says it
        if self.cfg.final_eval == "none":
            return
        if self.final is None or self.final.of != len(split.pairs):
            self.final = None
            with averaged(self.ema), kept_rng():
                self._translate()
        assert self.final is not None
        scores = self.final
        result.exact_match, result.samples = scores.exact_match, scores.samples
        result.final = {"bleu": scores.bleu, "chrf": scores.chrf}
        result.final_pairs = (scores.pairs, scores.of)
        result.exact_match_split = "validation"
        record: dict[str, Any] = {
            "step": step,
            "validation_final_bleu": scores.bleu,
            "validation_final_chrf": scores.chrf,
            "validation_final_pairs": scores.pairs,
        }
        if scores.exact_match is not None:
            record["validation_exact_match"] = scores.exact_match
        self.records.write(record)
