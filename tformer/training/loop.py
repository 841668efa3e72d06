"""The optimisation loop: steps, logging, evaluation, checkpoints, signals, numerical faults.

``train()`` (tformer.train) sets a run up; ``TrainingLoop`` runs it. Reliability: a checkpoint
holds everything the trajectory depends on (weights, optimizer, every RNG, the data position and
the running loss of the next log line), so a resumed run repeats an uninterrupted one bit for
bit on a CPU. SIGINT / SIGTERM finish the step and save first; a NaN / inf loss or gradient
stops fp32 training before anything computed from it is saved (mixed precision skips and counts
such steps). Under torchrun every rank runs the loop; only rank 0 evaluates, logs and saves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import random
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tformer import checkpoint as ckpt
from tformer.config import ModelConfig, TrainConfig
from tformer.data.batching import BatchPlan, collate
from tformer.data.pairs import EncodedSplit
from tformer.errors import (
    Aborted,
    CheckpointError,
    DivergedError,
    OutOfMemoryError,
    TrainingInterrupted,
)
from tformer.fast.malloc import keep_freed_memory
from tformer.model import Transformer
from tformer.training import distributed as dist_
from tformer.training.distributed import World
from tformer.training.ema import WeightAverage
from tformer.training.loss import sequence_loss
from tformer.training.optim import lr_at
from tformer.training.precision import Precision
from tformer.training.validation import evaluate_loss, exact_match, translation_scores

# Mixed precision skips a step whose gradients overflowed; this many in a row means divergence.
MAX_SKIPPED_IN_A_ROW = 25


class Reporter:
    """Receives progress; the default one ignores it. The CLI renders it with Rich."""

    def start(self, summary: dict[str, Any]) -> None: ...

    def log(self, record: dict[str, Any]) -> None: ...

    def message(self, text: str) -> None: ...

    def finish(self, result: TrainResult) -> None: ...


@dataclass
class TrainResult:
    run_dir: Path
    checkpoint: Path
    step: int
    epoch: float
    elapsed: float
    train_loss: float | None = None
    val_loss: float | None = None
    best: dict[str, float] = field(default_factory=dict)
    stopped_early: bool = False
    skipped_steps: int = 0
    # The trained model in memory (on rank 0 with EMA: the raw, not the averaged, weights).
    model: Transformer | None = field(default=None, repr=False)
    exact_match: float | None = None
    exact_match_split: str | None = None
    samples: list[dict[str, str]] = field(default_factory=list)


def rng_state() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Every random state that shapes training: JSON-able parts and tensors apart."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda{i}"] = state
    np_state = np.random.get_state()
    meta = {
        "python": _to_json(random.getstate()),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }
    return meta, tensors


def restore_rng(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    if "python" in meta:
        random.setstate(_from_json(meta["python"]))
    if "numpy" in meta:
        kind, keys, *rest = meta["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), *rest))
    if "torch" in tensors:
        torch.set_rng_state(tensors["torch"])
    cuda = [tensors[f"cuda{i}"] for i in range(len(tensors)) if f"cuda{i}" in tensors]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def _to_json(value: Any) -> Any:
    return [_to_json(v) for v in value] if isinstance(value, (tuple, list)) else value


def _from_json(value: Any) -> Any:
    return tuple(_from_json(v) for v in value) if isinstance(value, list) else value


@dataclass
class Position:
    """Where training stands; everything a resume needs besides weights, optimizer and RNG."""

    step: int = 0
    epoch: int = 0
    batch: int = 0  # next batch index inside ``epoch``
    tokens: int = 0
    elapsed: float = 0.0


def batch_stream(plan: BatchPlan, pos: Position) -> Iterator[tuple[int, int, list[int]]]:
    """(epoch, batch index, example indices) forever, starting at ``pos``."""
    epoch, start = pos.epoch, pos.batch
    while True:
        batches = plan.epoch(epoch)
        for index in range(start, len(batches)):
            yield epoch, index, batches[index]
        epoch, start = epoch + 1, 0


_SIGNAL_EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class StopOnSignal:
    """SIGINT / SIGTERM ask training to stop after the current step, with a checkpoint.

    The handler only records the request: the loop finishes the step, saves, and raises
    ``TrainingInterrupted``. A second signal raises ``Aborted`` at once; saves are atomic, so
    stopping in the middle of one leaves the previous checkpoint intact. Handlers are installed
    only in the main thread (Python allows nothing else) and restored on exit.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNAL_EXIT_CODES:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is not None:
            self._restore()
            raise Aborted(_SIGNAL_EXIT_CODES.get(signum, 130))
        self.received = signum

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def is_out_of_memory(error: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    text = str(error)
    return isinstance(error, oom) or "out of memory" in text or "can't allocate memory" in text


class TrainingLoop:
    """The optimisation loop proper; separate so each part stays short."""

    def __init__(
        self,
        model: Transformer,
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
    ) -> None:
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.model_config, self.tokenizers, self.splits = model_config, tokenizers, splits
        self.device, self.out, self.report = device, out, report
        self.precision, self.world = precision, world
        self.scaler = precision.scaler()
        # What runs the forward pass: the model itself, or it wrapped for data parallelism
        # and/or compiled. Checkpoints always save ``self.model``, so their tensor names carry
        # no ``module.`` or ``_orig_mod.`` prefix and load anywhere.
        self.forward: torch.nn.Module = model
        if world.distributed:
            from torch.nn.parallel import DistributedDataParallel

            # The only buffer is the fixed sinusoid table: no need to sync it every forward.
            sync_flag = (
                "forward_sync_buffers"
                if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                else "broadcast_buffers"
            )
            self.forward = DistributedDataParallel(
                model,
                device_ids=[device.index] if device.type == "cuda" else None,
                **{sync_flag: False},
            )
        if cfg.compile:
            self.forward = torch.compile(self.forward)
        # Only rank 0 evaluates and saves, so only it needs the average.
        self.ema = (
            WeightAverage(model, cfg.ema_decay) if cfg.ema_decay > 0 and world.is_main else None
        )
        self.last_val: float | None = None
        self.last_train: float | None = None
        self.best_value: float | None = None
        self.evals_without_gain = 0
        self.stopped_early = False
        self.time_used = 0.0  # seconds of the time budget used, agreed by every rank
        self.saved_step: int | None = None
        self.skipped = 0
        self.skipped_in_a_row = 0
        # The running sums behind the next logged loss. They are part of the training state:
        # a run resumed between two log lines must log the same loss as an uninterrupted one.
        self.window_loss = torch.zeros((), device=device)
        self.window_tokens = 0
        # The first step whose loss or gradient norm was not finite (0: none yet). Kept on the
        # device and read only where the loop synchronises anyway (log, eval, save).
        self.bad_step = torch.zeros((), dtype=torch.long, device=device)
        self.bad_values = torch.zeros(2, device=device)

    def restore(self, state: dict[str, Any], extra: dict[str, torch.Tensor]) -> None:
        """Take back the bookkeeping saved in a checkpoint's trainer state."""
        window = state.get("window", {})
        if self.world.is_main:  # the saved window is the sum over all ranks
            self.window_loss.fill_(float(window.get("loss", 0.0)))
        self.window_tokens = int(window.get("tokens", 0))
        self.last_val = state.get("last_val")
        self.last_train = state.get("last_train")
        self.skipped = int(state.get("skipped", 0))
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        best = state.get("best")
        if best and best.get("metric") == self.cfg.best_metric:
            self.best_value = best.get("value")
            self.evals_without_gain = int(best.get("evals_without_gain", 0))
        elif self.cfg.best_metric == "val_loss":
            self.best_value = self._saved_best_loss()
        raw = {k.removeprefix("raw."): v for k, v in extra.items() if k.startswith("raw.")}
        if raw:
            # The checkpoint's weights are the average; training continues from the raw ones.
            params = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, tensor in raw.items():
                    if name in params:
                        params[name].copy_(tensor)
            if self.ema is not None:
                self.ema.load({n: p for n, p in self._checkpoint_weights(extra).items()})

    def _checkpoint_weights(self, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k.removeprefix("ema."): v for k, v in extra.items() if k.startswith("ema.")}

    def _saved_best_loss(self) -> float | None:
        best = self.out / ckpt.BEST
        if best.is_dir() and ckpt.is_run_dir(best):
            try:
                metrics = ckpt.read_config(ckpt.resolve(best)).get("metrics") or {}
            except CheckpointError:
                metrics = {}
            return metrics.get("val_loss")
        return None

    def run(self, plan: BatchPlan, pos: Position, total_steps: int | None) -> TrainResult:
        keep_freed_memory()  # every step's tensors would otherwise start as fresh pages
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
                f"--accumulate to keep the effective batch){self._last_good()}"
            ) from error
        return self._finish(pos, plan)

    def _train(
        self, plan: BatchPlan, pos: Position, total_steps: int | None, signals: StopOnSignal
    ) -> None:
        cfg, world = self.cfg, self.world
        stream = batch_stream(plan, pos)
        started = time.perf_counter() - pos.elapsed
        self.time_used = pos.elapsed
        window_start, window_tokens_seen = time.perf_counter(), 0
        stop = self._should_stop(pos, total_steps)
        while not stop:
            # One optimizer step takes ranks x accumulate batches of the one global order;
            # rank r computes every world-th of them, so the step equals a single process
            # accumulating them all.
            micro = [next(stream) for _ in range(cfg.accumulate * world.world_size)]
            loss_sum, n_tokens = self._step(plan, micro, pos.step + 1, total_steps)
            pos.step += 1
            last_epoch, last_index, _ = micro[-1]
            pos.epoch, pos.batch = last_epoch, last_index + 1
            pos.tokens += n_tokens
            self.window_loss += loss_sum
            self.window_tokens += n_tokens
            window_tokens_seen += n_tokens
            pos.elapsed = time.perf_counter() - started
            stop, signalled = self._agree(
                self._should_stop(pos, total_steps), signals, elapsed=pos.elapsed
            )
            on_cadence = pos.step % cfg.log_every == 0
            if on_cadence or stop:
                now = time.perf_counter()
                self._log(
                    pos, plan, total_steps, window_tokens_seen / max(now - window_start, 1e-9)
                )
                window_start, window_tokens_seen = now, 0
                if on_cadence:  # a final off-cadence line leaves the window to a resumed run
                    self.window_loss.zero_()
                    self.window_tokens = 0
            if pos.step % cfg.eval_every == 0 or stop:
                self._evaluate(pos)
                if self._agree(self.stopped_early, None)[0] and not stop:
                    self.stopped_early = stop = True
            if pos.step % cfg.save_every == 0 or stop:
                self._save(pos)
            if signalled is not None and not stop:
                self._stop_on_signal(pos, signalled)

    def _agree(
        self, stop: bool, signals: StopOnSignal | None, *, elapsed: float | None = None
    ) -> tuple[bool, int | None]:
        """Whether to stop (and on which signal), the same on every rank.

        The time budget is read from each rank's clock and a signal may reach ranks one step
        apart; one small all-reduce (max) per step makes them all stop after the same step.
        The same all-reduce agrees on the time used (``self.time_used``), from which a
        schedule that decays within the time budget sets the next step's learning rate: every
        rank must take the same one.
        """
        signum = signals.received if signals is not None else None
        if elapsed is None:
            elapsed = self.time_used
        if not self.world.distributed:
            self.time_used = elapsed
            return stop, signum
        flags = dist_.all_reduce_max([float(stop), float(signum or 0), elapsed], self.device)
        self.time_used = flags[2]
        return bool(flags[0]), (int(flags[1]) or None)

    def _stop_on_signal(self, pos: Position, signum: int) -> None:
        if self.saved_step != pos.step:
            self._save(pos)
        name = signal.Signals(signum).name
        raise TrainingInterrupted(
            f"stopped by {name} after step {pos.step}; checkpoint "
            f"{self.out / ckpt.checkpoint_name(pos.step)} saved. Resume with: "
            f"tformer train --resume {self.out}",
            _SIGNAL_EXIT_CODES.get(signum, 130),
        )

    def _step(
        self,
        plan: BatchPlan,
        micro: list[tuple[int, int, list[int]]],
        step: int,
        total_steps: int | None,
    ) -> tuple[torch.Tensor, int]:
        world = self.world
        # Normalise by the target tokens of the whole (global) step, so accumulating k batches
        # equals one batch k times larger, and n ranks equal one process. Every rank knows
        # every batch of the step, so this needs no communication.
        n_tokens = sum(plan.lengths[i][1] + 1 for _, _, indices in micro for i in indices)
        mine = micro[world.rank :: world.world_size]
        batches = [collate([plan.pairs[i] for i in indices]) for _, _, indices in mine]
        budget = self.cfg.time_budget
        fraction = min(self.time_used / budget, 1.0) if budget else None
        lr = lr_at(step, self.model_config, self.cfg, total_steps, fraction)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            last = i == len(batches) - 1
            # Gradients are all-reduced once per step, on the last micro-batch only.
            sync = last or not world.distributed
            with contextlib.nullcontext() if sync else self.forward.no_sync():
                with self.precision.autocast():
                    logits = self.forward(batch.src, batch.tgt_in).logits
                    loss = sequence_loss(logits, batch.tgt_out, self.cfg.label_smoothing)
                scaled = loss / n_tokens
                if world.distributed:  # DDP averages gradients over ranks; we want the sum
                    scaled = scaled * world.world_size
                if self.scaler is not None:
                    scaled = self.scaler.scale(scaled)
                scaled.backward()
            total += loss.detach()
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.cfg.clip_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.clip_norm)
        else:
            grad_norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad.detach()) for p in params])
            )
        if self.precision.mixed:
            self._mixed_precision_update(step, grad_norm)
        else:
            self._watch_numerics(step, total, grad_norm)
            self.optimizer.step()
            if self.ema is not None:
                self.ema.update()
        self.optimizer.zero_grad(set_to_none=True)
        return total, n_tokens

    def _mixed_precision_update(self, step: int, grad_norm: torch.Tensor) -> None:
        """Take the step unless the gradients overflowed; skip and count it if they did.

        Reduced precision overflows now and then without anything being wrong (fp16 above all,
        where the grad scaler then lowers its scale); only a long run of skipped steps means
        the model diverged. The finiteness check reads one value from the device per step.
        """
        if self.scaler is not None:
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)  # skips the update itself on inf / NaN gradients
            self.scaler.update()
            skipped = self.scaler.get_scale() < before
        else:
            skipped = not bool(torch.isfinite(grad_norm))
            if not skipped:
                self.optimizer.step()
        if not skipped:
            self.skipped_in_a_row = 0
            if self.ema is not None:
                self.ema.update()
            return
        self.skipped += 1
        self.skipped_in_a_row += 1
        if self.skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW:
            raise DivergedError(
                f"step {step}: training diverged ({self.skipped_in_a_row} steps in a row had "
                f"non-finite gradients in {self.precision.name}); stopped without saving "
                f"it{self._last_good()}. Resume from there with a lower --lr, a longer "
                "--warmup-steps or --precision fp32"
            )

    def _watch_numerics(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Remember the first step whose loss or gradient norm is NaN / inf, without a sync.

        In float32 such a step is fatal: ``_check_numerics`` stops training before anything
        computed from it is logged or saved, so the last checkpoint stays good. (Mixed
        precision skips and counts such steps instead: ``_mixed_precision_update``.)
        """
        finite = torch.isfinite(loss) & torch.isfinite(grad_norm)
        first = (self.bad_step == 0) & ~finite
        self.bad_step = torch.where(first, step, self.bad_step)
        values = torch.stack([loss.detach().float(), grad_norm.detach().float()])
        self.bad_values = torch.where(first, values, self.bad_values)

    def _check_numerics(self) -> None:
        step = int(self.bad_step)
        if step == 0:
            return
        loss, norm = (float(v) for v in self.bad_values)
        raise DivergedError(
            f"step {step}: training diverged (loss {loss}, gradient norm {norm}); stopped "
            f"without saving it{self._last_good()}. Resume from there with a lower --lr, a "
            "longer --warmup-steps or a smaller --clip-norm"
        )

    def _last_good(self) -> str:
        try:
            return f"; the last good checkpoint {ckpt.resolve(self.out)} is kept"
        except CheckpointError:
            return "; no checkpoint had been saved yet"

    def _should_stop(self, pos: Position, total_steps: int | None) -> bool:
        if total_steps is not None and pos.step >= total_steps:
            return True
        return self.cfg.time_budget is not None and pos.elapsed >= self.cfg.time_budget

    def _global_window_loss(self) -> float:
        if not self.world.distributed:
            return float(self.window_loss)
        return dist_.all_reduce_sum(float(self.window_loss), self.device, self.world)

    def _log(
        self, pos: Position, plan: BatchPlan, total_steps: int | None, tokens_per_s: float
    ) -> None:
        # Reading the loss synchronises with the device: only at log intervals.
        self._check_numerics()
        self.last_train = self._global_window_loss() / max(self.window_tokens, 1)
        if not self.world.is_main:
            return
        epoch = pos.epoch + pos.batch / max(len(plan.epoch(pos.epoch)), 1)
        record = {
            "step": pos.step,
            "epoch": round(epoch, 4),
            "loss": self.last_train,
            "lr": self.optimizer.param_groups[0]["lr"],
            "tokens_per_s": round(tokens_per_s, 1),
            "elapsed": round(pos.elapsed, 2),
            "total_steps": total_steps,
            "time_budget": self.cfg.time_budget,
        }
        if self.precision.mixed:
            record["skipped_steps"] = self.skipped
        ckpt.append_metrics(self.out, record)
        self.report.log(record)

    @contextlib.contextmanager
    def _averaged(self) -> Iterator[None]:
        """The EMA weights in the model for the duration (when EMA is on)."""
        if self.ema is None:
            yield
            return
        self.ema.swap()
        try:
            yield
        finally:
            self.ema.swap()

    def _evaluate(self, pos: Position) -> None:
        split = self.splits.get("validation")
        if split is None or not split.pairs or not self.world.is_main:
            return
        self._check_numerics()
        with self._averaged():
            self.last_val = evaluate_loss(self.model, split, self.device, self.precision)
            record: dict[str, Any] = {
                "step": pos.step,
                "val_loss": round(self.last_val, 5),
                "val_ppl": round(math.exp(min(self.last_val, 50.0)), 4),
            }
            if self.cfg.val_bleu > 0:
                scores = translation_scores(self.model, split, self.tokenizers, self.cfg.val_bleu)
                record.update({f"val_{k}": v for k, v in scores.items()})
            value = record[
                "val_loss" if self.cfg.best_metric == "val_loss" else f"val_{self.cfg.best_metric}"
            ]
            improved = math.isfinite(value) and (
                self.best_value is None
                or (
                    value < self.best_value
                    if self.cfg.best_metric == "val_loss"
                    else value > self.best_value
                )
            )
            if improved:
                self.best_value, self.evals_without_gain = value, 0
                record["best"] = True
                metrics = {k: v for k, v in record.items() if k.startswith("val_")}
                ckpt.save_checkpoint(
                    self.out / ckpt.BEST,
                    model=self.model,
                    train_config=self.cfg,
                    tokenizers=self.tokenizers,
                    step=pos.step,
                    keep_last=1,
                    metrics=metrics,
                )
            else:
                self.evals_without_gain += 1
        ckpt.append_metrics(self.out, record)
        self.report.log(record)
        patience = self.cfg.patience
        if patience is not None and self.evals_without_gain >= patience:
            self.stopped_early = True
            self.report.message(
                f"early stop: {self.cfg.best_metric} has not improved for {patience} "
                f"evaluations (best {self.best_value})"
            )

    def _save(self, pos: Position) -> Path | None:
        self._check_numerics()
        window = self._global_window_loss()  # a collective: every rank takes part
        if not self.world.is_main:
            self.saved_step = pos.step
            return None
        rng_meta, rng_tensors = rng_state()
        state = {
            "position": dataclasses.asdict(pos),
            "rng": rng_meta,
            "window": {"loss": window, "tokens": self.window_tokens},
            "last_val": self.last_val,
            "last_train": self.last_train,
            "skipped": self.skipped,
            "best": {
                "metric": self.cfg.best_metric,
                "value": self.best_value,
                "evals_without_gain": self.evals_without_gain,
            },
        }
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        extra: dict[str, torch.Tensor] = {}
        if self.ema is not None:
            # The checkpoint's weights are the average; the raw ones resume training.
            extra = {f"raw.{n}": p.detach().clone() for n, p in self.model.named_parameters()}
        with self._averaged():
            if self.ema is not None:
                extra.update(
                    {f"ema.{n}": p.detach().clone() for n, p in self.model.named_parameters()}
                )
            folder = ckpt.save_checkpoint(
                self.out,
                model=self.model,
                train_config=self.cfg,
                tokenizers=self.tokenizers,
                step=pos.step,
                optimizer=self.optimizer,
                trainer_state=state,
                rng_state=rng_tensors,
                extra_tensors=extra,
                keep_last=self.cfg.keep_last,
            )
        self.saved_step = pos.step
        return folder

    def _finish(self, pos: Position, plan: BatchPlan) -> TrainResult:
        epoch = pos.epoch + pos.batch / max(len(plan.epoch(pos.epoch)), 1)
        if not self.world.is_main:
            return TrainResult(self.out, self.out, pos.step, epoch, pos.elapsed, model=self.model)
        result = TrainResult(
            run_dir=self.out,
            checkpoint=ckpt.resolve(self.out),
            step=pos.step,
            epoch=epoch,
            elapsed=pos.elapsed,
            train_loss=self.last_train,
            val_loss=self.last_val,
            stopped_early=self.stopped_early,
            skipped_steps=self.skipped,
            model=self.model,
        )
        if self.best_value is not None:
            result.best = {self.cfg.best_metric: self.best_value}
        name = "test" if "test" in self.splits else "validation"
        split = self.splits.get(name)
        if split is not None and split.pairs:
            self.report.message(f"measuring exact match on the {name} split ({len(split.pairs)})")
            with self._averaged():
                result.exact_match, result.samples = exact_match(self.model, split, self.tokenizers)
            result.exact_match_split = name
            ckpt.append_metrics(
                self.out, {"step": pos.step, f"{name}_exact_match": result.exact_match}
            )
        self.report.finish(result)
        return result
