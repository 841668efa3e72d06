"""Optimiser and learning-rate schedules (section 5.3).

The schedules are pure functions of the step, so a resumed run needs only the step count.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tformer.config import ModelConfig, TrainConfig


def peak_lr(model: ModelConfig, train: TrainConfig) -> float:
    """``--lr`` if given, else the paper's peak d_model^-0.5 * warmup^-0.5."""
    if train.lr is not None:
        return train.lr
    return model.d_model**-0.5 * max(train.warmup_steps, 1) ** -0.5


def inverse_sqrt_lr(step: int, peak: float, warmup: int) -> float:
    """lrate = peak * min(step / warmup, sqrt(warmup / step)).

    With peak = d_model^-0.5 * warmup^-0.5 this is exactly the paper's
    d_model^-0.5 * min(step^-0.5, step * warmup^-1.5): linear warm-up, then 1/√step decay.
    """
    step = max(step, 1)
    if warmup <= 0:
        return peak / math.sqrt(step) if step > 1 else peak
    return peak * min(step / warmup, math.sqrt(warmup / step))


def cosine_lr(step: int, peak: float, warmup: int, total: int, floor: float = 0.0) -> float:
    """Linear warm-up to ``peak``, then half a cosine down to ``floor`` at step ``total``."""
    step = max(step, 1)
    if warmup > 0 and step <= warmup:
        return peak * step / warmup
    span = max(total - warmup, 1)
    progress = min((step - warmup) / span, 1.0)
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def lr_at(
    step: int, model: ModelConfig, train: TrainConfig, total_steps: int | None = None
) -> float:
    """The learning rate of optimiser step ``step`` (counted from 1)."""
    peak = peak_lr(model, train)
    if train.schedule == "inverse-sqrt":
        return inverse_sqrt_lr(step, peak, train.warmup_steps)
    if train.schedule == "cosine":
        if total_steps is None:
            raise ValueError("the cosine schedule needs the total number of steps")
        return cosine_lr(step, peak, train.warmup_steps, total_steps, train.min_lr)
    warm = min(step / train.warmup_steps, 1.0) if train.warmup_steps > 0 else 1.0
    return peak * warm


def build_optimizer(model: nn.Module, train: TrainConfig) -> torch.optim.Adam:
    """Adam (beta2 0.98, eps 1e-9 by default); AdamW-style decay only when asked for."""
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = dict(lr=0.0, betas=(train.beta1, train.beta2), eps=train.eps)
    # foreach updates all tensors in a few kernels instead of one Python loop per parameter.
    if train.weight_decay > 0:
        return torch.optim.AdamW(params, weight_decay=train.weight_decay, foreach=True, **kwargs)
    return torch.optim.Adam(params, foreach=True, **kwargs)
