"""``--init-from CKPT``: fine-tuning, a new run that starts from a trained checkpoint.

The run takes the checkpoint's weights, architecture and tokenizer(s); everything else is new:
the optimizer state, the learning-rate schedule, the step counter, the weight average and the
run folder, which is an ordinary run that ``--resume`` continues. Settings that contradict the
checkpoint's architecture or tokenizer are refused before anything is loaded
(tformer.training.configs, through the checks ``--resume`` uses), and a ``--tokenizer`` other
than the checkpoint's is refused: the new data is tokenised with the checkpoint's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tformer import checkpoint as ckpt
from tformer.checkpoint.files import read_manifest
from tformer.config import ModelConfig
from tformer.errors import ConfigError
from tformer.training.configs import architecture, check_architecture
from tformer.training.inputs import check_same_tokenizer

OPTION = "--init-from"


def check_not_resuming(init_from: Path | None, resume: object) -> None:
    """``--init-from`` starts a new run; ``--resume`` continues one: not both."""
    if init_from is not None and resume is not False and resume is not None:
        raise ConfigError(
            f"--init-from {init_from} starts a new run from a checkpoint's weights and --resume "
            "continues a run where it stopped; give one"
        )


def check_out(start: Path, out: Path, *, overwrite: bool) -> None:
    """``--overwrite`` must not replace the run that holds the checkpoint being fine-tuned."""
    inside = start.resolve().is_relative_to(out.resolve())
    if overwrite and inside:
        raise ConfigError(
            f"--init-from {start} is inside --out {out}, which --overwrite would replace; "
            "choose another --out"
        )


def load_start(
    folder: Path, *, model_config: ModelConfig | None, tokenizer: Path | None
) -> ckpt.Checkpoint:
    """The checkpoint a fine-tuned run starts from (on the CPU), once an architecture or a
    ``--tokenizer`` that contradicts it has been refused.

    Raises:
        CheckpointError: the checkpoint is missing or damaged, or ``tokenizer`` is not its own.
        ConfigError: ``model_config`` contradicts the checkpoint's architecture.
    """
    start = ckpt.load_checkpoint(folder, "cpu")
    if model_config is not None:
        check_architecture(start.model_config, architecture(model_config), OPTION)
    if tokenizer is not None:
        check_same_tokenizer(tokenizer, start, OPTION)
    return start


def provenance(start: ckpt.Checkpoint) -> dict[str, Any]:
    """What a fine-tuned run records about where it started (in each checkpoint's trainer
    state): the checkpoint, its step, the SHA-256 of its weights file, and for an imported
    model the source it was imported from."""
    weights = read_manifest(start.path).get(ckpt.WEIGHTS, {})
    record: dict[str, Any] = {
        "path": str(start.path.resolve()),
        "step": start.step,
        "weights_sha256": weights.get("sha256"),
    }
    origin = ckpt.read_origin(start.path)
    if origin is not None:  # an imported model: where its weights were published
        record["imported_from"] = origin.get("source")
    return record
