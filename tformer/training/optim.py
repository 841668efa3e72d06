"""Optimiser and learning-rate schedules (section 5.3).

The schedules are pure functions of the step (and, for a decay within a time budget, of the
share of the budget used), so a resumed run needs only its saved position.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.autograd.graph import increment_version

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
    return decayed_lr(step, peak, warmup, step_progress(step, warmup, total), floor, "cosine")


def step_progress(step: int, warmup: int, total: int) -> float:
    """How far the decay after warm-up has gone by ``step``, out of ``total`` steps: 0 to 1."""
    return min(max(step - warmup, 0) / max(total - warmup, 1), 1.0)


def time_progress(step: int, warmup: int, time_fraction: float) -> float:
    """How far the decay after warm-up has gone, ``time_fraction`` of the time budget in.

    The decay spans the time after warm-up. When warm-up ended is estimated from the steady
    step rate so far (it ended ``time_fraction * warmup / step`` of the way in), which needs
    no extra state and makes a resumed run compute the same rate.
    """
    if step <= warmup:
        return 0.0
    # warmup / step < 1 here, so warmup_fraction < time_fraction <= 1: the result is in [0, 1].
    warmup_fraction = time_fraction * warmup / step
    return (time_fraction - warmup_fraction) / (1.0 - warmup_fraction)


def decayed_lr(
    step: int, peak: float, warmup: int, progress: float, floor: float, shape: str
) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then a decay to ``floor``: half a
    cosine or a straight line, ``progress`` (0 to 1) of the way down."""
    step = max(step, 1)
    if warmup > 0 and step <= warmup:
        return peak * step / warmup
    if shape == "cosine":
        return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))
    return floor + (peak - floor) * (1.0 - progress)


# The share of a run its warm-up may take under --warmup-share (an imported model's default,
# and what the warning about a warm-up longer than the run suggests): a tenth.
WARMUP_SHARE = 0.1


def capped_warmup(train: TrainConfig, run_steps: float) -> int:
    """The warm-up of a run of ``run_steps`` steps: --warmup-steps, cut with --warmup-share
    to that share of the run (at least one step). The one rule; the training loop fixes the
    result once per run (for a time budget, from the speed of its first steps)."""
    share = train.warmup_share
    if share is None or train.warmup_steps == 0:
        return train.warmup_steps
    return min(train.warmup_steps, max(1, int(share * run_steps)))


def budget_steps(step: int, elapsed: float, budget: float, pace: float) -> float:
    """About how many steps a run of ``budget`` seconds takes: ``step`` done in ``elapsed``
    seconds, and ``pace`` steps a second for the rest."""
    return step + max(budget - elapsed, 0.0) * pace


def lr_at(
    step: int,
    model: ModelConfig,
    train: TrainConfig,
    total_steps: int | None = None,
    time_fraction: float | None = None,
    warmup: int | None = None,
) -> float:
    """The learning rate of optimiser step ``step`` (counted from 1).

    ``cosine`` and ``linear`` decay to ``--min-lr`` by the end of training: by ``total_steps``
    (from --max-steps / --epochs) or, under --time-budget, by the end of the budget
    (``time_fraction`` of it used so far), whichever comes first. A time budget is where
    decaying pays most: a run that stops at full learning rate leaves quality unclaimed.
    Every schedule warms up over ``warmup`` steps: the run's, once the training loop fixed it,
    else --warmup-steps (cut by --warmup-share to ``total_steps`` when that is known).
    """
    peak = peak_lr(model, train)
    if warmup is None:
        warmup = train.warmup_steps if total_steps is None else capped_warmup(train, total_steps)
    if train.schedule == "inverse-sqrt":
        return inverse_sqrt_lr(step, peak, warmup)
    if train.schedule in ("cosine", "linear"):
        progress = []
        if total_steps is not None:
            progress.append(step_progress(step, warmup, total_steps))
        if time_fraction is not None:
            progress.append(time_progress(step, warmup, time_fraction))
        if not progress:
            raise ValueError(f"the {train.schedule} schedule needs a step or time limit")
        return decayed_lr(step, peak, warmup, max(progress), train.min_lr, train.schedule)
    warm = min(step / warmup, 1.0) if warmup > 0 else 1.0
    return peak * warm


def build_optimizer(model: nn.Module, train: TrainConfig) -> torch.optim.Adam:
    """Adam (beta2 0.98, eps 1e-9 by default); AdamW-style decay only when asked for."""
    params = [p for p in model.parameters() if p.requires_grad]
    betas = (train.beta1, train.beta2)
    kernels = update_kernels(params)
    optimizer: torch.optim.Adam
    if train.weight_decay > 0:
        optimizer = torch.optim.AdamW(
            params, lr=0.0, betas=betas, eps=train.eps, weight_decay=train.weight_decay, **kernels
        )
    else:
        optimizer = torch.optim.Adam(params, lr=0.0, betas=betas, eps=train.eps, **kernels)
    if kernels.get("fused"):
        # torch's fused kernels write the weights without counting a change (``_version``),
        # and the decoding caches (packed weights, stacked projections, captured steps) key on
        # that count: counted here, validation never decodes with the weights of a step before.
        optimizer.register_step_post_hook(lambda *_: increment_version(params))
    return optimizer


# Devices where torch's fused Adam runs: one pass over weights, gradients and moments per
# tensor, where foreach's kernels make a pass per operation (docs/performance.md measures it).
_FUSED_ADAM_DEVICES = frozenset({"cuda", "cpu"})


def update_kernels(params: list[torch.nn.Parameter]) -> dict[str, bool]:
    """How Adam updates the weights: in fused kernels where all of them live on a device that
    has them, elsewhere with foreach (a few kernels over all tensors instead of one Python
    loop per parameter)."""
    devices = {p.device.type for p in params}
    if len(devices) == 1 and devices <= _FUSED_ADAM_DEVICES:
        return {"fused": True}
    return {"foreach": True}
