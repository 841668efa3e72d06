"""``--log-to tensorboard|wandb|mlflow``: a run's records, also written where other tools read.

Every record of ``metrics.jsonl`` goes to each logger as scalars keyed by step (``train/loss``,
``train/lr``, ``train/tokens_per_s``, ``train/skipped_steps`` ...; ``validation/loss``,
``validation/bleu``, ``validation/chrf``, ``validation/exact_match``,
``validation/final_bleu`` ...), and at each evaluation the mean attention entropy of every
layer (``attention_entropy/encoder/layer_0``, ``.../decoder/...``, ``.../cross/...``) on a
fixed batch of validation pairs. Only rank 0 logs.
The packages are optional extras, imported only when a run asks for them; a missing one is
refused before anything is loaded or written.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from tformer import checkpoint as ckpt
from tformer.config import PAD_ID
from tformer.data.batching import IdPair, collate
from tformer.data.pairs import EncodedSplit
from tformer.errors import ConfigError
from tformer.model import TransformerBase
from tformer.paths import excerpt, first_line
from tformer.training.reporting import Reporter

# --log-to target -> the package it needs (the extra of the same name installs it).
TARGETS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
TENSORBOARD_DIR = "tensorboard"  # inside the run folder
ENTROPY_PAIRS = 8  # the first validation pairs, on which attention entropy is measured
# Record keys that are bookkeeping, not measurements.
NOT_SCALARS = frozenset({"step", "total_steps", "time_budget", "training_budget", "best"})


class MetricLogger(Protocol):
    """One destination of ``--log-to``."""

    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def log_targets(values: Sequence[str]) -> tuple[str, ...]:
    """``--log-to`` values (repeated or comma-separated), checked, each once, in order.

    Raises:
        ConfigError: an unknown target.
    """
    found: list[str] = []
    for value in values:
        for name in (part.strip().lower() for part in str(value).split(",")):
            if not name:
                continue
            if name not in TARGETS:
                raise ConfigError(
                    f"--log-to {excerpt(name)} is unknown; choose from {', '.join(TARGETS)} "
                    "(repeat the option or separate them with commas)"
                )
            if name not in found:
                found.append(name)
    return tuple(found)


def check_installed(targets: Sequence[str]) -> None:
    """Refuse a target whose package is not installed, naming the extra that installs it."""
    for target in targets:
        package = TARGETS[target]
        try:
            present = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):  # a module set to None, or one without a spec
            present = False
        if not present:
            raise ConfigError(
                f"--log-to {target} needs the {package} package, which is not installed; "
                f'install it with: pip install "tformer[{target}]"'
            )


def open_loggers(
    targets: Sequence[str], out: Path, params: Mapping[str, Any], *, step: int = 0
) -> list[MetricLogger]:
    """The loggers of ``targets`` for run folder ``out`` (``params``: the run's configs), for
    a run that goes on from ``step`` (0, or the step resumed from).

    Raises:
        ConfigError: a tool that would not start (not logged in, no tracking server ...).
    """
    makers: dict[str, Callable[[Path, Mapping[str, Any], int], MetricLogger]] = {
        "tensorboard": TensorBoardLogger,
        "wandb": WandbLogger,
        "mlflow": MlflowLogger,
    }
    opened: list[MetricLogger] = []
    for target in targets:
        try:
            opened.append(makers[target](out, params, step))
        except Exception as error:  # each tool fails its own way; none may end in a traceback
            for logger in opened:
                logger.close()
            raise ConfigError(
                f"--log-to {target}: {TARGETS[target]} would not start ({first_line(error)}); "
                "see docs/training.md for its settings, or leave it out"
            ) from error
    return opened


class TensorBoardLogger:
    """Event files in ``RUN/tensorboard/`` (``tensorboard --logdir RUN/tensorboard``).

    A resumed run marks its first step in its event file, so readers drop what the interrupted
    run logged after the checkpoint (as ``--resume`` cuts metrics.jsonl back)."""

    def __init__(self, out: Path, params: Mapping[str, Any], step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        purge = step + 1 if step > 0 else None
        self.writer = SummaryWriter(log_dir=str(out / TENSORBOARD_DIR), purge_step=purge)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()  # a run killed later keeps what it logged

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A Weights & Biases run named after the run folder (project ``$WANDB_PROJECT`` or
    ``tformer``; ``WANDB_MODE=offline`` works without an account)."""

    def __init__(self, out: Path, params: Mapping[str, Any], step: int) -> None:
        import wandb

        project = os.environ.get("WANDB_PROJECT", "tformer")
        self.run = wandb.init(project=project, name=out.name, dir=str(out), config=dict(params))

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowLogger:
    """An MLflow run named after the run folder (where ``$MLFLOW_TRACKING_URI`` says)."""

    def __init__(self, out: Path, params: Mapping[str, Any], step: int) -> None:
        import mlflow

        self.mlflow = mlflow
        mlflow.start_run(run_name=out.name)
        flat = {f"{part}.{k}": v for part, values in params.items() for k, v in values.items()}
        mlflow.log_params(flat)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.mlflow.log_metrics(dict(values), step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def scalar_name(key: str) -> str:
    """The logger's name for a metrics.jsonl key: ``val_loss`` -> ``validation/loss``."""
    if key.startswith("val_"):
        return f"validation/{key.removeprefix('val_')}"
    if key.startswith("validation_"):
        return f"validation/{key.removeprefix('validation_')}"
    return f"train/{key}"


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The measurements of a metrics.jsonl record, by logger name."""
    return {
        scalar_name(key): float(value)
        for key, value in record.items()
        if key not in NOT_SCALARS
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    }


class Records:
    """Where a run's records go: metrics.jsonl, the reporter, and the loggers of --log-to."""

    def __init__(self, out: Path, report: Reporter, loggers: Sequence[MetricLogger] = ()) -> None:
        self.out, self.report, self.loggers = out, report, list(loggers)

    def write(self, record: dict[str, Any]) -> None:
        ckpt.append_metrics(self.out, record)
        self.report.log(record)
        values = scalars(record)
        if values and isinstance(record.get("step"), int):
            for logger in self.loggers:
                logger.log(record["step"], values)

    def attention(self, model: TransformerBase, split: EncodedSplit, step: int) -> None:
        """Log the mean attention entropy per layer on the split's first pairs (loggers only:
        metrics.jsonl keeps its records as they were)."""
        if not self.loggers or not split.pairs:
            return
        values = attention_entropy(model, split.pairs[:ENTROPY_PAIRS])
        for logger in self.loggers:
            logger.log(step, values)


@torch.no_grad()
def attention_entropy(model: TransformerBase, pairs: Sequence[IdPair]) -> dict[str, float]:
    """The mean entropy (nats) of the attention rows of each layer, by kind and layer.

    One teacher-forced pass in eval mode over ``pairs`` with the maps returned. For each pair,
    the entropy of each row is averaged over the heads and the real (not padding) rows that
    have a choice to make (the first decoder row sees one key); then over the pairs. Per pair
    this is the mean over heads of ``tformer.analysis.head_statistics``' entropy.
    """
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        batch = collate(list(pairs)).to(device)
        maps = model(batch.src, batch.tgt_in, need_weights=True).attentions
    finally:
        model.train(was_training)
    assert maps is not None
    target_rows = batch.tgt_in != PAD_ID  # (B, T)
    after_first = torch.arange(target_rows.size(1), device=device) > 0
    kinds = {
        "encoder": (maps.encoder, batch.src != PAD_ID),
        "decoder": (maps.decoder, target_rows & after_first),
        "cross": (maps.cross, target_rows),
    }
    return {
        f"attention_entropy/{kind}/layer_{i}": mean_row_entropy(weights, rows)
        for kind, (layers, rows) in kinds.items()
        for i, weights in enumerate(layers)
    }


def mean_row_entropy(weights: Tensor, rows: Tensor) -> float:
    """(B, H, R, C) attention weights, (B, R) rows to count -> the mean over the batch of the
    mean over heads and counted rows of each row's entropy."""
    probs = weights.double()
    entropy = -torch.special.xlogy(probs, probs).sum(-1)  # (B, H, R)
    counted = rows[:, None, :].to(entropy.dtype)  # (B, 1, R)
    per_head = (entropy * counted).sum(-1) / counted.sum(-1).clamp(min=1)  # (B, H)
    return float(per_head.mean())
