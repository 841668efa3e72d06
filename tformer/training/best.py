"""Validation during training: the best checkpoint (best/) and early stopping."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tformer import checkpoint as ckpt
from tformer.config import TrainConfig
from tformer.data.pairs import EncodedSplit
from tformer.errors import CheckpointError
from tformer.model import TransformerBase
from tformer.training.loggers import Records
from tformer.training.precision import Precision
from tformer.training.validation import evaluate_loss, text_scores, translation_scores


class BestKeeper:
    """Evaluates the validation split, keeps the best checkpoint and counts evaluations since.

    ``best_metric`` decides what "best" means (lower loss, higher BLEU / chrF); ``patience``
    evaluations without a better one stop the run.
    """

    def __init__(
        self, cfg: TrainConfig, out: Path, tokenizers: ckpt.Tokenizers, records: Records
    ) -> None:
        self.cfg, self.out, self.tokenizers, self.records = cfg, out, tokenizers, records
        self.last_val: float | None = None
        self.best_value: float | None = None
        self.evals_without_gain = 0
        self.stopped_early = False
        self.loss_seconds: float | None = None  # what the last validation loss took

    def state(self) -> dict[str, Any]:
        return {
            "metric": self.cfg.best_metric,
            "value": self.best_value,
            "evals_without_gain": self.evals_without_gain,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Take back a checkpoint's ``last_val`` and ``best`` (same metric only)."""
        self.last_val = state.get("last_val")
        best = state.get("best")
        if best and best.get("metric") == self.cfg.best_metric:
            self.best_value = best.get("value")
            self.evals_without_gain = int(best.get("evals_without_gain", 0))
        elif self.cfg.best_metric == "val_loss":
            self.best_value = self._saved_best_loss()

    def _saved_best_loss(self) -> float | None:
        """The validation loss recorded in best/ (checkpoints from before ``best`` was saved)."""
        best = self.out / ckpt.BEST
        if best.is_dir() and ckpt.is_run_dir(best):
            try:
                metrics = ckpt.read_config(ckpt.resolve(best)).get("metrics") or {}
            except CheckpointError:
                metrics = {}
            return metrics.get("val_loss")
        return None

    def evaluate(
        self,
        model: TransformerBase,
        split: EncodedSplit,
        step: int,
        device: torch.device,
        precision: Precision,
        translate: Callable[[], list[str]] | None = None,
    ) -> None:
        """Measure ``split``, save best/ on improvement, log the record (model as it is now).

        ``translate``: the greedy outputs of the split's first pairs, decoded once for this
        evaluation and the run's final scores (the last evaluation); BLEU and chrF are then
        of the first ``--val-bleu`` of them (of all, when a time budget cut them shorter)."""
        started = time.perf_counter()
        self.last_val = evaluate_loss(model, split, device, precision, self.cfg)
        self.loss_seconds = time.perf_counter() - started
        record: dict[str, Any] = {
            "step": step,
            "val_loss": round(self.last_val, 5),
            "val_ppl": round(math.exp(min(self.last_val, 50.0)), 4),
        }
        if self.cfg.val_bleu > 0:
            if translate is None:
                scores = translation_scores(model, split, self.tokenizers, self.cfg.val_bleu)
            else:
                outputs = translate()[: self.cfg.val_bleu]
                scores = text_scores(outputs, [t for _, t in split.texts[: len(outputs)]])
            record.update({f"val_{k}": v for k, v in scores.items()})
        metric = self.cfg.best_metric
        value = record["val_loss" if metric == "val_loss" else f"val_{metric}"]
        if self._improves(value):
            self.best_value, self.evals_without_gain = value, 0
            record["best"] = True
            self._save_best(model, step, {k: v for k, v in record.items() if k.startswith("val_")})
        else:
            self.evals_without_gain += 1
        self.records.write(record)

    def check_patience(self) -> None:
        patience = self.cfg.patience
        if patience is not None and self.evals_without_gain >= patience:
            self.stopped_early = True
            self.records.report.message(
                f"early stop: {self.cfg.best_metric} has not improved for {patience} "
                f"evaluations (best {self.best_value})"
            )

    def _improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best_value is None:
            return True
        if self.cfg.best_metric == "val_loss":
            return value < self.best_value
        return value > self.best_value

    def _save_best(self, model: TransformerBase, step: int, metrics: dict[str, float]) -> None:
        ckpt.save_checkpoint(
            self.out / ckpt.BEST,
            model=model,
            train_config=self.cfg,
            tokenizers=self.tokenizers,
            step=step,
            keep_last=1,
            metrics=metrics,
        )
