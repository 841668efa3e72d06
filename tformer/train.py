"""The training loop: teacher forcing, label-smoothed loss, schedule, evaluation, checkpoints.

``train()`` is the whole job behind ``tformer train``: load data, get a tokenizer, build the
model, loop over token-budget batches until a budget runs out, evaluate, checkpoint, and finally
measure exact match on the test split. Progress goes to a ``Reporter`` so the library stays
silent and the CLI decides how to show it.
"""

from __future__ import annotations

import dataclasses
import math
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tformer import checkpoint as ckpt
from tformer.config import ModelConfig, TrainConfig
from tformer.data import BatchPlan, EncodedSplit, collate, data_name, encode_pairs, load_text_pairs
from tformer.decoding import DecodingConfig, decode_texts
from tformer.device import resolve_device, seed_everything
from tformer.errors import ConfigError, DataError
from tformer.model import Transformer
from tformer.optim import build_optimizer, lr_at
from tformer.tokenizer import PAD_ID, Tokenizer, train_tokenizer

DEFAULT_EPOCHS = 10.0
EVAL_BATCH_TOKENS = 8192


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
    exact_match: float | None = None
    exact_match_split: str | None = None
    samples: list[dict[str, str]] = field(default_factory=list)


# -- setup ------------------------------------------------------------------------------------


def prepare_output(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber anything that is not ours. Checks only: nothing is written yet."""
    if resume:
        if not ckpt.is_run_dir(out):
            raise ConfigError(f"--resume {out}: no tformer run there to resume")
        return
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is a file")
    if out.is_dir() and any(out.iterdir()):
        if not ckpt.is_run_dir(out):
            raise ConfigError(
                f"--out {out}: exists and is not a tformer run; choose another --out "
                "(or --overwrite to replace it)"
                if not overwrite
                else f"--out {out}: exists and is not a tformer run; refusing to delete it"
            )
        if not overwrite:
            raise ConfigError(
                f"--out {out}: already holds a run; --resume to continue it or --overwrite "
                "to start again"
            )


def create_output(out: Path, *, resume: bool) -> None:
    """Start the run folder afresh (after ``prepare_output`` allowed it)."""
    if resume:
        return
    if out.is_dir():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


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
def evaluate_loss(model: Transformer, split: EncodedSplit, device: torch.device) -> float:
    """Mean per-token cross-entropy (no label smoothing) over a split."""
    model.eval()
    plan = BatchPlan(split.pairs, EVAL_BATCH_TOKENS, seed=0)
    total, tokens = 0.0, 0
    for batch in plan.batches(0):
        batch = batch.to(device)
        logits = model(batch.src, batch.tgt_in).logits
        total += float(sequence_loss(logits, batch.tgt_out))
        tokens += batch.n_target_tokens
    model.train()
    return total / max(tokens, 1)


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
    resume: bool = False,
    overwrite: bool = False,
    reporter: Reporter | None = None,
) -> TrainResult:
    """Train a model and return where it was saved and how well it did.

    Args:
        model_config: the architecture; vocabulary sizes are filled in from the tokenizer.
            None when resuming (the checkpoint's architecture is used).
        train_config: data, batching, optimisation and stopping.
        out: the run folder (default ``checkpoints/<data name>``).
        tokenizer: a ``tokenizer.json`` to use; trained on the data when None.
        resume: continue the run in ``out`` from its latest checkpoint.

    Raises:
        ConfigError, DataError, CheckpointError, DeviceError: for users to act on.
    """
    report = reporter or Reporter()
    cfg = train_config
    out = Path(out) if out is not None else Path("checkpoints") / data_name(cfg.data)
    device = resolve_device(cfg.device)
    prepare_output(out, resume=resume, overwrite=overwrite)
    seed_everything(cfg.seed)

    texts = load_text_pairs(cfg.data, source_field=cfg.source_field, target_field=cfg.target_field)
    resumed: ckpt.Checkpoint | None = None
    if resume:
        resumed = ckpt.load_checkpoint(out, "cpu")
        if model_config is not None:
            check_architecture(resumed.model_config, _architecture(model_config))
        tokenizers = resumed.tokenizers
        model_config = resumed.model_config
    else:
        if model_config is None:
            raise ConfigError("a model configuration is needed unless resuming")
        tokenizers = get_tokenizers(
            tokenizer,
            texts["train"],
            kind=tokenizer_kind,
            vocab_size=vocab_size,
            shared=shared_vocab,
        )
        model_config = dataclasses.replace(
            model_config,
            src_vocab_size=tokenizers.source.vocab_size,
            tgt_vocab_size=tokenizers.target.vocab_size,
            share_embeddings=model_config.share_embeddings and tokenizers.shared,
        )

    splits = {
        name: encode_pairs(pairs, tokenizers.source, tokenizers.target, model_config.max_len)
        for name, pairs in texts.items()
    }
    if not splits["train"].pairs:
        raise DataError(
            f"--data {cfg.data or 'data/'}: no training pair fits --max-len "
            f"{model_config.max_len} (all {splits['train'].dropped} were dropped)"
        )

    model = resumed.model if resumed else Transformer(model_config)
    model.to(device).train()
    optimizer = build_optimizer(model, cfg)
    pos = _Position()
    if resumed is not None:
        state, rng = ckpt.load_training_state(resumed.path, optimizer)
        pos = _Position(**state["position"])
        _restore_rng(state.get("rng", {}), rng)

    plan = BatchPlan(splits["train"].pairs, cfg.max_tokens, cfg.seed)
    batches_per_epoch = len(plan.epoch(0))
    total_steps = _total_steps(cfg, batches_per_epoch)
    if cfg.schedule == "cosine" and total_steps is None:
        raise ConfigError("--schedule cosine needs --max-steps or --epochs to know its length")

    report.start(
        {
            "run_dir": str(out),
            "device": str(device),
            "model": model_config.to_dict(),
            "parameters": model.parameter_counts()["total"],
            "splits": {k: len(v.pairs) for k, v in splits.items()},
            "dropped": {k: v.dropped for k, v in splits.items()},
            "batches_per_epoch": batches_per_epoch,
            "padding_share": plan.padding_share(),
            "total_steps": total_steps,
            "time_budget": cfg.time_budget,
            "resumed_from": pos.step if resumed else None,
        }
    )

    create_output(out, resume=resume)
    loop = _Loop(model, optimizer, cfg, model_config, tokenizers, splits, device, out, report)
    return loop.run(plan, pos, total_steps)


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
    ) -> None:
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.model_config, self.tokenizers, self.splits = model_config, tokenizers, splits
        self.device, self.out, self.report = device, out, report
        self.last_val: float | None = None
        self.last_train: float | None = None

    def run(self, plan: BatchPlan, pos: _Position, total_steps: int | None) -> TrainResult:
        cfg = self.cfg
        stream = _stream(plan, pos)
        started = time.perf_counter() - pos.elapsed
        window_loss = torch.zeros((), device=self.device)
        window_tokens = 0
        window_start, window_tokens_seen = time.perf_counter(), 0
        stop = False
        try:
            while not stop:
                micro = [next(stream) for _ in range(cfg.accumulate)]
                loss_sum, n_tokens = self._step(plan, micro, pos.step + 1, total_steps)
                pos.step += 1
                last_epoch, last_index, _ = micro[-1]
                pos.epoch, pos.batch = last_epoch, last_index + 1
                pos.tokens += n_tokens
                window_loss += loss_sum
                window_tokens += n_tokens
                window_tokens_seen += n_tokens
                pos.elapsed = time.perf_counter() - started
                stop = self._should_stop(pos, total_steps)
                if pos.step % cfg.log_every == 0 or stop:
                    now = time.perf_counter()
                    # Reading the loss synchronises with the device: only at log intervals.
                    self.last_train = float(window_loss) / max(window_tokens, 1)
                    self._log(pos, plan, total_steps, window_tokens_seen / (now - window_start))
                    window_loss.zero_()
                    window_tokens = 0
                    window_start, window_tokens_seen = now, 0
                if pos.step % cfg.eval_every == 0 or stop:
                    self._evaluate(pos)
                if pos.step % cfg.save_every == 0 or stop:
                    self._save(pos)
        except KeyboardInterrupt:
            self._save(pos)
            self.report.message(
                f"interrupted at step {pos.step}; resume with: tformer train --resume "
                f"--out {self.out}"
            )
            raise
        return self._finish(pos, plan)

    def _step(
        self,
        plan: BatchPlan,
        micro: list[tuple[int, int, list[int]]],
        step: int,
        total_steps: int | None,
    ) -> tuple[torch.Tensor, int]:
        batches = [collate([plan.pairs[i] for i in indices]) for _, _, indices in micro]
        # Normalise by the tokens of the whole accumulated step, so accumulating k batches
        # equals one batch k times larger.
        n_tokens = sum(b.n_target_tokens for b in batches)
        lr = lr_at(step, self.model_config, self.cfg, total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=self.device)
        for batch in batches:
            batch = batch.to(self.device)
            logits = self.model(batch.src, batch.tgt_in).logits
            loss = sequence_loss(logits, batch.tgt_out, self.cfg.label_smoothing)
            (loss / n_tokens).backward()
            total += loss.detach()
        if self.cfg.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total, n_tokens

    def _should_stop(self, pos: _Position, total_steps: int | None) -> bool:
        if total_steps is not None and pos.step >= total_steps:
            return True
        return self.cfg.time_budget is not None and pos.elapsed >= self.cfg.time_budget

    def _log(
        self, pos: _Position, plan: BatchPlan, total_steps: int | None, tokens_per_s: float
    ) -> None:
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
        ckpt.append_metrics(self.out, record)
        self.report.log(record)

    def _evaluate(self, pos: _Position) -> None:
        split = self.splits.get("validation")
        if split is None or not split.pairs:
            return
        self.last_val = evaluate_loss(self.model, split, self.device)
        record = {
            "step": pos.step,
            "val_loss": round(self.last_val, 5),
            "val_ppl": round(math.exp(min(self.last_val, 50.0)), 4),
        }
        ckpt.append_metrics(self.out, record)
        self.report.log(record)

    def _save(self, pos: _Position) -> Path:
        rng_meta, rng_tensors = _rng_state()
        return ckpt.save_checkpoint(
            self.out,
            model=self.model,
            train_config=self.cfg,
            tokenizers=self.tokenizers,
            step=pos.step,
            optimizer=self.optimizer,
            trainer_state={"position": dataclasses.asdict(pos), "rng": rng_meta},
            rng_state=rng_tensors,
            keep_last=self.cfg.keep_last,
        )

    def _finish(self, pos: _Position, plan: BatchPlan) -> TrainResult:
        result = TrainResult(
            run_dir=self.out,
            checkpoint=ckpt.resolve(self.out),
            step=pos.step,
            epoch=pos.epoch + pos.batch / max(len(plan.epoch(pos.epoch)), 1),
            elapsed=pos.elapsed,
            train_loss=self.last_train,
            val_loss=self.last_val,
        )
        name = "test" if "test" in self.splits else "validation"
        split = self.splits.get(name)
        if split is not None and split.pairs:
            self.report.message(f"measuring exact match on the {name} split ({len(split.pairs)})")
            result.exact_match, result.samples = exact_match(self.model, split, self.tokenizers)
            result.exact_match_split = name
            ckpt.append_metrics(
                self.out, {"step": pos.step, f"{name}_exact_match": result.exact_match}
            )
        self.report.finish(result)
        return result
