"""``train()``: the whole job behind ``tformer train``, so Python reproduces any CLI run.

Resolve the configs (recipe, ``--config`` file, given values, or the checkpoint being resumed:
tformer.training.configs), relaunch under torchrun when asked for processes (launch), then load
data, get a tokenizer, build the model and hand over to ``TrainingLoop`` (loop), which trains
until a budget runs out, evaluating and checkpointing on the way. Training ends with validation
figures; the test split is left to ``tformer evaluate``. Progress goes to a ``Reporter`` so the
library stays silent and the CLI decides how to show it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tformer import checkpoint as ckpt
from tformer.checkpoint.lock import RunLock, RunLocks
from tformer.checkpoint.run_dir import create_output, prepare_output, resume_target
from tformer.config import ModelConfig, TrainConfig, flag
from tformer.data.batching import BatchPlan
from tformer.data.lm import objective_for
from tformer.data.sources import data_name
from tformer.device import resolve_device, seed_everything
from tformer.errors import ConfigError
from tformer.training import distributed as dist_
from tformer.training.configs import (
    Settings,
    TokenizerSpec,
    changed_settings,
    check_architecture,
    resolve,
    with_older_checkpoint,
)
from tformer.training.distributed import World
from tformer.training.fit import FIT_FIELDS
from tformer.training.init_from import check_not_resuming, check_out
from tformer.training.inputs import (
    check_prepared_options,
    encode_splits,
    get_tokenizers,
)
from tformer.training.launch import Job, RunOptions, train_data_parallel
from tformer.training.loggers import check_installed, log_targets, open_loggers
from tformer.training.loop import TrainingLoop
from tformer.training.loss import sequence_loss
from tformer.training.optim import build_optimizer
from tformer.training.reporting import Reporter, TrainResult
from tformer.training.resuming import restore_training_state
from tformer.training.setup import Setup, set_up
from tformer.training.sizing import sized_setup
from tformer.training.state import Position, step_batches
from tformer.training.threads import keep_threads
from tformer.training.validation import EVAL_BATCH_TOKENS

DEFAULT_EPOCHS = 10.0

# Re-exported: the names users and the CLI know from this module.
__all__ = [
    "EVAL_BATCH_TOKENS",
    "Reporter",
    "Settings",
    "TrainResult",
    "check_architecture",
    "encode_splits",
    "get_tokenizers",
    "plan_job",
    "sequence_loss",
    "train",
    "train_job",
    "with_older_checkpoint",
]


def train(
    model_config: ModelConfig | None = None,
    train_config: TrainConfig | None = None,
    *,
    settings: Settings | None = None,
    out: Path | None = None,
    tokenizer: Path | None = None,
    tokenizer_kind: str | None = None,
    vocab_size: int | None = None,
    shared_vocab: bool | None = None,
    tokenizer_sample: int | None = None,
    resume: bool | str | Path = False,
    overwrite: bool = False,
    strict: bool = False,
    reporter: Reporter | None = None,
    tokenized_cache: Path | None = None,
    num_proc: int | None = None,
    nproc: int | None = None,
    allow_data_change: bool = False,
    init_from: str | Path | None = None,
    log_to: Sequence[str] = (),
) -> TrainResult:
    """Train a model and return where it was saved and how well it did.

    Args:
        model_config: the architecture; vocabulary sizes are filled in from the tokenizer.
            None when resuming (the checkpoint's architecture is used).
        train_config: data, batching, optimisation and stopping. When None, both configs are
            resolved from ``settings`` as `tformer train` does (recipe, config file, values).
        settings: what `tformer train` was asked for (used when ``train_config`` is None).
        out: the run folder (default ``checkpoints/<data name>``).
        tokenizer: a ``tokenizer.json`` to use; trained on the data when None, as
            ``tokenizer_kind`` (bpe), ``vocab_size`` (8000), ``shared_vocab`` (True) say, on at
            most ``tokenizer_sample`` training pairs drawn at random (500,000).
        resume: True to continue the run in ``out`` from its latest checkpoint, or the path of
            a run folder or of one of its ``step-*`` checkpoints. The run then follows exactly
            the trajectory it would have followed uninterrupted (bit for bit on a CPU).
        overwrite: replace the tformer run in ``out``.
        strict: refuse pairs longer than ``max_len`` (or with an empty side) instead of
            skipping and counting them.
        tokenized_cache: a folder where the data is prepared once (``tformer.data.prepare``),
            keyed by data and tokenizer, so the next run over the same data maps it at once.
        num_proc: processes that tokenise a large corpus (with ``tokenized_cache``).
        nproc: train data-parallel with this many processes on this machine (under torchrun).
        allow_data_change: resume even though the training data changed since the checkpoint
            was saved (refused otherwise, naming what changed).
        init_from: fine-tune: start from this checkpoint's (or run folder's latest) weights,
            architecture and tokenizer(s), with a fresh optimizer, schedule and step count.
            A ``model_config`` given with it must agree with the checkpoint's architecture.
        log_to: also send the run's records to "tensorboard" (``out/tensorboard/``), "wandb"
            or "mlflow" (their optional packages must be installed).

    ``plan_job`` and ``train_job`` are its two halves, for a caller that keeps the plan.

    Raises:
        ConfigError, DataError, CheckpointError, DeviceError: for users to act on.
        DivergedError: the loss or a gradient became NaN / inf (the last good checkpoint stays).
        TrainingInterrupted: SIGINT / SIGTERM; a checkpoint was written first.
    """
    options = RunOptions(
        tokenizer=tokenizer,
        overwrite=overwrite,
        strict=strict,
        tokenized_cache=tokenized_cache,
        num_proc=num_proc,
        allow_data_change=allow_data_change,
        log_to=log_targets(log_to),
    )
    check_installed(options.log_to)  # before anything is loaded or written
    spec = {"kind": tokenizer_kind, "vocab_size": vocab_size, "shared": shared_vocab,
            "sample": tokenizer_sample}  # fmt: skip
    tokens = {k: v for k, v in spec.items() if v is not None}
    job = plan_job(model_config, train_config, settings=settings, tokenizer=tokens, out=out,
                   resume=resume, overwrite=overwrite, init_from=init_from)  # fmt: skip
    return train_job(job, options, nproc=nproc, reporter=reporter)


def train_job(
    job: Job,
    options: RunOptions | None = None,
    *,
    nproc: int | None = None,
    reporter: Reporter | None = None,
) -> TrainResult:
    """Run a job as :func:`plan_job` planned it, with ``options`` for its inputs and folder:
    here, or data-parallel under torchrun with ``nproc`` processes (see :func:`train`)."""
    options = options or RunOptions()
    check_prepared_options(job.train, job.tokenizer, options.num_proc)
    if nproc is not None and not dist_.launched_by_torchrun():
        return train_data_parallel(job, options, nproc)
    return _run(job, options, reporter or Reporter())


def plan_job(
    model_config: ModelConfig | None,
    train_config: TrainConfig | None,
    *,
    settings: Settings | None = None,
    tokenizer: dict[str, Any] | None = None,
    out: Path | None = None,
    resume: bool | str | Path = False,
    overwrite: bool = False,
    init_from: str | Path | None = None,
) -> Job:
    """The configs and folders of a run, before anything is loaded or written."""
    start = None if init_from is None else Path(init_from)
    check_not_resuming(start, resume)
    if start is not None:
        start = ckpt.resolve(start)  # a run folder: its latest checkpoint
    if resume is not False and overwrite:
        raise ConfigError("--resume continues a run and --overwrite replaces it; give one")
    if resume is True and out is None:
        raise ConfigError("--resume needs the run folder")
    # The checkpoint to resume, as given: its own errors (missing, foreign) come first.
    given = None if resume is False else Path(resume if resume is not True else out or "")
    if train_config is None:
        if model_config is not None:
            raise ConfigError("give train() both configs, or settings to resolve them from")
        settings = settings or Settings()
        tokens = {**settings.tokenizer, **(tokenizer or {})}
        resolved = resolve(dataclasses.replace(settings, tokenizer=tokens), given, init_from=start)
        model_config, train_config, spec = resolved.model, resolved.train, resolved.tokenizer
        defaults, free = resolved.defaults, resolved.free
    else:
        spec, defaults, free = TokenizerSpec(**(tokenizer or {})), (), FIT_FIELDS
    resume_from: Path | None = None
    if resume is not False:
        out, resume_from = resume_target(out, resume)
    out = Path(out) if out is not None else Path("checkpoints") / data_name(train_config.data)
    if start is not None:
        check_out(start, out, overwrite=overwrite)
    return Job(model_config, train_config, spec, out, resume_from, start, defaults, free)


def _run(job: Job, options: RunOptions, reporter: Reporter) -> TrainResult:
    device = resolve_device(job.train.device)
    # Under torchrun every rank runs this function; only rank 0 writes, locks and reports.
    world = dist_.init_world(device)
    locks = RunLocks(job.out) if world.is_main else None
    try:
        if locks is not None:
            locks.acquire()  # first: a second writer of this folder is refused at once
        inside = locks.inside if locks is not None else None
        return _run_locked(job, options, reporter, world, device, inside)
    finally:
        if locks is not None:
            locks.release()


def _run_locked(
    job: Job,
    options: RunOptions,
    reporter: Reporter,
    world: World,
    device: torch.device,
    lock: RunLock | None,
) -> TrainResult:
    cfg, out = job.train, job.out
    device = dist_.local_device(device, world)
    report = reporter if world.is_main else Reporter()
    if world.is_main:
        prepare_output(out, resume=job.resume_from is not None, overwrite=options.overwrite)
    seed_everything(cfg.seed)
    setup = set_up(job, options, world, device, report)
    setup.model.to(device).train()
    mc = setup.model_config
    objective = objective_for(mc.arch, mc.src_vocab_size, cfg)
    plan = BatchPlan(setup.splits["train"].pairs, cfg.max_tokens, cfg.seed, objective)
    total_steps = _total_steps(cfg, len(plan.epoch(0)), world.world_size)
    setup, cfg, sizing = sized_setup(setup, cfg, job.free, plan, total_steps, world)
    model, resumed = setup.model, setup.resumed
    optimizer = build_optimizer(model, cfg)
    state, extra = restore_training_state(resumed, optimizer, cfg)
    # The time spent choosing the size counts in --time-budget.
    fresh = Position(elapsed=sizing.seconds if sizing else 0.0)
    pos = Position(**state["position"]) if "position" in state else fresh
    if world.rank > 0:
        # Rank 0 follows the single-process RNG stream; the others draw their own dropout
        # masks, from a stream that depends only on (seed, rank, step) so a resume repeats it.
        torch.manual_seed((cfg.seed * 1_000_003 + world.rank * 10_007 + pos.step) % 2**64)
    thread_notes = keep_threads(state, device, job.resume_from)
    # Every check has passed: only now is anything written.
    if world.is_main:
        create_output(
            out,
            resume_step=pos.step if resumed else None,
            overwrite=options.overwrite,
            lock=lock,
        )
    report.start(_summary(job, setup, world, device, plan, total_steps, pos))
    _report_changes(report, setup, cfg, job.defaults)
    if sizing is not None and world.is_main:
        report.message(sizing.note)
    for note in thread_notes:
        report.message(note)
    params = {"model": setup.model_config.to_dict(), "train": cfg.to_dict()}
    loggers = open_loggers(options.log_to, out, params, step=pos.step) if world.is_main else []
    loop = TrainingLoop(
        model,
        optimizer,
        cfg,
        setup.model_config,
        setup.tokenizers,
        setup.splits,
        device,
        out,
        report,
        precision=setup.precision,
        world=world,
        data=setup.data,
        init_from=setup.init_from,
        loggers=loggers,
        free=job.free,
    )
    loop.restore(state, extra)
    try:
        result = loop.run(plan, pos, total_steps)
    except BaseException:
        dist_.close(world)
        raise
    finally:
        for logger in loggers:
            logger.close()
    dist_.close(world, finished=True)
    return result


def _report_changes(
    report: Reporter, setup: Setup, cfg: TrainConfig, defaults: tuple[str, ...]
) -> None:
    """What differs from the resumed checkpoint: training settings, and the data when allowed
    (fine-tuning: where the weights come from, and the imported-model defaults applied)."""
    if setup.init_from is not None:
        report.message(
            f"fine-tuning from {setup.init_from['path']} (step {setup.init_from['step']}): its "
            "weights and tokenizer, a fresh optimizer and learning-rate schedule"
        )
        if "imported_from" in setup.init_from and defaults:
            chosen = ", ".join(f"{flag(k)} {getattr(cfg, k)}" for k in defaults)
            report.message(
                f"an imported model ({setup.init_from['imported_from']}): fine-tuning with "
                f"{chosen} (the defaults for an imported model; any flag overrides them)"
            )
    if setup.resumed is None:
        return
    changes = changed_settings(setup.resumed.train_config, cfg)
    if changes:
        report.message(f"changed since {setup.resumed.path}: {', '.join(changes)}")
    if setup.data_note:
        report.message(setup.data_note)


def _summary(
    job: Job,
    setup: Setup,
    world: World,
    device: torch.device,
    plan: BatchPlan,
    total_steps: int | None,
    pos: Position,
) -> dict[str, Any]:
    """What the reporter shows before the first step."""
    cfg, splits = job.train, setup.splits
    return {
        "run_dir": str(job.out),
        "device": str(device),
        "precision": setup.precision.name,
        "compile": cfg.compile,
        "label_smoothing": cfg.label_smoothing,  # the progress lines name the loss it smooths
        "world_size": world.world_size,
        "global_batch": {
            "ranks": world.world_size,
            "accumulate": cfg.accumulate,
            "max_tokens": cfg.max_tokens,
            "tokens": world.world_size * cfg.accumulate * cfg.max_tokens,
        },
        "model": setup.model_config.to_dict(),
        "parameters": setup.model.parameter_counts()["total"],
        "splits": {k: len(v.pairs) for k, v in splits.items()},
        "dropped": {k: v.dropped for k, v in splits.items()},
        "lengths": {k: v.length_percentiles() for k, v in splits.items() if v.pairs},
        "batches_per_epoch": len(plan.epoch(0)),
        "padding_share": plan.padding_share(),
        "total_steps": total_steps,
        "time_budget": cfg.time_budget,
        "resumed_from": pos.step if setup.resumed else None,
        "elapsed": pos.elapsed,  # a resumed run's clock goes on from here
    }


def _total_steps(cfg: TrainConfig, batches: int, world_size: int) -> int | None:
    """The steps --max-steps / --epochs allow, ``batches`` an epoch; None: a time budget
    alone."""
    limits = []
    if cfg.max_steps is not None:
        limits.append(cfg.max_steps)
    epochs = cfg.epochs
    if epochs is None and cfg.max_steps is None and cfg.time_budget is None:
        epochs = DEFAULT_EPOCHS
    if epochs is not None:
        steps = epochs * batches / step_batches(cfg.accumulate, world_size)
        limits.append(max(1, math.ceil(steps)))
    return min(limits) if limits else None
