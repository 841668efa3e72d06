"""The training loop: teacher forcing, label-smoothed loss, schedule, evaluation, checkpoints.

``train()`` is the whole job behind ``tformer train``: load data, get a tokenizer, build the
model, loop over token-budget batches until a budget runs out, evaluate, checkpoint, and finally
measure exact match on the test split. Progress goes to a ``Reporter`` so the library stays
silent and the CLI decides how to show it.

Reliability: a checkpoint holds everything the trajectory depends on (weights, optimizer, every
RNG, the data position and the running loss of the next log line), so a resumed run repeats an
uninterrupted one bit for bit on a CPU. SIGINT / SIGTERM finish the step and save first; a NaN /
inf loss or gradient stops training before anything computed from it is saved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tformer import checkpoint as ckpt
from tformer import distributed as dist_
from tformer.config import ModelConfig, TrainConfig
from tformer.data import (
    BatchPlan,
    EncodedSplit,
    bundled_data_dir,
    collate,
    data_name,
    encode_pairs,
    load_text_pairs,
)
from tformer.decoding import DecodingConfig, decode_texts
from tformer.device import resolve_device, seed_everything
from tformer.distributed import World
from tformer.ema import WeightAverage
from tformer.errors import (
    Aborted,
    CheckpointError,
    ConfigError,
    DataError,
    DivergedError,
    OutOfMemoryError,
    TrainingInterrupted,
)
from tformer.model import Transformer
from tformer.optim import build_optimizer, lr_at
from tformer.precision import Precision, resolve_precision
from tformer.tokenizer import PAD_ID, Tokenizer, train_tokenizer

DEFAULT_EPOCHS = 10.0
EVAL_BATCH_TOKENS = 8192
# Mixed precision skips a step whose gradients overflowed; this many in a row means divergence.
MAX_SKIPPED_IN_A_ROW = 25


# -- the loss ---------------------------------------------------------------------------------


def sequence_loss(
    logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Summed cross-entropy over the non-padding labels (divide by their count for a mean).

    Args:
        logits: (B, T, V); labels: (B, T) with PAD_ID where nothing is predicted.
    """
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(),
        labels.reshape(-1),
        ignore_index=PAD_ID,
        label_smoothing=label_smoothing,
        reduction="sum",
    )


# -- reporting --------------------------------------------------------------------------------


class Reporter:
    """Receives progress; the default one ignores it. The CLI renders it with Rich."""

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
    model: Transformer | None = field(default=None, repr=False)
    exact_match: float | None = None
    exact_match_split: str | None = None
    samples: list[dict[str, str]] = field(default_factory=list)


# -- setup ------------------------------------------------------------------------------------


def prepare_output(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber anything that is not ours. Checks only: nothing is written yet.

    ``--overwrite`` replaces a tformer run (its checkpoints and metrics; other files in the
    folder are left alone). A folder that is not empty and not a tformer run is refused even
    with ``--overwrite``: it may hold someone's work, and deleting it is not ours to do.
    """
    if resume:
        if not ckpt.is_run_dir(out):
            raise CheckpointError(f"--resume {out}: no tformer run there to resume")
        return
    _check_writable_parent(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is a file; choose a folder name")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if ckpt.is_checkpoint_dir(out):
        raise ConfigError(
            f"--out {out}: is one checkpoint of a run, not a run folder; choose another --out"
        )
    if not ckpt.is_run_dir(out):
        raise ConfigError(
            f"--out {out}: exists, is not empty and is not a tformer run; choose another --out "
            "(--overwrite only replaces tformer runs)"
        )
    if not overwrite:
        raise ConfigError(
            f"--out {out}: already holds a run; --resume {out} to continue it or --overwrite "
            "to start again"
        )


def _check_writable_parent(out: Path) -> None:
    """The nearest existing ancestor of ``out`` must be a folder (not a file)."""
    for parent in out.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"--out {out}: {parent} is a file, so no folder can go there")
            return


def create_output(out: Path, *, resume_step: int | None, overwrite: bool) -> None:
    """Start the run folder afresh, or rewind it to the checkpoint being resumed.

    Called only after every check passed, so a refused run writes nothing.
    """
    if resume_step is not None:
        ckpt.rewind_run(out, resume_step)
        return
    if overwrite and ckpt.is_run_dir(out):
        ckpt.remove_run(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CheckpointError(
            f"--out {out}: cannot create the run folder ({error.strerror or error}); "
            "choose another --out"
        ) from error


def resume_target(out: Path | None, resume: bool | str | Path) -> tuple[Path, Path]:
    """(run folder, checkpoint folder) for ``--resume``.

    ``resume`` is True (resume the run ``out`` from its latest checkpoint), a run folder, or one
    ``step-*`` checkpoint of a run (resume from it; the run forgets what came after).
    """
    given = Path(out) if resume is True else Path(resume)  # type: ignore[arg-type]
    if resume is True and out is None:
        raise ConfigError("--resume needs the run folder")
    if ckpt.is_run_dir(given):
        run = given
    elif ckpt.is_checkpoint_dir(given) and ckpt.is_run_dir(given.parent):
        run = given.parent
    else:
        raise CheckpointError(
            f"--resume {given}: no tformer run there to resume (a run folder has a `latest` "
            "file and step-* checkpoints)"
        )
    if out is not None and Path(out).resolve() != run.resolve():
        raise ConfigError(f"--resume {given} belongs to the run {run}, not --out {out}")
    return run, ckpt.resolve(given)


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


def _rng_state() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Every random state that shapes training: JSON-able parts and tensors apart."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda{i}"] = state
    np_state = np.random.get_state()
    meta = {
        "python": _to_json(random.getstate()),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }
    return meta, tensors


def _restore_rng(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
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


def _to_json(value: Any) -> Any:
    return [_to_json(v) for v in value] if isinstance(value, (tuple, list)) else value


def _from_json(value: Any) -> Any:
    return tuple(_from_json(v) for v in value) if isinstance(value, list) else value


# -- evaluation -------------------------------------------------------------------------------


@torch.no_grad()
def evaluate_loss(
    model: Transformer,
    split: EncodedSplit,
    device: torch.device,
    precision: Precision | None = None,
) -> float:
    """Mean per-token cross-entropy (no label smoothing) over a split."""
    model.eval()
    plan = BatchPlan(split.pairs, EVAL_BATCH_TOKENS, seed=0)
    total, tokens = 0.0, 0
    for batch in plan.batches(0):
        batch = batch.to(device)
        if precision is None:
            logits = model(batch.src, batch.tgt_in).logits
        else:
            with precision.autocast():
                logits = model(batch.src, batch.tgt_in).logits
        total += float(sequence_loss(logits, batch.tgt_out))
        tokens += batch.n_target_tokens
    model.train()
    return total / max(tokens, 1)


@torch.no_grad()
def translation_scores(
    model: Transformer, split: EncodedSplit, tokenizers: ckpt.Tokenizers, limit: int
) -> dict[str, float]:
    """sacreBLEU BLEU and chrF of greedy translations of the split's first ``limit`` pairs."""
    from tformer.evaluate import corpus_scores  # local: evaluate builds on this module

    pairs = split.pairs[:limit]
    references = [t for _, t in split.texts[: len(pairs)]]
    max_new = max(8, model.config.max_len)
    hyps = decode_texts(model, [s for s, _ in pairs], DecodingConfig(max_new_tokens=max_new))
    outputs = tokenizers.target.decode_batch([h[0].ids for h in hyps])
    model.train()
    scores = corpus_scores(outputs, references)
    return {"bleu": scores.bleu, "chrf": scores.chrf}


def exact_match(
    model: Transformer,
    split: EncodedSplit,
    tokenizers: ckpt.Tokenizers,
    *,
    limit: int | None = None,
) -> tuple[float, list[dict[str, str]]]:
    """Share of greedy outputs equal to the reference target, with a few samples."""
    pairs = split.pairs[:limit] if limit else split.pairs
    texts = split.texts[: len(pairs)]
    hyps = decode_texts(model, [s for s, _ in pairs], DecodingConfig(max_new_tokens=256))
    outputs = tokenizers.target.decode_batch([h[0].ids for h in hyps])
    # Compare in the tokenizer's normal form so NFKC-equivalent strings count as equal.
    references = tokenizers.target.decode_batch([t for _, t in pairs])
    hits = sum(o.strip() == r.strip() for o, r in zip(outputs, references, strict=True))
    samples = [
        {"source": s, "reference": t, "output": o}
        for (s, t), o in zip(texts[:5], outputs[:5], strict=True)
    ]
    model.train()
    return hits / max(len(pairs), 1), samples


# -- the loop ---------------------------------------------------------------------------------


@dataclass
class _Position:
    """Where training stands; everything a resume needs besides weights, optimizer and RNG."""

    step: int = 0
    epoch: int = 0
    batch: int = 0  # next batch index inside ``epoch``
    tokens: int = 0
    elapsed: float = 0.0


def _stream(plan: BatchPlan, pos: _Position) -> Iterator[tuple[int, int, list[int]]]:
    """(epoch, batch index, example indices) forever, starting at ``pos``."""
    epoch, start = pos.epoch, pos.batch
    while True:
        batches = plan.epoch(epoch)
        for index in range(start, len(batches)):
            yield epoch, index, batches[index]
        epoch, start = epoch + 1, 0


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
        _restore_rng(state.get("rng", {}), rng)
    pos = _Position(**state["position"]) if "position" in state else _Position()
    if world.rank > 0:
        # Rank 0 follows the single-process RNG stream; the others draw their own dropout
        # masks, from a stream that depends only on (seed, rank, step) so a resume repeats it.
        torch.manual_seed(cfg.seed * 1_000_003 + world.rank * 10_007 + pos.step)

    plan = BatchPlan(splits["train"].pairs, cfg.max_tokens, cfg.seed)
    batches_per_epoch = len(plan.epoch(0))
    total_steps = _total_steps(cfg, batches_per_epoch * world.world_size)
    if cfg.schedule == "cosine" and total_steps is None:
        raise ConfigError("--schedule cosine needs --max-steps or --epochs to know its length")

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

    loop = _Loop(
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


_SIGNAL_EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class _StopOnSignal:
    """SIGINT / SIGTERM ask training to stop after the current step, with a checkpoint.

    The handler only records the request: the loop finishes the step, saves, and raises
    ``TrainingInterrupted``. A second signal raises ``Aborted`` at once; saves are atomic, so
    stopping in the middle of one leaves the previous checkpoint intact. Handlers are installed
    only in the main thread (Python allows nothing else) and restored on exit.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNAL_EXIT_CODES:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is not None:
            self._restore()
            raise Aborted(_SIGNAL_EXIT_CODES.get(signum, 130))
        self.received = signum

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def _is_out_of_memory(error: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    text = str(error)
    return isinstance(error, oom) or "out of memory" in text or "can't allocate memory" in text


class _Loop:
    """The optimisation loop proper; separate so each part stays short."""

    def __init__(
        self,
        model: Transformer,
        optimizer: torch.optim.Optimizer,
        cfg: TrainConfig,
        model_config: ModelConfig,
        tokenizers: ckpt.Tokenizers,
        splits: dict[str, EncodedSplit],
        device: torch.device,
        out: Path,
        report: Reporter,
        *,
        precision: Precision,
        world: World,
    ) -> None:
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.model_config, self.tokenizers, self.splits = model_config, tokenizers, splits
        self.device, self.out, self.report = device, out, report
        self.precision, self.world = precision, world
        self.scaler = precision.scaler()
        # What runs the forward pass: the model itself, or it wrapped for data parallelism
        # and/or compiled. Checkpoints always save ``self.model``, so their tensor names carry
        # no ``module.`` or ``_orig_mod.`` prefix and load anywhere.
        self.forward: torch.nn.Module = model
        if world.distributed:
            from torch.nn.parallel import DistributedDataParallel

            # The only buffer is the fixed sinusoid table: no need to sync it every forward.
            sync_flag = (
                "forward_sync_buffers"
                if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                else "broadcast_buffers"
            )
            self.forward = DistributedDataParallel(
                model,
                device_ids=[device.index] if device.type == "cuda" else None,
                **{sync_flag: False},
            )
        if cfg.compile:
            self.forward = torch.compile(self.forward)
        # Only rank 0 evaluates and saves, so only it needs the average.
        self.ema = (
            WeightAverage(model, cfg.ema_decay) if cfg.ema_decay > 0 and world.is_main else None
        )
        self.last_val: float | None = None
        self.last_train: float | None = None
        self.best_value: float | None = None
        self.evals_without_gain = 0
        self.stopped_early = False
        self.saved_step: int | None = None
        self.skipped = 0
        self.skipped_in_a_row = 0
        # The running sums behind the next logged loss. They are part of the training state:
        # a run resumed between two log lines must log the same loss as an uninterrupted one.
        self.window_loss = torch.zeros((), device=device)
        self.window_tokens = 0
        # The first step whose loss or gradient norm was not finite (0: none yet). Kept on the
        # device and read only where the loop synchronises anyway (log, eval, save).
        self.bad_step = torch.zeros((), dtype=torch.long, device=device)
        self.bad_values = torch.zeros(2, device=device)

    def restore(self, state: dict[str, Any], extra: dict[str, torch.Tensor]) -> None:
        """Take back the bookkeeping saved in a checkpoint's trainer state."""
        window = state.get("window", {})
        if self.world.is_main:  # the saved window is the sum over all ranks
            self.window_loss.fill_(float(window.get("loss", 0.0)))
        self.window_tokens = int(window.get("tokens", 0))
        self.last_val = state.get("last_val")
        self.last_train = state.get("last_train")
        self.skipped = int(state.get("skipped", 0))
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        best = state.get("best")
        if best and best.get("metric") == self.cfg.best_metric:
            self.best_value = best.get("value")
            self.evals_without_gain = int(best.get("evals_without_gain", 0))
        elif self.cfg.best_metric == "val_loss":
            self.best_value = self._saved_best_loss()
        raw = {k.removeprefix("raw."): v for k, v in extra.items() if k.startswith("raw.")}
        if raw:
            # The checkpoint's weights are the average; training continues from the raw ones.
            params = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, tensor in raw.items():
                    if name in params:
                        params[name].copy_(tensor)
            if self.ema is not None:
                self.ema.load({n: p for n, p in self._checkpoint_weights(extra).items()})

    def _checkpoint_weights(self, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k.removeprefix("ema."): v for k, v in extra.items() if k.startswith("ema.")}

    def _saved_best_loss(self) -> float | None:
        best = self.out / ckpt.BEST
        if best.is_dir() and ckpt.is_run_dir(best):
            try:
                metrics = ckpt.read_config(ckpt.resolve(best)).get("metrics") or {}
            except CheckpointError:
                metrics = {}
            return metrics.get("val_loss")
        return None

    def run(self, plan: BatchPlan, pos: _Position, total_steps: int | None) -> TrainResult:
        if self._should_stop(pos, total_steps):
            self.report.message(
                f"the run is already at step {pos.step}, where it was set to stop; raise "
                "--max-steps, --epochs or --time-budget to train further"
            )
        try:
            with _StopOnSignal() as signals:
                self._train(plan, pos, total_steps, signals)
        except RuntimeError as error:
            if not _is_out_of_memory(error):
                raise
            raise OutOfMemoryError(
                f"step {pos.step + 1}: out of memory on {self.device} with batches of up to "
                f"{self.cfg.max_tokens} padded tokens (--max-tokens {self.cfg.max_tokens}, "
                f"--accumulate {self.cfg.accumulate}); lower --max-tokens (and raise "
                f"--accumulate to keep the effective batch){self._last_good()}"
            ) from error
        return self._finish(pos, plan)

    def _train(
        self, plan: BatchPlan, pos: _Position, total_steps: int | None, signals: _StopOnSignal
    ) -> None:
        cfg, world = self.cfg, self.world
        stream = _stream(plan, pos)
        started = time.perf_counter() - pos.elapsed
        window_start, window_tokens_seen = time.perf_counter(), 0
        stop = self._should_stop(pos, total_steps)
        while not stop:
            # One optimizer step takes ranks x accumulate batches of the one global order;
            # rank r computes every world-th of them, so the step equals a single process
            # accumulating them all.
            micro = [next(stream) for _ in range(cfg.accumulate * world.world_size)]
            loss_sum, n_tokens = self._step(plan, micro, pos.step + 1, total_steps)
            pos.step += 1
            last_epoch, last_index, _ = micro[-1]
            pos.epoch, pos.batch = last_epoch, last_index + 1
            pos.tokens += n_tokens
            self.window_loss += loss_sum
            self.window_tokens += n_tokens
            window_tokens_seen += n_tokens
            pos.elapsed = time.perf_counter() - started
            stop, signalled = self._agree(self._should_stop(pos, total_steps), signals)
            on_cadence = pos.step % cfg.log_every == 0
            if on_cadence or stop:
                now = time.perf_counter()
                self._log(
                    pos, plan, total_steps, window_tokens_seen / max(now - window_start, 1e-9)
                )
                window_start, window_tokens_seen = now, 0
                if on_cadence:  # a final off-cadence line leaves the window to a resumed run
                    self.window_loss.zero_()
                    self.window_tokens = 0
            if pos.step % cfg.eval_every == 0 or stop:
                self._evaluate(pos)
                if self._agree(self.stopped_early, None)[0] and not stop:
                    self.stopped_early = stop = True
            if pos.step % cfg.save_every == 0 or stop:
                self._save(pos)
            if signalled is not None and not stop:
                self._stop_on_signal(pos, signalled)

    def _agree(self, stop: bool, signals: _StopOnSignal | None) -> tuple[bool, int | None]:
        """Whether to stop (and on which signal), the same on every rank.

        The time budget is read from each rank's clock and a signal may reach ranks one step
        apart; one small all-reduce (max) per step makes them all stop after the same step.
        """
        signum = signals.received if signals is not None else None
        if not self.world.distributed:
            return stop, signum
        flags = dist_.all_reduce_max([float(stop), float(signum or 0)], self.device)
        return bool(flags[0]), (int(flags[1]) or None)

    def _stop_on_signal(self, pos: _Position, signum: int) -> None:
        if self.saved_step != pos.step:
            self._save(pos)
        name = signal.Signals(signum).name
        raise TrainingInterrupted(
            f"stopped by {name} after step {pos.step}; checkpoint "
            f"{self.out / ckpt.checkpoint_name(pos.step)} saved. Resume with: "
            f"tformer train --resume {self.out}",
            _SIGNAL_EXIT_CODES.get(signum, 130),
        )

    def _step(
        self,
        plan: BatchPlan,
        micro: list[tuple[int, int, list[int]]],
        step: int,
        total_steps: int | None,
    ) -> tuple[torch.Tensor, int]:
        world = self.world
        # Normalise by the target tokens of the whole (global) step, so accumulating k batches
        # equals one batch k times larger, and n ranks equal one process. Every rank knows
        # every batch of the step, so this needs no communication.
        n_tokens = sum(plan.lengths[i][1] + 1 for _, _, indices in micro for i in indices)
        mine = micro[world.rank :: world.world_size]
        batches = [collate([plan.pairs[i] for i in indices]) for _, _, indices in mine]
        lr = lr_at(step, self.model_config, self.cfg, total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            last = i == len(batches) - 1
            # Gradients are all-reduced once per step, on the last micro-batch only.
            sync = last or not world.distributed
            with contextlib.nullcontext() if sync else self.forward.no_sync():
                with self.precision.autocast():
                    logits = self.forward(batch.src, batch.tgt_in).logits
                    loss = sequence_loss(logits, batch.tgt_out, self.cfg.label_smoothing)
                scaled = loss / n_tokens
                if world.distributed:  # DDP averages gradients over ranks; we want the sum
                    scaled = scaled * world.world_size
                if self.scaler is not None:
                    scaled = self.scaler.scale(scaled)
                scaled.backward()
            total += loss.detach()
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.cfg.clip_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.clip_norm)
        else:
            grad_norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad.detach()) for p in params])
            )
        if self.precision.mixed:
            self._mixed_precision_update(step, grad_norm)
        else:
            self._watch_numerics(step, total, grad_norm)
            self.optimizer.step()
            if self.ema is not None:
                self.ema.update()
        self.optimizer.zero_grad(set_to_none=True)
        return total, n_tokens

    def _mixed_precision_update(self, step: int, grad_norm: torch.Tensor) -> None:
        """Take the step unless the gradients overflowed; skip and count it if they did.

        Reduced precision overflows now and then without anything being wrong (fp16 above all,
        where the grad scaler then lowers its scale); only a long run of skipped steps means
        the model diverged. The finiteness check reads one value from the device per step.
        """
        if self.scaler is not None:
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)  # skips the update itself on inf / NaN gradients
            self.scaler.update()
            skipped = self.scaler.get_scale() < before
        else:
            skipped = not bool(torch.isfinite(grad_norm))
            if not skipped:
                self.optimizer.step()
        if not skipped:
            self.skipped_in_a_row = 0
            if self.ema is not None:
                self.ema.update()
            return
        self.skipped += 1
        self.skipped_in_a_row += 1
        if self.skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW:
            raise DivergedError(
                f"step {step}: training diverged ({self.skipped_in_a_row} steps in a row had "
                f"non-finite gradients in {self.precision.name}); stopped without saving "
                f"it{self._last_good()}. Resume from there with a lower --lr, a longer "
                "--warmup-steps or --precision fp32"
            )

    def _watch_numerics(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Remember the first step whose loss or gradient norm is NaN / inf, without a sync.

        In float32 such a step is fatal: ``_check_numerics`` stops training before anything
        computed from it is logged or saved, so the last checkpoint stays good. (Mixed
        precision skips and counts such steps instead: ``_mixed_precision_update``.)
        """
        finite = torch.isfinite(loss) & torch.isfinite(grad_norm)
        first = (self.bad_step == 0) & ~finite
        self.bad_step = torch.where(first, step, self.bad_step)
        values = torch.stack([loss.detach().float(), grad_norm.detach().float()])
        self.bad_values = torch.where(first, values, self.bad_values)

    def _check_numerics(self) -> None:
        step = int(self.bad_step)
        if step == 0:
            return
        loss, norm = (float(v) for v in self.bad_values)
        raise DivergedError(
            f"step {step}: training diverged (loss {loss}, gradient norm {norm}); stopped "
            f"without saving it{self._last_good()}. Resume from there with a lower --lr, a "
            "longer --warmup-steps or a smaller --clip-norm"
        )

    def _last_good(self) -> str:
        try:
            return f"; the last good checkpoint {ckpt.resolve(self.out)} is kept"
        except CheckpointError:
            return "; no checkpoint had been saved yet"

    def _should_stop(self, pos: _Position, total_steps: int | None) -> bool:
        if total_steps is not None and pos.step >= total_steps:
            return True
        return self.cfg.time_budget is not None and pos.elapsed >= self.cfg.time_budget

    def _global_window_loss(self) -> float:
        if not self.world.distributed:
            return float(self.window_loss)
        return dist_.all_reduce_sum(float(self.window_loss), self.device, self.world)

    def _log(
        self, pos: _Position, plan: BatchPlan, total_steps: int | None, tokens_per_s: float
    ) -> None:
        # Reading the loss synchronises with the device: only at log intervals.
        self._check_numerics()
        self.last_train = self._global_window_loss() / max(self.window_tokens, 1)
        if not self.world.is_main:
            return
        epoch = pos.epoch + pos.batch / max(len(plan.epoch(pos.epoch)), 1)
        record = {
            "step": pos.step,
            "epoch": round(epoch, 4),
            "loss": self.last_train,
            "lr": self.optimizer.param_groups[0]["lr"],
            "tokens_per_s": round(tokens_per_s, 1),
            "elapsed": round(pos.elapsed, 2),
            "total_steps": total_steps,
            "time_budget": self.cfg.time_budget,
        }
        if self.precision.mixed:
            record["skipped_steps"] = self.skipped
        ckpt.append_metrics(self.out, record)
        self.report.log(record)

    @contextlib.contextmanager
    def _averaged(self) -> Iterator[None]:
        """The EMA weights in the model for the duration (when EMA is on)."""
        if self.ema is None:
            yield
            return
        self.ema.swap()
        try:
            yield
        finally:
            self.ema.swap()

    def _evaluate(self, pos: _Position) -> None:
        split = self.splits.get("validation")
        if split is None or not split.pairs or not self.world.is_main:
            return
        self._check_numerics()
        with self._averaged():
            self.last_val = evaluate_loss(self.model, split, self.device, self.precision)
            record: dict[str, Any] = {
                "step": pos.step,
                "val_loss": round(self.last_val, 5),
                "val_ppl": round(math.exp(min(self.last_val, 50.0)), 4),
            }
            if self.cfg.val_bleu > 0:
                scores = translation_scores(self.model, split, self.tokenizers, self.cfg.val_bleu)
                record.update({f"val_{k}": v for k, v in scores.items()})
            value = record[
                "val_loss" if self.cfg.best_metric == "val_loss" else f"val_{self.cfg.best_metric}"
            ]
            improved = math.isfinite(value) and (
                self.best_value is None
                or (
                    value < self.best_value
                    if self.cfg.best_metric == "val_loss"
                    else value > self.best_value
                )
            )
            if improved:
                self.best_value, self.evals_without_gain = value, 0
                record["best"] = True
                metrics = {k: v for k, v in record.items() if k.startswith("val_")}
                ckpt.save_checkpoint(
                    self.out / ckpt.BEST,
                    model=self.model,
                    train_config=self.cfg,
                    tokenizers=self.tokenizers,
                    step=pos.step,
                    keep_last=1,
                    metrics=metrics,
                )
            else:
                self.evals_without_gain += 1
        ckpt.append_metrics(self.out, record)
        self.report.log(record)
        patience = self.cfg.patience
        if patience is not None and self.evals_without_gain >= patience:
            self.stopped_early = True
            self.report.message(
                f"early stop: {self.cfg.best_metric} has not improved for {patience} "
                f"evaluations (best {self.best_value})"
            )

    def _save(self, pos: _Position) -> Path | None:
        self._check_numerics()
        window = self._global_window_loss()  # a collective: every rank takes part
        if not self.world.is_main:
            self.saved_step = pos.step
            return None
        rng_meta, rng_tensors = _rng_state()
        state = {
            "position": dataclasses.asdict(pos),
            "rng": rng_meta,
            "window": {"loss": window, "tokens": self.window_tokens},
            "last_val": self.last_val,
            "last_train": self.last_train,
            "skipped": self.skipped,
            "best": {
                "metric": self.cfg.best_metric,
                "value": self.best_value,
                "evals_without_gain": self.evals_without_gain,
            },
        }
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        extra: dict[str, torch.Tensor] = {}
        if self.ema is not None:
            # The checkpoint's weights are the average; the raw ones resume training.
            extra = {f"raw.{n}": p.detach().clone() for n, p in self.model.named_parameters()}
        with self._averaged():
            if self.ema is not None:
                extra.update(
                    {f"ema.{n}": p.detach().clone() for n, p in self.model.named_parameters()}
                )
            folder = ckpt.save_checkpoint(
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
        self.saved_step = pos.step
        return folder

    def _finish(self, pos: _Position, plan: BatchPlan) -> TrainResult:
        epoch = pos.epoch + pos.batch / max(len(plan.epoch(pos.epoch)), 1)
        if not self.world.is_main:
            return TrainResult(self.out, self.out, pos.step, epoch, pos.elapsed, model=self.model)
        result = TrainResult(
            run_dir=self.out,
            checkpoint=ckpt.resolve(self.out),
            step=pos.step,
            epoch=epoch,
            elapsed=pos.elapsed,
            train_loss=self.last_train,
            val_loss=self.last_val,
            stopped_early=self.stopped_early,
            skipped_steps=self.skipped,
            model=self.model,
        )
        if self.best_value is not None:
            result.best = {self.cfg.best_metric: self.best_value}
        name = "test" if "test" in self.splits else "validation"
        split = self.splits.get(name)
        if split is not None and split.pairs:
            self.report.message(f"measuring exact match on the {name} split ({len(split.pairs)})")
            with self._averaged():
                result.exact_match, result.samples = exact_match(self.model, split, self.tokenizers)
            result.exact_match_split = name
            ckpt.append_metrics(
                self.out, {"step": pos.step, f"{name}_exact_match": result.exact_match}
            )
        self.report.finish(result)
        return result
