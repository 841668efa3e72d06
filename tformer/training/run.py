"""``train()``: the whole job behind ``tformer train``.

Load data, get a tokenizer, build the model, then hand over to ``TrainingLoop``
(tformer.training.loop), which loops over token-budget batches until a budget runs out, evaluating and
checkpointing on the way, and finally measures exact match on the test split. Progress goes
to a ``Reporter`` so the library stays silent and the CLI decides how to show it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tformer import checkpoint as ckpt
from tformer.checkpoint.run_dir import create_output, prepare_output, resume_target
from tformer.config import ModelConfig, TrainConfig
from tformer.data.batching import BatchPlan
from tformer.data.pairs import EncodedSplit, encode_pairs
from tformer.data.sources import bundled_data_dir, data_name, load_text_pairs
from tformer.data.tokenizer import Tokenizer, train_tokenizer
from tformer.device import resolve_device, seed_everything
from tformer.errors import CheckpointError, ConfigError, DataError
from tformer.model import Transformer
from tformer.training import distributed as dist_
from tformer.training.distributed import World
from tformer.training.loop import Position, Reporter, TrainingLoop, TrainResult, restore_rng
from tformer.training.loss import sequence_loss
from tformer.training.optim import build_optimizer
from tformer.training.precision import resolve_precision
from tformer.training.validation import EVAL_BATCH_TOKENS

DEFAULT_EPOCHS = 10.0

# Re-exported: the names users and the CLI know from this module.
__all__ = [
    "EVAL_BATCH_TOKENS",
    "Reporter",
    "TrainResult",
    "check_architecture",
    "sequence_loss",
    "train",
    "with_older_checkpoint",
]


def get_tokenizers(
    tokenizer_path: Path | None,
    texts: list[tuple[str, str]],
    *,
    kind: str,
    vocab_size: int,
    shared: bool,
) -> ckpt.Tokenizers:
    """Load the given tokenizer, or train one on the training pairs."""
    if tokenizer_path is not None:
        tok = Tokenizer.load(tokenizer_path)
        return ckpt.Tokenizers(tok, tok)
    if shared:
        tok = train_tokenizer((t for pair in texts for t in pair), kind=kind, vocab_size=vocab_size)
        return ckpt.Tokenizers(tok, tok)
    source = train_tokenizer((s for s, _ in texts), kind=kind, vocab_size=vocab_size)
    target = train_tokenizer((t for _, t in texts), kind=kind, vocab_size=vocab_size)
    return ckpt.Tokenizers(source, target)


def _total_steps(cfg: TrainConfig, batches_per_epoch: int) -> int | None:
    limits = []
    if cfg.max_steps is not None:
        limits.append(cfg.max_steps)
    epochs = cfg.epochs
    if epochs is None and cfg.max_steps is None and cfg.time_budget is None:
        epochs = DEFAULT_EPOCHS
    if epochs is not None:
        limits.append(max(1, math.ceil(epochs * batches_per_epoch / cfg.accumulate)))
    return min(limits) if limits else None


def train(
    model_config: ModelConfig | None,
    train_config: TrainConfig,
    *,
    out: Path | None = None,
    tokenizer: Path | None = None,
    tokenizer_kind: str = "bpe",
    vocab_size: int = 8000,
    shared_vocab: bool = True,
    resume: bool | str | Path = False,
    overwrite: bool = False,
    strict: bool = False,
    reporter: Reporter | None = None,
    tokenized_cache: Path | None = None,
    num_proc: int | None = None,
) -> TrainResult:
    """Train a model and return where it was saved and how well it did.

    Args:
        model_config: the architecture; vocabulary sizes are filled in from the tokenizer.
            None when resuming (the checkpoint's architecture is used).
        train_config: data, batching, optimisation and stopping.
        out: the run folder (default ``checkpoints/<data name>``).
        tokenizer: a ``tokenizer.json`` to use; trained on the data when None.
        resume: True to continue the run in ``out`` from its latest checkpoint, or the path of
            a run folder or of one of its ``step-*`` checkpoints. The run then follows exactly
            the trajectory it would have followed uninterrupted (bit for bit on a CPU).
        overwrite: replace the tformer run in ``out``.
        strict: refuse pairs longer than ``max_len`` (or with an empty side) instead of
            skipping and counting them.
        tokenized_cache: a folder where token ids are cached (``datasets.map``), keyed by
            data and tokenizer, so the next run over the same data skips tokenisation.
        num_proc: processes that tokenise a large corpus (with ``tokenized_cache``).

    Raises:
        ConfigError, DataError, CheckpointError, DeviceError: for users to act on.
        DivergedError: the loss or a gradient became NaN / inf (the last good checkpoint stays).
        TrainingInterrupted: SIGINT / SIGTERM; a checkpoint was written first.
    """
    cfg = train_config
    resume_from: Path | None = None
    if resume is not False:
        out, resume_from = resume_target(out, resume)
    out = Path(out) if out is not None else Path("checkpoints") / data_name(cfg.data)
    device = resolve_device(cfg.device)
    # Under torchrun every rank runs this function; only rank 0 writes and reports.
    world = dist_.init_world(device)
    device = dist_.local_device(device, world)
    report = (reporter or Reporter()) if world.is_main else Reporter()
    if world.is_main:
        prepare_output(out, resume=resume_from is not None, overwrite=overwrite)
    seed_everything(cfg.seed)

    texts = load_text_pairs(cfg.data, source_field=cfg.source_field, target_field=cfg.target_field)
    resumed: ckpt.Checkpoint | None = None
    if resume_from is not None:
        resumed = _load_for_resume(out, resume_from)
        if model_config is not None:
            check_architecture(resumed.model_config, _architecture(model_config))
        if tokenizer is not None:
            _check_same_tokenizer(tokenizer, resumed)
        tokenizers, model_config = resumed.tokenizers, resumed.model_config
    else:
        if model_config is None:
            raise ConfigError("a model configuration is needed unless resuming")
        tokenizers = _shared_tokenizers(
            world,
            device,
            lambda: get_tokenizers(
                tokenizer,
                texts["train"],
                kind=tokenizer_kind,
                vocab_size=vocab_size,
                shared=shared_vocab,
            ),
        )
        model_config = dataclasses.replace(
            model_config,
            src_vocab_size=tokenizers.source.vocab_size,
            tgt_vocab_size=tokenizers.target.vocab_size,
            share_embeddings=model_config.share_embeddings and tokenizers.shared,
        )
    precision = resolve_precision(cfg.precision, device, model_config)
    splits = encode_splits(
        texts,
        tokenizers,
        model_config.max_len,
        cfg.data,
        strict=strict,
        cache_dir=tokenized_cache,
        num_proc=num_proc,
    )

    model = resumed.model if resumed else Transformer(model_config)
    model.to(device).train()
    optimizer = build_optimizer(model, cfg)
    state: dict[str, Any] = {}
    extra: dict[str, torch.Tensor] = {}
    if resumed is not None:
        state, rng, extra = ckpt.load_training_state(resumed.path, optimizer)
        _apply_hyperparameters(optimizer, cfg)
        restore_rng(state.get("rng", {}), rng)
    pos = Position(**state["position"]) if "position" in state else Position()
    if world.rank > 0:
        # Rank 0 follows the single-process RNG stream; the others draw their own dropout
        # masks, from a stream that depends only on (seed, rank, step) so a resume repeats it.
        torch.manual_seed(cfg.seed * 1_000_003 + world.rank * 10_007 + pos.step)

    plan = BatchPlan(splits["train"].pairs, cfg.max_tokens, cfg.seed)
    batches_per_epoch = len(plan.epoch(0))
    total_steps = _total_steps(cfg, batches_per_epoch * world.world_size)

    # Every check has passed: only now is anything written.
    if world.is_main:
        create_output(out, resume_step=pos.step if resumed else None, overwrite=overwrite)
    report.start(
        {
            "run_dir": str(out),
            "device": str(device),
            "precision": precision.name,
            "compile": cfg.compile,
            "world_size": world.world_size,
            "global_batch": {
                "ranks": world.world_size,
                "accumulate": cfg.accumulate,
                "max_tokens": cfg.max_tokens,
                "tokens": world.world_size * cfg.accumulate * cfg.max_tokens,
            },
            "model": model_config.to_dict(),
            "parameters": model.parameter_counts()["total"],
            "splits": {k: len(v.pairs) for k, v in splits.items()},
            "dropped": {k: v.dropped for k, v in splits.items()},
            "lengths": {k: v.length_percentiles() for k, v in splits.items() if v.pairs},
            "batches_per_epoch": batches_per_epoch,
            "padding_share": plan.padding_share(),
            "total_steps": total_steps,
            "time_budget": cfg.time_budget,
            "resumed_from": pos.step if resumed else None,
        }
    )
    if resumed is not None:
        changes = changed_settings(resumed.train_config, cfg)
        if changes:
            report.message(f"changed since {resumed.path}: {', '.join(changes)}")

    loop = TrainingLoop(
        model,
        optimizer,
        cfg,
        model_config,
        tokenizers,
        splits,
        device,
        out,
        report,
        precision=precision,
        world=world,
    )
    loop.restore(state, extra)
    try:
        return loop.run(plan, pos, total_steps)
    finally:
        dist_.close(world)


def _shared_tokenizers(
    world: World, device: torch.device, make: Callable[[], ckpt.Tokenizers]
) -> ckpt.Tokenizers:
    """The tokenizers, made once on rank 0 and sent to the other ranks as JSON text."""
    if not world.distributed:
        return make()
    made = make() if world.is_main else None
    source = dist_.broadcast_text(made.source.to_str() if made else None, world, device)
    shared = dist_.broadcast_text(
        ("shared" if made.shared else made.target.to_str()) if made else None, world, device
    )
    if made is not None:
        return made
    src = Tokenizer.from_str(source)
    return ckpt.Tokenizers(src, src if shared == "shared" else Tokenizer.from_str(shared))


def encode_splits(
    texts: dict[str, list[tuple[str, str]]],
    tokenizers: ckpt.Tokenizers,
    max_len: int,
    data: str | None,
    *,
    strict: bool,
    cache_dir: Path | None = None,
    num_proc: int | None = None,
) -> dict[str, EncodedSplit]:
    """Every split as ids; pairs that do not fit are dropped and counted (refused if strict)."""
    where = f"--data {data or bundled_data_dir()}"
    splits = {
        name: encode_pairs(
            pairs,
            tokenizers.source,
            tokenizers.target,
            max_len,
            strict=strict,
            where=f"{where} ({name} split)",
            cache_dir=cache_dir,
            num_proc=num_proc,
        )
        for name, pairs in texts.items()
    }
    if not splits["train"].pairs:
        raise DataError(
            f"{where}: no training pair fits --max-len {max_len} "
            f"(all {splits['train'].dropped} were dropped)"
        )
    return splits


def _load_for_resume(run: Path, folder: Path) -> ckpt.Checkpoint:
    try:
        return ckpt.load_checkpoint(folder, "cpu")
    except CheckpointError as error:
        raise with_older_checkpoint(error, run, folder) from error


def with_older_checkpoint(error: CheckpointError, run: Path, folder: Path) -> CheckpointError:
    """``error`` about a damaged checkpoint, naming the newest older one to resume instead."""
    step = ckpt.step_of(folder)
    older = [p for p in ckpt.step_dirs(run) if step is not None and (ckpt.step_of(p) or 0) < step]
    if not older:
        return error
    return CheckpointError(
        f"{error}; resume from an earlier checkpoint instead: --resume {older[-1]}"
    )


def _check_same_tokenizer(path: Path, resumed: ckpt.Checkpoint) -> None:
    given = Tokenizer.load(path)
    saved = resumed.tokenizers.source
    if given.sha256() != saved.sha256():
        name = resumed.tokenizers.files()["source"]
        raise CheckpointError(
            f"--tokenizer {path} differs from {resumed.path / name}, which the run was trained "
            "with; drop --tokenizer to resume with the saved one"
        )


def _apply_hyperparameters(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> None:
    """Loading an optimizer state brings back the saved betas / eps / decay; the current
    configuration wins (the learning rate is set at every step anyway)."""
    for group in optimizer.param_groups:
        group["betas"] = (cfg.beta1, cfg.beta2)
        group["eps"] = cfg.eps
        if "weight_decay" in group:
            group["weight_decay"] = cfg.weight_decay


def changed_settings(saved: TrainConfig, current: TrainConfig) -> list[str]:
    """Training flags that differ from the checkpoint, as ``--flag old -> new``."""
    before, after = saved.to_dict(), current.to_dict()
    return [
        f"--{key.replace('_', '-')} {before[key]} -> {after[key]}"
        for key in after
        if before.get(key) != after[key]
    ]


_DERIVED = ("src_vocab_size", "tgt_vocab_size", "share_embeddings")


def _architecture(config: ModelConfig) -> dict[str, Any]:
    return {k: v for k, v in config.to_dict().items() if k not in _DERIVED}


def check_architecture(saved: ModelConfig, requested: dict[str, Any]) -> None:
    """On resume the saved architecture wins; a requested value that contradicts it is refused."""
    for name, want in requested.items():
        have = getattr(saved, name)
        if name not in _DERIVED and want is not None and want != have:
            raise ConfigError(
                f"--{name.replace('_', '-')} {want} conflicts with the checkpoint being "
                f"resumed ({have}); drop the flag to keep the saved architecture"
            )
