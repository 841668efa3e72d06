"""The run's own checkpoints: what goes in beside the weights, and taking it back on resume.

A checkpoint holds everything the trajectory depends on (weights, optimizer, every RNG, the data
position and the running loss of the next log line). With EMA on, its weights are the average
(what users evaluate and generate with) and the raw training weights travel as extra tensors.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from tformer import checkpoint as ckpt
from tformer.config import TrainConfig
from tformer.model import TransformerBase
from tformer.training.ema import WeightAverage, averaged
from tformer.training.state import Position, rng_state


class RunSaver:
    """Writes step checkpoints of one run and restores their extra tensors."""

    def __init__(
        self,
        model: TransformerBase,
        optimizer: torch.optim.Optimizer,
        cfg: TrainConfig,
        tokenizers: ckpt.Tokenizers,
        out: Path,
        ema: WeightAverage | None,
    ) -> None:
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.tokenizers, self.out, self.ema = tokenizers, out, ema

    def save(self, pos: Position, state: dict[str, Any]) -> Path:
        """Save step ``pos.step`` with ``state`` (the loop's bookkeeping) plus position and RNG."""
        rng_meta, rng_tensors = rng_state()
        state = {"position": dataclasses.asdict(pos), "rng": rng_meta, **state}
        extra: dict[str, torch.Tensor] = {}
        if self.ema is not None:
            # The checkpoint's weights are the average; the raw ones resume training.
            extra = self._weights("raw.")
        with averaged(self.ema):
            if self.ema is not None:
                extra.update(self._weights("ema."))
            return ckpt.save_checkpoint(
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

    def _weights(self, prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}{n}": p.detach().clone() for n, p in self.model.named_parameters()}

    def restore(self, extra: dict[str, torch.Tensor]) -> None:
        """Continue from the raw weights (and the average) when the checkpoint has them."""
        raw = {k.removeprefix("raw."): v for k, v in extra.items() if k.startswith("raw.")}
        if not raw:
            return
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in raw.items():
                if name in params:
                    params[name].copy_(tensor)
        if self.ema is not None:
            self.ema.load(
                {k.removeprefix("ema."): v for k, v in extra.items() if k.startswith("ema.")}
            )
