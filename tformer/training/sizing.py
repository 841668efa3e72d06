"""The model's size fitted to a run's length (``--fit-budget``), before its first step.

A budget that holds many epochs of a small corpus is better spent on a narrower, deeper model
that takes more steps: on Multi30k a model of half the width with one more layer in each
stack, at 0.6 of the step's cost, beat the recipe's size on validation in both the hour (26
epochs at the recipe's size) and 90 minutes (36) of a 2-core CPU, and three quarters of the
width read as high as half in the 90 minutes (docs/training.md). The size must be chosen
before the first step, so a ``--time-budget`` run times a few optimizer steps of the
configured model on its own first batches (on a copy, every random stream kept) and reads from
them the epochs the budget holds; a run of known length (``--max-steps``, ``--epochs``) needs
no timing. Only an encoder-decoder whose size was given neither as flags nor in ``--config``
is changed, and only a new run (a resumed one keeps its checkpoint's size).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Collection
from fractions import Fraction

from tformer.config import ModelConfig, TrainConfig
from tformer.data.batching import Batch, BatchPlan
from tformer.errors import ConfigError
from tformer.fast.accelerate import accelerate
from tformer.model import TransformerBase, build_model
from tformer.training import distributed as dist_
from tformer.training.distributed import World
from tformer.training.dryrun import optimizer_stepper, synchronize
from tformer.training.fit import SIZE_FIELDS, STEP_FIELDS, changed_fields
from tformer.training.precision import Precision, resolve_precision
from tformer.training.setup import Setup
from tformer.training.state import kept_rng, steps_per_epoch


@dataclasses.dataclass(frozen=True)
class Narrowing:
    """A size for a run of ``from_epochs`` epochs or more at the configured size: ``width``
    of d_model and d_ff, one more layer in each stack, and where free the learning rate and
    the warm-up times their factors (a narrower model takes a larger step, and a longer
    warm-up keeps the larger rate stable)."""

    from_epochs: float
    width: Fraction
    lr_factor: Fraction
    warmup_factor: Fraction


# Most epochs first: a run takes the first it reaches. Half the width won over the configured
# size at 26 and 36 epochs; at 36 three quarters read as high on validation, and a larger
# budget is better spent on the wider of two equals. Three quarters from 20 epochs was tried and
# not kept: its lead in the hour did not survive a second run. Nothing is measured below 20
# epochs; the margins cover the timing's error (a run's first steps are slower).
NARROWINGS = (
    Narrowing(32.0, Fraction(3, 4), Fraction(4, 3), Fraction(3, 2)),
    Narrowing(20.0, Fraction(1, 2), Fraction(5, 3), Fraction(2)),
)

# Steps run before the timed ones (allocation, the first passes' slower kernels), then timed.
PROBE_WARMUP = 2
PROBE_STEPS = 6


@dataclasses.dataclass(frozen=True)
class Sizing:
    """The size chosen for the run, and the line that reports it."""

    model: ModelConfig
    train: TrainConfig
    seconds: float  # spent timing steps (0 for a run of known length)
    note: str


def narrowing_for(epochs: float) -> Narrowing | None:
    """The narrower size for a run of ``epochs`` at the configured size, or None to keep it."""
    return next((n for n in NARROWINGS if epochs >= n.from_epochs), None)


def narrower(
    model: ModelConfig, train: TrainConfig, free: Collection[str], narrowing: Narrowing
) -> tuple[ModelConfig, TrainConfig] | None:
    """The model and step that ``narrowing`` makes of ``model``; None when its width leaves
    no valid model (a fraction of a dimension, heads that do not divide it, an odd rotary
    head)."""
    d_model, d_ff = model.d_model * narrowing.width, model.d_ff * narrowing.width
    if d_model.denominator != 1 or d_ff.denominator != 1:
        return None
    try:
        narrow = dataclasses.replace(
            model,
            d_model=int(d_model),
            d_ff=int(d_ff),
            n_encoder_layers=model.n_encoder_layers + 1,
            n_decoder_layers=model.n_decoder_layers + 1,
        )
    except ConfigError:
        return None
    lr = train.lr  # None: the paper's rate, which already follows d_model ** -0.5
    if lr is not None and "lr" in free:
        lr = float(f"{lr * float(narrowing.lr_factor):.6g}")
    warmup = train.warmup_steps
    if "warmup_steps" in free:
        warmup = round(warmup * narrowing.warmup_factor)
    return narrow, dataclasses.replace(train, lr=lr, warmup_steps=warmup)


def sized_setup(
    setup: Setup,
    train: TrainConfig,
    free: Collection[str],
    plan: BatchPlan,
    total_steps: int | None,
    world: World,
) -> tuple[Setup, TrainConfig, Sizing | None]:
    """A new run's set-up and training config at the size --fit-budget chooses (the model
    built anew, on the same device, when the size changes); a resumed or fine-tuned run, or
    one whose size may not change, as it is."""
    if setup.resumed or setup.init_from or not may_resize(setup.model_config, train, free):
        return setup, train, None
    sizing = fit_size(
        setup.model, setup.model_config, train, free, plan, total_steps, setup.precision, world
    )
    if sizing.model == setup.model_config:
        return setup, sizing.train, sizing
    device = next(setup.model.parameters()).device
    model = accelerate(build_model(sizing.model)).to(device).train()
    precision = resolve_precision(train.precision, device, sizing.model)
    resized = dataclasses.replace(
        setup, model=model, model_config=sizing.model, precision=precision
    )
    return resized, sizing.train, sizing


def may_resize(model: ModelConfig, train: TrainConfig, free: Collection[str]) -> bool:
    """Whether --fit-budget may choose this run's size (before anything is timed)."""
    return (
        train.fit_budget
        and model.arch == "encoder-decoder"
        and all(name in free for name in SIZE_FIELDS)
    )


def fit_size(
    model: TransformerBase,
    model_config: ModelConfig,
    train: TrainConfig,
    free: Collection[str],
    plan: BatchPlan,
    total_steps: int | None,
    precision: Precision,
    world: World,
) -> Sizing:
    """Choose the run's size: the first of NARROWINGS whose epochs (at the configured size)
    the run reaches, else the configured one. Call only when :func:`may_resize`."""
    per_epoch = steps_per_epoch(plan, 0, train.accumulate, world.world_size)
    seconds = 0.0
    steps = float(total_steps) if total_steps is not None else float("inf")
    how = ""
    if train.time_budget is not None:
        seconds_per_step, seconds = time_steps(model, train, plan, precision, world)
        steps = min(steps, max(train.time_budget - seconds, 0.0) / seconds_per_step)
        how = (
            f" (its steps timed over {PROBE_STEPS} in {seconds:.1f} s of the budget: "
            f"{seconds_per_step:.2f} s each)"
        )
    epochs = steps / per_epoch
    narrowing = narrowing_for(epochs)
    chosen = narrower(model_config, train, free, narrowing) if narrowing else None
    new_model, new_train = chosen or (model_config, train)
    changes = changed_fields(
        SIZE_FIELDS + STEP_FIELDS, (model_config, train), (new_model, new_train)
    )
    note = (
        f"--fit-budget: about {epochs:,.0f} epochs at this size{how}: "
        f"{', '.join(changes) or 'the size as it is'}"
    )
    return Sizing(new_model, new_train, seconds, note)


def time_steps(
    model: TransformerBase, train: TrainConfig, plan: BatchPlan, precision: Precision, world: World
) -> tuple[float, float]:
    """Seconds per optimizer step of ``model`` on the run's first batches (the slowest rank's,
    so every rank chooses alike), and the seconds the timing took. A copy of the model and an
    optimizer of its own take the steps, one batch each (a step of --accumulate N takes N
    times as long); every random stream is left as it was found."""
    device = next(model.parameters()).device
    batches = plan.epoch(0)
    taken = iter(range(PROBE_WARMUP + PROBE_STEPS))

    def next_batch() -> Batch:
        return plan.collate(batches[next(taken) % len(batches)]).to(device)

    started = time.perf_counter()
    with kept_rng():
        probe = copy.deepcopy(model).train()
        untimed = dataclasses.replace(train, compile=False)  # compiling would be timed
        step = optimizer_stepper(probe, untimed, precision, next_batch)
        for _ in range(PROBE_WARMUP):
            step()
        timed = time.perf_counter()
        for _ in range(PROBE_STEPS):
            step()
        synchronize(device)
        seconds_per_step = train.accumulate * (time.perf_counter() - timed) / PROBE_STEPS
        del probe, step
    if world.distributed:
        seconds_per_step = dist_.all_reduce_max([seconds_per_step], device)[0]
    return max(seconds_per_step, 1e-9), time.perf_counter() - started
