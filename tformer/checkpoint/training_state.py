"""The training state of a checkpoint: what ``--resume`` needs besides the weights.

``optimizer.safetensors`` holds the optimizer's tensors, the RNG states (``rng.*``) and extra
tensors (``extra.*``, e.g. the raw weights behind an averaged model); ``trainer_state.json``
holds the rest: the trainer's position and the optimizer's scalars and parameter groups.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from tformer.checkpoint.files import OPTIMIZER, TRAINER_STATE, check_manifest, first_line
from tformer.checkpoint.run_dir import step_of
from tformer.config import INT_LIMIT, SEED_LIMIT
from tformer.errors import CheckpointError
from tformer.paths import excerpt, json_loads

# The trainer's position: counts no run can exceed (--max-steps is at most INT_LIMIT; tokens
# seen are counted in 64 bits), and seconds of training.
POSITION_LIMITS = {"step": INT_LIMIT, "epoch": INT_LIMIT, "batch": INT_LIMIT, "tokens": SEED_LIMIT}


def _optimizer_to_files(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], Any]:
    """Split an optimizer state dict into flat tensors (safetensors) and the rest (JSON)."""
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, values in state["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _optimizer_from_files(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    for index, values in meta.get("scalars", {}).items():
        state.setdefault(int(index), {}).update(values)
    return {"state": state, "param_groups": meta["param_groups"]}


def write_training_state(
    folder: Path,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
    more_tensors: dict[str, torch.Tensor],
) -> None:
    """What --resume needs besides the weights: optimizer, RNG and trainer state."""
    tensors, meta = _optimizer_to_files(optimizer)
    tensors.update({k: v.contiguous() for k, v in more_tensors.items()})
    save_file(tensors, str(folder / OPTIMIZER))
    state = {**trainer_state, "optimizer": meta}
    (folder / TRAINER_STATE).write_text(json.dumps(state) + "\n", encoding="utf-8")


def load_training_state(
    folder: Path, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Restore ``optimizer`` in place; return the trainer state, RNG and extra tensors."""
    state_path, tensors_path = folder / TRAINER_STATE, folder / OPTIMIZER
    if not state_path.is_file() or not tensors_path.is_file():
        raise CheckpointError(
            f"{folder}: holds no training state ({TRAINER_STATE}, {OPTIMIZER}), so it cannot be "
            "resumed; resume from a step-* checkpoint of the run"
        )
    check_manifest(folder, [TRAINER_STATE, OPTIMIZER])
    try:
        state = json_loads(state_path.read_text(encoding="utf-8"))
        tensors = load_file(str(tensors_path))
        rng = {k.removeprefix("rng."): v for k, v in tensors.items() if k.startswith("rng.")}
        extra = {k.removeprefix("extra."): v for k, v in tensors.items() if k.startswith("extra.")}
        opt_tensors = {k: v for k, v in tensors.items() if not k.startswith(("rng.", "extra."))}
        optimizer.load_state_dict(_optimizer_from_files(opt_tensors, state.pop("optimizer")))
    except (
        OSError,
        UnicodeDecodeError,
        json.JSONDecodeError,
        SafetensorError,
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
    ) as error:
        raise CheckpointError(
            f"{folder}: training state unreadable ({first_line(error)})"
        ) from error
    check_position(folder, state)
    check_bookkeeping(folder, state)
    return state, rng, extra


def check_bookkeeping(folder: Path, state: dict[str, Any]) -> None:
    """Refuse the trainer state's running figures unless each is of its kind: counts whole
    and from 0, losses numbers (or null where none was measured yet).

    Raises:
        CheckpointError: naming trainer_state.json, the key and the value.
    """
    path = folder / TRAINER_STATE
    window, best = state.get("window", {}), state.get("best") or {}
    if not isinstance(window, dict) or not isinstance(best, dict):
        raise CheckpointError(f"{path}: 'window' and 'best' must be objects")
    figures = {
        "window.loss": (window.get("loss", 0.0), False),
        "window.tokens": (window.get("tokens", 0), True),
        "last_val": (state.get("last_val"), False),
        "last_train": (state.get("last_train"), False),
        "skipped": (state.get("skipped", 0), True),
        "best.value": (best.get("value"), False),
        "best.evals_without_gain": (best.get("evals_without_gain", 0), True),
    }
    for key, (value, count) in figures.items():
        if count:
            ok = type(value) is int and 0 <= value <= SEED_LIMIT
        else:
            ok = value is None or type(value) in (int, float)  # inf: a loss that overflowed
        if not ok:
            what = "a count from 0" if count else "a number or null"
            raise CheckpointError(f"{path}: {key} {excerpt(value)} is not {what}")


def check_position(folder: Path, state: object) -> dict[str, Any]:
    """The trainer position recorded in ``folder``'s trainer state, refused unless it is one
    a run can reach: whole counts in range, finite seconds, the step of the folder's name.

    Raises:
        CheckpointError: naming trainer_state.json, the key and the value.
    """
    path = folder / TRAINER_STATE
    position = state.get("position") if isinstance(state, dict) else None
    if not isinstance(position, dict) or "step" not in position:
        raise CheckpointError(f"{path}: no trainer position (position.step); not resumable")
    unknown = sorted(map(str, set(position) - {*POSITION_LIMITS, "elapsed"}))
    if unknown:
        raise CheckpointError(f"{path}: unknown position key {excerpt(unknown[0])}")
    for key, limit in POSITION_LIMITS.items():
        value = position.get(key, 0)
        if type(value) is not int or not 0 <= value <= limit:
            raise CheckpointError(
                f"{path}: position.{key} {excerpt(value)} is not a count from 0 to {limit:,}"
            )
    elapsed = position.get("elapsed", 0.0)
    if type(elapsed) not in (int, float) or not (math.isfinite(elapsed) and elapsed >= 0):
        raise CheckpointError(f"{path}: position.elapsed {excerpt(elapsed)} is not a duration")
    named = step_of(folder)
    if named is not None and position["step"] != named:
        raise CheckpointError(
            f"{path}: position.step {position['step']} contradicts the folder's step {named}; "
            "the file belongs to another checkpoint"
        )
    return position


def saved_data_fingerprint(folder: Path) -> dict[str, Any] | None:
    """The fingerprint of the training data recorded in ``folder``'s trainer state; None when
    there is none (a checkpoint saved before fingerprints, or an unreadable state, which
    ``load_training_state`` reports)."""
    return saved_record(folder, "data")


def saved_record(folder: Path, key: str) -> dict[str, Any] | None:
    """The record ``key`` of ``folder``'s trainer state (e.g. ``init_from``, where a fine-tuned
    run started); None when there is none, or no readable trainer state."""
    try:
        check_manifest(folder, [TRAINER_STATE])
        state = json_loads((folder / TRAINER_STATE).read_text(encoding="utf-8"))
    except (CheckpointError, OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    found = state.get(key) if isinstance(state, dict) else None
    return found if isinstance(found, dict) else None
