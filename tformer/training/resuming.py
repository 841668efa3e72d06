"""What resuming a run takes besides its configs: the checkpoint, its training state, and the
check that the training data is the data the run was trained on (tformer.data.fingerprint)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tformer import checkpoint as ckpt
from tformer.checkpoint.files import TRAINER_STATE
from tformer.checkpoint.training_state import saved_data_fingerprint
from tformer.config import TrainConfig
from tformer.data.fingerprint import changes
from tformer.errors import CheckpointError, DataError
from tformer.paths import first_line
from tformer.training.configs import with_older_checkpoint
from tformer.training.state import restore_rng


def restore_training_state(
    resumed: ckpt.Checkpoint | None, optimizer: torch.optim.Optimizer, cfg: TrainConfig
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The resumed checkpoint's trainer state and extra tensors, with the optimizer and the
    RNG streams restored from it ({} and {} for a new run)."""
    if resumed is None:
        return {}, {}
    state, rng, extra = ckpt.load_training_state(resumed.path, optimizer)
    _apply_hyperparameters(optimizer, cfg)
    try:
        meta = state.get("rng", {})
        if not isinstance(meta, dict):
            raise TypeError(f"'rng' is {type(meta).__name__}, not an object")
        restore_rng(meta, rng)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as error:
        raise CheckpointError(
            f"{resumed.path / TRAINER_STATE}: random states unusable ({first_line(error)}); "
            "resume from another checkpoint of the run"
        ) from error
    return state, extra


def check_data(folder: Path, data: dict[str, Any], *, allow: bool) -> str | None:
    """Refuse to resume on data that changed since checkpoint ``folder`` was saved (unless
    ``allow``: then the note to print). Checkpoints saved before fingerprints resume as they are.

    Raises:
        DataError: naming each split that changed, and --allow-data-change.
    """
    saved = saved_data_fingerprint(folder)
    found = changes(saved, data) if saved is not None else []
    if not found:
        return None
    what = "; ".join(found)
    if not allow:
        raise DataError(
            f"--data {data['data'] or 'the bundled data'}: changed since {folder} was saved: "
            f"{what}; resume on the data the run was trained on, or give --allow-data-change "
            "to train on this data anyway"
        )
    return f"the training data changed since {folder} was saved ({what}); training on it"


def load_for_resume(run: Path, folder: Path) -> ckpt.Checkpoint:
    try:
        return ckpt.load_checkpoint(folder, "cpu")
    except CheckpointError as error:
        raise with_older_checkpoint(error, run, folder) from error


def _apply_hyperparameters(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> None:
    """Loading an optimizer state brings back the saved betas / eps / decay; the current
    configuration wins (the learning rate is set at every step anyway)."""
    for group in optimizer.param_groups:
        group["betas"] = (cfg.beta1, cfg.beta2)
        group["eps"] = cfg.eps
        if "weight_decay" in group:
            group["weight_decay"] = cfg.weight_decay
