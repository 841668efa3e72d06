"""``tformer train --dry-run``: measure a configuration before hours are spent on it.

Builds the model and the largest batch the settings allow (every row ``--max-len`` tokens long
on both sides, as many rows as ``--max-tokens`` admits: the most attention memory a real batch
can need), runs a few optimizer steps in the run's precision, and reports tokens/s, peak memory
and an estimate of the largest ``--max-tokens`` that fits in the memory left. Nothing is written.
"""

from __future__ import annotations

import dataclasses
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from tformer.config import ModelConfig, TrainConfig
from tformer.data.batching import Batch
from tformer.data.prepared import is_prepared, open_prepared
from tformer.data.spm import load_tokenizer
from tformer.device import resolve_device, seed_everything
from tformer.fast.accelerate import accelerate
from tformer.fast.malloc import release_freed_memory
from tformer.model import TransformerBase, build_model
from tformer.training.launch import Job
from tformer.training.loss import scaled_loss
from tformer.training.optim import build_optimizer
from tformer.training.precision import Precision, resolve_precision

# Keep a tenth of the free memory as headroom: allocators fragment and batches vary.
HEADROOM = 0.9


@dataclass(frozen=True)
class DryRunReport:
    device: str
    precision: str
    parameters: int
    rows: int
    seq_len: int
    tokens_per_batch: int  # padded target tokens of the measured batch
    steps: int
    ms_per_step: float
    tokens_per_s: float  # target tokens per second
    memory: str  # what is measured: "RSS" (CPU process) or "allocated" (CUDA)
    peak_bytes: int
    baseline_bytes: int  # weights, gradients and optimizer state, before the batch
    free_bytes: int | None
    max_tokens: int
    max_tokens_fit: int | None  # estimated largest --max-tokens that fits
    kv_cache_bytes_per_token: int  # decoding's key/value cache per token (float32)
    kv_heads: int  # key/value heads of that cache (fewer than the heads with --kv-heads)
    n_heads: int


def dry_run(job: Job, *, tokenizer: Path | None = None) -> DryRunReport:
    """``tformer train --dry-run``: measure the run ``job`` describes (a resumed run's own
    architecture and vocabulary when resuming)."""
    assert job.model is not None  # plan_job resolves the architecture, the saved one on resume
    vocab_size = job.tokenizer.vocab_size
    if job.resume_from is not None or job.init_from is not None:
        vocab_size = job.model.src_vocab_size
    elif tokenizer is None and is_prepared(job.train.data):
        assert job.train.data is not None
        vocab_size = open_prepared(job.train.data, check_hashes=False).tokenizers[0].vocab_size
    return measure_batch_limits(job.model, job.train, tokenizer=tokenizer, vocab_size=vocab_size)


def measure_batch_limits(
    model_config: ModelConfig,
    train_config: TrainConfig,
    *,
    tokenizer: Path | None = None,
    vocab_size: int = 8000,
    steps: int = 3,
) -> DryRunReport:
    """Run ``steps`` timed optimizer steps (after one warm-up) on the worst-case batch."""
    # The vocabulary of the given tokenizer, else the size an automatic one is trained to.
    if tokenizer is not None:
        vocab_size = load_tokenizer(tokenizer).vocab_size
    model_config = dataclasses.replace(
        model_config, src_vocab_size=vocab_size, tgt_vocab_size=vocab_size
    )
    device = resolve_device(train_config.device)
    precision = resolve_precision(train_config.precision, device, model_config)
    seed_everything(train_config.seed)
    model = accelerate(build_model(model_config)).to(device).train()
    worst = _worst_batch(model_config, train_config, device)
    step = optimizer_stepper(model, train_config, precision, worst)
    step()  # warm-up: allocates the optimizer state (and compiles, with --compile)
    synchronize(device)
    if device.type == "cpu":  # the warm-up's freed batch may still count in the process's size
        release_freed_memory()
    baseline = _current_memory(device)
    _reset_peak(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    elapsed = time.perf_counter() - started
    peak = max(_peak_memory(device), baseline)
    free = _free_memory(device)
    seq_len = model_config.max_len
    rows = max(1, train_config.max_tokens // seq_len)
    tokens = rows * seq_len
    return DryRunReport(
        device=str(device),
        precision=precision.name,
        parameters=model.parameter_counts()["total"],
        rows=rows,
        seq_len=seq_len,
        tokens_per_batch=tokens,
        steps=steps,
        ms_per_step=round(1000 * elapsed / steps, 1),
        tokens_per_s=round(tokens * steps / max(elapsed, 1e-9), 1),
        memory="allocated" if device.type == "cuda" else "RSS",
        peak_bytes=peak,
        baseline_bytes=baseline,
        free_bytes=free,
        max_tokens=train_config.max_tokens,
        max_tokens_fit=_max_tokens_fit(peak - baseline, tokens, free),
        kv_cache_bytes_per_token=model_config.kv_cache_bytes_per_token(),
        kv_heads=model_config.n_kv_heads,
        n_heads=model_config.n_heads,
    )


def _worst_batch(
    model_config: ModelConfig, train_config: TrainConfig, device: torch.device
) -> Callable[[], Batch]:
    """The worst-case batch: every row ``max_len`` tokens long on both sides, as many rows as
    ``max_tokens`` admits."""
    seq_len = model_config.max_len
    rows = max(1, train_config.max_tokens // seq_len)
    low = 4  # the first id after the special tokens
    src = torch.randint(low, model_config.src_vocab_size, (rows, seq_len), device=device)
    tgt = torch.randint(low, model_config.tgt_vocab_size, (rows, seq_len + 1), device=device)
    batch = Batch(src, tgt[:, :-1], tgt[:, 1:])
    return lambda: batch


def optimizer_stepper(
    model: TransformerBase,
    train_config: TrainConfig,
    precision: Precision,
    next_batch: Callable[[], Batch],
) -> Callable[[], None]:
    """One optimizer step of an encoder-decoder on ``next_batch()``, as training takes it
    (precision, loss, clipping), with an optimizer of its own at a small learning rate: for
    timing a configuration, not for training it."""
    forward = torch.compile(model) if train_config.compile else model
    optimizer = build_optimizer(model, train_config)
    for group in optimizer.param_groups:
        group["lr"] = 1e-4
    scaler = precision.scaler()

    def step() -> None:
        batch = next_batch()
        with precision.autocast():
            logits = forward(batch.src, batch.tgt_in).logits
            _, loss = scaled_loss(
                logits,
                batch.tgt_out,
                train_config.label_smoothing,
                1 / batch.tgt_out.numel(),
                fused=train_config.compile,
            )
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_config.clip_norm or 1e9)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _max_tokens_fit(activations: int, tokens: int, free: int | None) -> int | None:
    """The largest --max-tokens whose activations fit in the free memory (with headroom)."""
    if free is None:
        return None
    # Activation memory grows linearly with the tokens of a batch at a fixed length.
    activations = max(activations, 1)
    per_token = activations / tokens
    return int(HEADROOM * (free + activations) / per_token) // 64 * 64


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _status_bytes(field: str) -> int | None:
    """A ``kB`` field of /proc/self/status (Linux), in bytes."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _current_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    return _status_bytes("VmRSS") or _max_rss()


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: "5" resets the process's peak RSS (VmHWM) to its current RSS
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return _status_bytes("VmHWM") or _max_rss()


def _max_rss() -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return usage if sys.platform == "darwin" else usage * 1024  # bytes on macOS, kB on Linux


def _free_memory(device: torch.device) -> int | None:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
