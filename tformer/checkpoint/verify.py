"""``tformer verify``: check a checkpoint thoroughly, trusting none of it, item by item."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tformer.checkpoint import weights
from tformer.checkpoint.files import (
    CONFIG,
    FORMAT_VERSION,
    MANIFEST,
    OPTIMIZER,
    TRAINER_STATE,
    WEIGHTS,
    first_line,
    manifest_problem,
    read_manifest,
)
from tformer.checkpoint.run_dir import resolve
from tformer.checkpoint.store import (
    check_vocabulary,
    load_tokenizers,
    load_weights,
    parse_configs,
    read_config,
)
from tformer.checkpoint.training_state import check_position
from tformer.config import ModelConfig
from tformer.errors import CheckpointError, ConfigError
from tformer.model import build_model
from tformer.paths import excerpt_list, json_loads


@dataclass(frozen=True)
class Check:
    """One line of ``tformer verify``: what was checked, whether it passed, and the detail."""

    name: str
    ok: bool
    detail: str


def verify_checkpoint(path: str | Path) -> tuple[Path, list[Check]]:
    """Check a checkpoint thoroughly without trusting any of it: manifest, every file's size and
    SHA-256, safetensors headers, config, tokenizer binding, training state, and a strict load.

    Returns:
        The checkpoint folder and one ``Check`` per item; all ``ok`` means the checkpoint is sound.

    Raises:
        CheckpointError: the path is not a checkpoint at all (missing, empty or foreign folder).
    """
    folder = resolve(path)
    if not (folder / MANIFEST).is_file():
        read_config(folder)  # someone else's folder is not a checkpoint with problems
    checks: list[Check] = []

    def run(name: str, action: Callable[[], tuple[str, Any]]) -> Any:
        try:
            detail, value = action()
        except (CheckpointError, ConfigError) as error:
            checks.append(Check(name, False, str(error)))
            return None
        checks.append(Check(name, True, detail))
        return value if value is not None else True

    files = run(MANIFEST, lambda: _verify_manifest(folder))
    for name, entry in (files or {}).items():
        run(f"file {name}", partial(_verify_file, folder, name, entry))
    if files is not None:
        unlisted = sorted(
            p.name for p in folder.iterdir() if p.is_file() and p.name not in {*files, MANIFEST}
        )
        if unlisted:
            checks.append(Check("unlisted files", True, f"ignored: {excerpt_list(unlisted)}"))
    config = run("configuration", lambda: _verify_config(folder))
    model_config = config[0] if config else None
    run("architecture", lambda: _verify_architecture(folder, model_config))
    run(f"{WEIGHTS} header", lambda: _verify_weights_header(folder, model_config))
    run("tokenizer", lambda: _verify_tokenizer(folder, config[1] if config else None, model_config))
    run("training state", lambda: _verify_training_state(folder))
    run("weights load", lambda: _verify_load(folder, model_config))
    return folder, checks


def _verify_manifest(folder: Path) -> tuple[str, dict[str, Any]]:
    files = read_manifest(folder)
    missing = [n for n in (CONFIG, WEIGHTS) if n not in files]
    if missing:
        raise CheckpointError(f"{folder / MANIFEST}: does not list {', '.join(missing)}")
    return f"{len(files)} files listed", files


def _verify_file(folder: Path, name: str, entry: dict[str, Any]) -> tuple[str, None]:
    problem = manifest_problem(folder, name, entry, hashes=True)
    if problem:
        raise CheckpointError(problem)
    return f"{entry['size']:,} bytes, sha256 {entry['sha256'][:12]}…", None


def _verify_config(folder: Path) -> tuple[str, tuple[ModelConfig, dict[str, Any]]]:
    config = read_config(folder)
    model_config, _, step = parse_configs(folder, config)
    detail = f"format {FORMAT_VERSION}, step {step}, d_model {model_config.d_model}"
    return detail, (model_config, config)


def _verify_weights_header(folder: Path, model_config: ModelConfig | None) -> tuple[str, None]:
    header = weights.read_header(folder / WEIGHTS)
    weights.check_dtypes(folder / WEIGHTS, header)
    if model_config is None:
        count = len(header.tensors)
        return f"{count} tensors, all float32 (config unreadable, shapes not compared)", None
    weights.check_shapes(folder / WEIGHTS, header, model_config, folder / CONFIG)
    return f"{len(header.tensors)} tensors, all float32, names and shapes match {CONFIG}", None


def _verify_architecture(folder: Path, model_config: ModelConfig | None) -> tuple[str, None]:
    if model_config is None:
        raise CheckpointError(
            f"{folder / CONFIG}: unreadable, so the architecture cannot be checked"
        )
    header = weights.read_header(folder / WEIGHTS)
    if not weights.check_architecture(folder / WEIGHTS, header, model_config, folder / CONFIG):
        return (
            f"not recorded in {WEIGHTS} (saved by an older tformer): {CONFIG}'s n_heads, "
            "activation, norm ... could not be checked against the weights",
            None,
        )
    return f"{CONFIG} is the configuration the weights were saved with", None


def _verify_tokenizer(
    folder: Path, config: dict[str, Any] | None, model_config: ModelConfig | None
) -> tuple[str, None]:
    if config is None or model_config is None:
        raise CheckpointError(f"{folder / CONFIG}: unreadable, so the tokenizer cannot be checked")
    tokenizers = load_tokenizers(folder, config)
    check_vocabulary(folder, tokenizers, model_config)
    kind = "shared" if tokenizers.shared else "separate"
    return (
        f"{kind}, {tokenizers.source.kind}, vocab {tokenizers.source.vocab_size:,}; "
        "sha256 and special ids match",
        None,
    )


def _verify_training_state(folder: Path) -> tuple[str, None]:
    state_path, tensors_path = folder / TRAINER_STATE, folder / OPTIMIZER
    if not state_path.exists() and not tensors_path.exists():
        return "none (an inference-only checkpoint, e.g. best/; cannot be resumed)", None
    header = weights.read_header(tensors_path).tensors
    try:
        state = json_loads(state_path.read_text(encoding="utf-8"))
        position = check_position(folder, state)
        step, epoch = position["step"], position.get("epoch", 0)
        state["optimizer"]["param_groups"]  # noqa: B018 (presence check)
    except (
        OSError,
        UnicodeDecodeError,
        json.JSONDecodeError,
        KeyError,
        TypeError,
        ValueError,
    ) as e:
        raise CheckpointError(f"{state_path}: unreadable or incomplete ({first_line(e)})") from e
    return f"step {step}, epoch {epoch}, {len(header)} optimizer/RNG tensors", None


def _verify_load(folder: Path, model_config: ModelConfig | None) -> tuple[str, None]:
    if model_config is None:
        raise CheckpointError(f"{folder / CONFIG}: unreadable, so the weights cannot be loaded")
    model = build_model(model_config)
    load_weights(model, folder / WEIGHTS)  # refuses non-finite values, naming the tensors
    return f"{model.parameter_counts()['total']:,} parameters, all finite", None
