"""What a run reports: progress to a ``Reporter``, lines of metrics.jsonl, the final result.

The library stays silent: progress goes to a ``Reporter`` and the CLI decides how to show it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tformer.model import TransformerBase
from tformer.training import distributed as dist_
from tformer.training.distributed import World


class Reporter:
    """Receives progress; the default one ignores it. The CLI renders it with Rich."""

    def tokenising(self, split: str, done: int, total: int) -> None:
        """Progress of tokenising ``split`` (pairs done of ``total``), before ``start``."""

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
    model: TransformerBase | None = field(default=None, repr=False)
    # Exact match of greedy outputs on the validation split where the targets are a few words
    # (the test split is left to ``tformer evaluate``; --final-eval).
    exact_match: float | None = None
    exact_match_split: str | None = None
    samples: list[dict[str, str]] = field(default_factory=list)
    # BLEU and chrF of the same greedy outputs, on (pairs translated, pairs in the split).
    final: dict[str, float] = field(default_factory=dict)
    final_pairs: tuple[int, int] | None = None


class LossWindow:
    """The running sums behind the next logged loss.

    They are part of the training state: a run resumed between two log lines must log the
    same loss as an uninterrupted one. The loss stays on the device until a log line reads it.
    """

    def __init__(self, device: torch.device, world: World) -> None:
        self.device, self.world = device, world
        self.loss = torch.zeros((), device=device)
        self.tokens = 0

    def add(self, loss_sum: torch.Tensor, tokens: int) -> None:
        self.loss += loss_sum
        self.tokens += tokens

    def global_loss(self) -> float:
        """The summed loss over every rank (a collective: every rank must call it)."""
        if not self.world.distributed:
            return float(self.loss)
        return dist_.all_reduce_sum(float(self.loss), self.device, self.world)

    def mean(self) -> float:
        return self.global_loss() / max(self.tokens, 1)

    def reset(self) -> None:
        self.loss.zero_()
        self.tokens = 0

    def state(self, global_loss: float) -> dict[str, Any]:
        return {"loss": global_loss, "tokens": self.tokens}

    def restore(self, window: dict[str, Any]) -> None:
        if self.world.is_main:  # the saved window is the sum over all ranks
            self.loss.fill_(float(window.get("loss", 0.0)))
        self.tokens = int(window.get("tokens", 0))
