"""Where a run stands besides its weights and optimizer: the data position and every RNG.

A checkpoint holds both, so a resumed run repeats an uninterrupted one bit for bit on a CPU.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tformer.data.batching import BatchPlan


def step_batches(accumulate: int, world_size: int) -> int:
    """Batches one optimizer step takes: ``accumulate`` on each of ``world_size`` ranks, from
    one global order (tformer.training.loop)."""
    return accumulate * world_size


def steps_per_epoch(plan: BatchPlan, epoch: int, accumulate: int, world_size: int) -> float:
    """Optimizer steps in ``epoch`` of ``plan`` (a fraction when the batches do not divide)."""
    return len(plan.epoch(epoch)) / step_batches(accumulate, world_size)


@dataclass
class Position:
    """Where training stands; everything a resume needs besides weights, optimizer and RNG."""

    step: int = 0
    epoch: int = 0
    batch: int = 0  # next batch index inside ``epoch``
    tokens: int = 0
    elapsed: float = 0.0

    def fractional_epoch(self, plan: BatchPlan) -> float:
        """Epochs done, counting the part of the current one."""
        return self.epoch + self.batch / max(len(plan.epoch(self.epoch)), 1)


def batch_stream(plan: BatchPlan, pos: Position) -> Iterator[tuple[int, int, np.ndarray]]:
    """(epoch, batch index, example indices) forever, starting at ``pos``."""
    epoch, start = pos.epoch, pos.batch
    while True:
        batches = plan.epoch(epoch)
        for index in range(start, len(batches)):
            yield epoch, index, batches[index]
        epoch, start = epoch + 1, 0


def rng_state() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Every random state that shapes training: JSON-able parts and tensors apart."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda{i}"] = state
    np_state: Any = np.random.get_state()
    meta = {
        "python": _to_json(random.getstate()),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }
    return meta, tensors


def restore_rng(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Put back the random states ``rng_state`` returned (as read from a checkpoint)."""
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


@contextlib.contextmanager
def kept_rng() -> Iterator[None]:
    """Leave every random state as it was found: validation (greedy decoding draws a seed)
    then takes nothing from the streams that shape training, whenever it runs."""
    meta, tensors = rng_state()
    try:
        yield
    finally:
        restore_rng(meta, tensors)


def _to_json(value: Any) -> Any:
    return [_to_json(v) for v in value] if isinstance(value, (tuple, list)) else value


def _from_json(value: Any) -> Any:
    return tuple(_from_json(v) for v in value) if isinstance(value, list) else value
