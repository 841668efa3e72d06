"""Data-parallel runs on this machine: ``train(..., nproc=N)`` relaunches itself under torchrun.

The resolved configs go to the ranks as a ``--config`` YAML file (every value, so each rank
runs exactly the run resolved here) and the other run options as `tformer train` flags. When
torchrun is done, the result is read back from the run folder.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tformer import checkpoint as ckpt
from tformer.config import ModelConfig, TrainConfig
from tformer.device import resolve_device
from tformer.errors import TformerError
from tformer.training import distributed as dist_
from tformer.training.configs import TokenizerSpec, dump_config
from tformer.training.reporting import TrainResult


@dataclass(frozen=True)
class Job:
    """One run, resolved: its configs and folders."""

    model: ModelConfig | None  # None: resuming with the checkpoint's architecture
    train: TrainConfig
    tokenizer: TokenizerSpec
    out: Path
    resume_from: Path | None = None
    init_from: Path | None = None  # fine-tuning: the checkpoint whose weights it starts from
    defaults: tuple[str, ...] = ()  # the imported-model defaults applied (none given instead)
    free: tuple[str, ...] = ()  # the settings --fit-budget may choose (none given)


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How a run reads its inputs and treats its folder (`tformer train` flags of the same name)."""

    tokenizer: Path | None = None
    overwrite: bool = False
    strict: bool = False
    tokenized_cache: Path | None = None
    num_proc: int | None = None
    allow_data_change: bool = False
    log_to: tuple[str, ...] = ()  # tensorboard / wandb / mlflow (tformer.training.loggers)

    def argv(self) -> list[str]:
        args: list[str] = [arg for target in self.log_to for arg in ("--log-to", target)]
        if self.tokenizer is not None:
            args += ["--tokenizer", str(self.tokenizer)]
        if self.overwrite:
            args.append("--overwrite")
        if self.strict:
            args.append("--strict")
        if self.tokenized_cache is None:
            args.append("--no-cache")
        else:
            args += ["--cache-dir", str(self.tokenized_cache)]
        if self.num_proc is not None:
            args += ["--num-proc", str(self.num_proc)]
        if self.allow_data_change:
            args.append("--allow-data-change")
        return args


class DataParallelFailed(TformerError):
    """A rank of a data-parallel run failed; the ranks' own errors were printed above."""

    def __init__(self, code: int) -> None:
        super().__init__(f"data-parallel training stopped with exit code {code} (see above)")
        self.exit_code = code


def train_data_parallel(job: Job, options: RunOptions, nproc: int) -> TrainResult:
    """Run ``job`` under torchrun with ``nproc`` processes; the result comes from its folder.

    Raises:
        DeviceError: more processes than GPUs on CUDA.
        DataParallelFailed: a rank failed (its exit code is kept).
    """
    if job.resume_from is None and nproc > 1:  # a resumed run's device is the checkpoint's
        dist_.check_gpus_per_process(resolve_device(job.train.device), nproc)
    with tempfile.TemporaryDirectory(prefix="tformer-") as folder:
        config = Path(folder) / "run.yaml"
        # A resumed or fine-tuned run's architecture and tokenizer are its checkpoint's: the
        # ranks read them from there.
        from_checkpoint = job.init_from is not None or job.resume_from is not None
        model = None if from_checkpoint else job.model
        config.write_text(dump_config(model, job.train, job.tokenizer), encoding="utf-8")
        argv = ["train", "--config", str(config), "--recipe", "none", "--out", str(job.out)]
        if job.resume_from is not None:
            argv += ["--resume", str(job.resume_from)]
        if job.init_from is not None:
            argv += ["--init-from", str(job.init_from)]
        code = dist_.launch(nproc, argv + options.argv())
    if code != 0:
        raise DataParallelFailed(code)
    return result_of_run(job.out)


def result_of_run(run: Path) -> TrainResult:
    """What a finished run reports, read back from its metrics.jsonl and latest checkpoint."""
    records = ckpt.read_metrics(run)
    last = _last(records, "loss")
    result = TrainResult(
        run_dir=run,
        checkpoint=ckpt.resolve(run),
        step=int(last.get("step", 0)),
        epoch=float(last.get("epoch", 0.0)),
        elapsed=float(last.get("elapsed", 0.0)),
        train_loss=last.get("loss"),
        val_loss=_last(records, "val_loss").get("val_loss"),
        skipped_steps=int(last.get("skipped_steps", 0)),
    )
    exact = _last(records, "validation_exact_match")
    if exact:
        result.exact_match = exact["validation_exact_match"]
        result.exact_match_split = "validation"
    return result


def _last(records: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return next((r for r in reversed(records) if key in r), {})
