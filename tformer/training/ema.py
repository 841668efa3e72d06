"""An exponential moving average (EMA) of the weights.

Averaging the weights over the last few thousand steps smooths out the noise of the final
updates, which usually gains a little BLEU for free (as Polyak averaging does). The average is
kept in fp32 beside the model and updated after every optimizer step:

    ema = decay * ema + (1 - decay) * weights

With EMA on, the checkpoints hold the averaged weights (what users evaluate and generate with);
the raw training weights travel in the training state so a resumed run continues exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from tformer.model.transformer import TransformerBase


class WeightAverage:
    """The running average of a model's parameters (a tied matrix is averaged once)."""

    def __init__(self, model: TransformerBase, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay {decay} must be in (0, 1)")
        self.decay = decay
        self.model = model
        # named_parameters lists a tied matrix once; buffers (the sinusoidal table) are fixed.
        self.params = dict(model.named_parameters())
        self.names = list(self.params)
        self.average = {n: p.detach().clone().float() for n, p in self.params.items()}

    @torch.no_grad()
    def update(self) -> None:
        current = [self.params[n].detach().float() for n in self.names]
        averages = [self.average[n] for n in self.names]
        # One fused kernel over all tensors: avg += (1 - decay) * (w - avg).
        torch._foreach_lerp_(averages, current, 1.0 - self.decay)

    @torch.no_grad()
    def swap(self) -> None:
        """Exchange the model's weights and the average (call twice to undo)."""
        for name, param in self.params.items():
            held = param.detach().clone().float()
            param.copy_(self.average[name])
            self.average[name] = held

    def load(self, tensors: dict[str, torch.Tensor]) -> None:
        missing = sorted(set(self.names) - set(tensors))
        if missing:
            raise KeyError(f"EMA state lacks {missing[:3]}")
        for name in self.names:
            device = self.average[name].device
            self.average[name] = tensors[name].detach().clone().float().to(device)


@contextlib.contextmanager
def averaged(ema: WeightAverage | None) -> Iterator[None]:
    """The average's weights in the model for the duration (nothing changes when EMA is off)."""
    if ema is None:
        yield
        return
    ema.swap()
    try:
        yield
    finally:
        ema.swap()
