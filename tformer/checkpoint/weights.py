"""The weights file against the configuration: tensor names, shapes, dtypes and architecture.

``config.json`` says which model the weights belong to, but editing it changes no weight: a
checkpoint whose ``n_heads`` or ``activation`` was edited (and its manifest rewritten) would load
into another model and translate garbage. So the weights carry their own record:
``model.safetensors``'s header metadata holds the model configuration they were saved with
(``"model"``, JSON), which loading and ``tformer verify`` compare with ``config.json`` field by
field. Every tensor must be float32 (the format's only weight dtype: training keeps float32
master weights under bf16/fp16 autocast), and names and shapes must be what ``config.json``
implies. Checkpoints saved before the metadata existed have no record; they still load.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from tformer.config import ADDED_MODEL_KEYS, ModelConfig
from tformer.errors import CheckpointError
from tformer.model import build_model
from tformer.paths import excerpt, excerpt_list, first_line, json_loads

DTYPE = "F32"  # the dtype of every tensor in model.safetensors (safetensors' spelling)
MODEL_KEY = "model"  # the header metadata key holding the saved ModelConfig (JSON)
NAMES_SHOWN = 3  # tensor names quoted in one message; the rest are counted


@dataclass(frozen=True)
class Header:
    """A safetensors file's header: {name: (dtype, shape)} and its str -> str metadata."""

    tensors: dict[str, tuple[str, tuple[int, ...]]]
    metadata: dict[str, str]


def weights_metadata(config: ModelConfig, format_name: str) -> dict[str, str]:
    """The header metadata ``save_checkpoint`` writes into model.safetensors."""
    return {"format": format_name, MODEL_KEY: json.dumps(config.to_dict(), sort_keys=True)}


def read_header(path: Path) -> Header:
    """The header of safetensors file ``path``, reading no tensor data.

    Raises:
        CheckpointError: missing, or not a safetensors file.
    """
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        with safe_open(str(path), framework="pt") as handle:
            tensors = {}
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                piece = handle.get_slice(name)
                tensors[name] = (piece.get_dtype(), tuple(piece.get_shape()))
            return Header(tensors, dict(handle.metadata() or {}))
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise CheckpointError(f"{path}: bad safetensors header ({first_line(error)})") from error


def names(items: list[str]) -> str:
    """Tensor names for a one-line message: a few, each cut, then how many more."""
    return excerpt_list(items, NAMES_SHOWN)


def check_dtypes(path: Path, header: Header) -> None:
    """Every tensor is float32.

    Raises:
        CheckpointError: naming the tensors of another dtype and the two dtypes.
    """
    wrong = [n for n, (dtype, _) in header.tensors.items() if dtype != DTYPE]
    if wrong:
        dtype = header.tensors[wrong[0]][0]
        raise CheckpointError(
            f"{path}: tensor {names(wrong)} is {excerpt(dtype)}, but the checkpoint format "
            f"stores {DTYPE} (float32) weights; the file was changed after saving, use "
            "another checkpoint"
        )


def expected_tensors(
    config: ModelConfig, model: Callable[[], torch.nn.Module] | None = None
) -> list[dict[str, tuple[int, ...]]]:
    """The tensors a model of ``config`` saves, those of the one ``model`` builds when given
    (the model a load builds anyway: building on the meta device imports ``torch._dynamo``,
    over a second) or else built on the meta device (no memory): one {name: shape} group per
    tensor; tied names share a group, of which the file holds one."""
    if model is None:
        with torch.device("meta"):
            state = build_model(config).state_dict(keep_vars=True)
    else:
        state = model().state_dict(keep_vars=True)
    groups: dict[int, dict[str, tuple[int, ...]]] = {}
    for name, tensor in state.items():
        groups.setdefault(id(tensor), {})[name] = tuple(tensor.shape)
    return list(groups.values())


def check_shapes(
    path: Path,
    header: Header,
    config: ModelConfig,
    config_path: Path,
    model: Callable[[], torch.nn.Module] | None = None,
) -> None:
    """Tensor names and shapes are those ``config`` implies (``model``: builds one from it).

    Raises:
        CheckpointError: naming the missing, unexpected and mismatched tensors (a few each).
    """
    groups = expected_tensors(config, model)
    expected = {name: shape for group in groups for name, shape in group.items()}
    problems = []
    missing = [next(iter(g)) for g in groups if not set(g) & set(header.tensors)]
    if missing:
        problems.append(f"missing {names(missing)}")
    unexpected = [n for n in header.tensors if n not in expected]
    if unexpected:
        problems.append(f"unexpected {names(unexpected)}")
    mismatched = [
        n for n, (_, shape) in header.tensors.items() if n in expected and shape != expected[n]
    ]
    if mismatched:
        first = mismatched[0]
        problems.append(
            f"shape differs for {names(mismatched)} ({excerpt(first)} is "
            f"{list(header.tensors[first][1])}, {config_path.name} implies {list(expected[first])})"
        )
    if problems:
        raise CheckpointError(
            f"{path}: does not match the model {config_path} describes: {'; '.join(problems)}"
        )


def saved_architecture(path: Path, header: Header) -> dict[str, Any] | None:
    """The model configuration recorded in the weights' metadata; None for an old checkpoint.

    Raises:
        CheckpointError: the record is there but is not a JSON object.
    """
    text = header.metadata.get(MODEL_KEY)
    if text is None:
        return None
    try:
        record = json_loads(text)
    except json.JSONDecodeError as error:
        raise CheckpointError(
            f"{path}: the model configuration in its header is not JSON ({first_line(error)})"
        ) from error
    if not isinstance(record, dict):
        raise CheckpointError(f"{path}: the model configuration in its header is not an object")
    return record


def check_architecture(path: Path, header: Header, config: ModelConfig, config_path: Path) -> bool:
    """``config`` (from config.json) is the configuration the weights were saved with.

    Returns:
        True when compared; False for an old checkpoint whose weights record none.

    Raises:
        CheckpointError: naming each field that differs, with both values.
    """
    saved = saved_architecture(path, header)
    if saved is None:
        return False
    mine = config.to_dict()
    # A record written before a key existed holds that key's default (see ADDED_MODEL_KEYS).
    defaults = ModelConfig().to_dict()
    saved = {**{k: defaults[k] for k in ADDED_MODEL_KEYS}, **saved}
    differ = sorted(k for k in {*mine, *saved} if mine.get(k) != saved.get(k))
    if differ:
        said = "; ".join(
            f"says {k} {excerpt(mine.get(k))}, the weights were saved with {excerpt(saved.get(k))}"
            for k in differ[:NAMES_SHOWN]
        )
        more = len(differ) - NAMES_SHOWN
        said += f"; and {more} more fields" if more > 0 else ""
        raise CheckpointError(
            f"{config_path}: {said}; it was edited after saving: restore it or use another "
            "checkpoint"
        )
    return True


def check_weights(
    weights: Path,
    config: ModelConfig,
    config_path: Path,
    model: Callable[[], torch.nn.Module] | None = None,
) -> bool:
    """Everything the header says against ``config``: dtypes, names and shapes, architecture
    (``model``: builds one from ``config``, called once the header's own checks pass, to read
    the expected shapes from).

    Returns:
        Whether the architecture record was there to compare (False: an old checkpoint).
    """
    header = read_header(weights)
    compared = check_architecture(weights, header, config, config_path)  # the clearest message
    check_dtypes(weights, header)
    check_shapes(weights, header, config, config_path, model)
    return compared


def non_finite(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """The names of ``tensors`` holding a NaN or an infinity (one pass over each, no copy)."""
    return [
        name
        for name, tensor in tensors.items()
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())
    ]


def check_finite(
    tensors: Mapping[str, torch.Tensor],
    path: Path,
    why: str = "the weights diverged or were damaged, so no model of them works",
) -> None:
    """Refuse weights with a NaN or an infinity: a model of them prints empty lines or garbage.

    Raises:
        CheckpointError: naming ``path``, the tensors, and ``why`` such weights are refused.
    """
    bad = non_finite(tensors)
    if bad:
        raise CheckpointError(f"{path}: non-finite values (NaN or infinity) in {names(bad)}; {why}")
