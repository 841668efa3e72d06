"""Checkpoints: safetensors weights + JSON config + tokenizer file(s). No pickle anywhere.

A training run writes a *run folder*::

    checkpoints/dates/
      latest               the name of the newest complete checkpoint, e.g. "step-001200"
      metrics.jsonl        one JSON record per log / evaluation line
      step-001200/
        model.safetensors  weights (a tied matrix is stored once)
        config.json        format version, ModelConfig, TrainConfig, tokenizer identity
        tokenizer.json     (source_tokenizer.json + target_tokenizer.json when not shared)
        optimizer.safetensors + trainer_state.json   what --resume needs

Each checkpoint is written into a temporary folder, flushed to disk, and renamed into place;
``latest`` is replaced atomically afterwards. A crash at any point leaves the previous
checkpoint complete and ``latest`` pointing at it. Both a run folder and a single checkpoint
folder can be given wherever a checkpoint is expected.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from tformer.config import ModelConfig, TrainConfig
from tformer.errors import CheckpointError, ConfigError
from tformer.model import Transformer
from tformer.tokenizer import SPECIAL_TOKENS, Tokenizer
from tformer.version import __version__

FORMAT = "tformer-checkpoint"
FORMAT_VERSION = 1
LATEST = "latest"
METRICS = "metrics.jsonl"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.safetensors"
TRAINER_STATE = "trainer_state.json"
SHARED_TOKENIZER = "tokenizer.json"
SOURCE_TOKENIZER = "source_tokenizer.json"
TARGET_TOKENIZER = "target_tokenizer.json"


@dataclass
class Tokenizers:
    """The source and target tokenizers; the same object when the vocabulary is shared."""

    source: Tokenizer
    target: Tokenizer

    @property
    def shared(self) -> bool:
        return self.source is self.target

    def files(self) -> dict[str, str]:
        if self.shared:
            return {"source": SHARED_TOKENIZER, "target": SHARED_TOKENIZER}
        return {"source": SOURCE_TOKENIZER, "target": TARGET_TOKENIZER}

    def identity(self) -> dict[str, Any]:
        """What config.json records so a mismatched tokenizer is caught on load."""
        return {
            "files": self.files(),
            "sha256": {"source": self.source.sha256(), "target": self.target.sha256()},
            "vocab_size": {"source": self.source.vocab_size, "target": self.target.vocab_size},
            "special_tokens": list(SPECIAL_TOKENS),
        }

    def save(self, folder: Path) -> None:
        files = self.files()
        self.source.save(folder / files["source"])
        if not self.shared:
            self.target.save(folder / files["target"])


@dataclass
class Checkpoint:
    """A loaded checkpoint: model (in eval mode), configs, tokenizers and where it came from."""

    model: Transformer
    model_config: ModelConfig
    train_config: TrainConfig
    tokenizers: Tokenizers
    step: int
    path: Path


# -- writing ----------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # some platforms cannot open folders; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def save_checkpoint(
    run_dir: Path,
    *,
    model: Transformer,
    train_config: TrainConfig,
    tokenizers: Tokenizers,
    step: int,
    optimizer: torch.optim.Optimizer | None = None,
    trainer_state: dict[str, Any] | None = None,
    rng_state: dict[str, torch.Tensor] | None = None,
    keep_last: int = 2,
) -> Path:
    """Write checkpoint ``step-NNNNNN`` into ``run_dir`` atomically and point ``latest`` at it.

    Returns:
        The checkpoint folder.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    final = run_dir / checkpoint_name(step)
    tmp = Path(tempfile.mkdtemp(dir=run_dir, prefix=f".{final.name}."))
    try:
        save_model(model, str(tmp / WEIGHTS), metadata={"format": FORMAT})
        config = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "tformer_version": __version__,
            "step": step,
            "model": model.config.to_dict(),
            "train": train_config.to_dict(),
            "tokenizer": tokenizers.identity(),
        }
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        tokenizers.save(tmp)
        if optimizer is not None and trainer_state is not None:
            tensors, meta = _optimizer_to_files(optimizer)
            tensors.update({f"rng.{k}": v.contiguous() for k, v in (rng_state or {}).items()})
            save_file(tensors, str(tmp / OPTIMIZER))
            state = {**trainer_state, "optimizer": meta}
            (tmp / TRAINER_STATE).write_text(json.dumps(state) + "\n", encoding="utf-8")
        for path in tmp.iterdir():
            with open(path, "rb+") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text_atomic(run_dir / LATEST, final.name + "\n")
    _prune(run_dir, keep_last)
    return final


def _prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` step checkpoints (and stale temporaries)."""
    steps = sorted(p for p in run_dir.glob("step-*") if p.is_dir())
    for old in steps[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    with open(run_dir / METRICS, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


# -- reading ----------------------------------------------------------------------------------


def is_run_dir(path: Path) -> bool:
    return (path / LATEST).is_file() or (path / CONFIG).is_file()


def resolve(path: str | Path) -> Path:
    """A run folder or checkpoint folder -> the checkpoint folder to load.

    Raises:
        CheckpointError: the path is missing or holds no tformer checkpoint.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint folder; train one with `tformer train`")
    if not path.is_dir():
        raise CheckpointError(f"{path}: a checkpoint is a folder (with {CONFIG}), not a file")
    if (path / CONFIG).is_file():
        return path
    latest = path / LATEST
    if latest.is_file():
        name = latest.read_text(encoding="utf-8").strip()
        target = path / name
        if name and (target / CONFIG).is_file():
            return target
        raise CheckpointError(f"{latest}: points at {name!r}, which is missing or incomplete")
    raise CheckpointError(f"{path}: not a tformer checkpoint (no {CONFIG} or {LATEST} file inside)")


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: unreadable ({error})") from error
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a tformer checkpoint config")
    if config.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: format version {config.get('format_version')} is not supported by this "
            f"tformer ({__version__}, format {FORMAT_VERSION})"
        )
    return config


def load_tokenizers(folder: Path, config: dict[str, Any]) -> Tokenizers:
    identity = config.get("tokenizer", {})
    files = identity.get("files", {"source": SHARED_TOKENIZER, "target": SHARED_TOKENIZER})
    source = Tokenizer.load(folder / files["source"])
    target = (
        source if files["target"] == files["source"] else Tokenizer.load(folder / files["target"])
    )
    for side, tok in (("source", source), ("target", target)):
        expected = identity.get("sha256", {}).get(side)
        if expected and tok.sha256() != expected:
            raise CheckpointError(
                f"{folder / files[side]}: does not match the tokenizer recorded in "
                f"{folder / CONFIG} (sha256 differs); the model was trained with another one"
            )
    return Tokenizers(source, target)


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> Checkpoint:
    """Load a checkpoint (or the latest one of a run folder) for inference.

    Raises:
        CheckpointError: missing, partial, corrupt or foreign files, or a tokenizer mismatch.
    """
    folder = resolve(path)
    config = read_config(folder)
    try:
        model_config = ModelConfig.from_dict(config["model"], source=str(folder / CONFIG))
        train_config = TrainConfig.from_dict(config["train"], source=str(folder / CONFIG))
    except (KeyError, TypeError, ConfigError) as error:
        raise CheckpointError(f"{folder / CONFIG}: invalid configuration ({error})") from error
    tokenizers = load_tokenizers(folder, config)
    for side, tok, size in (
        ("source", tokenizers.source, model_config.src_vocab_size),
        ("target", tokenizers.target, model_config.tgt_vocab_size),
    ):
        if tok.vocab_size != size:
            raise CheckpointError(
                f"{folder}: the {side} tokenizer has {tok.vocab_size} tokens but the model's "
                f"embeddings have {size}"
            )
    model = Transformer(model_config)
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing; the checkpoint is incomplete")
    try:
        load_model(model, str(weights), strict=True, device="cpu")
    except (SafetensorError, RuntimeError, OSError, ValueError) as error:
        raise CheckpointError(f"{weights}: cannot be loaded ({_first_line(error)})") from error
    model.to(device).eval()
    return Checkpoint(model, model_config, train_config, tokenizers, int(config["step"]), folder)


def load_training_state(
    folder: Path, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Restore ``optimizer`` in place; return the trainer state and the saved RNG tensors."""
    state_path, tensors_path = folder / TRAINER_STATE, folder / OPTIMIZER
    if not state_path.is_file() or not tensors_path.is_file():
        raise CheckpointError(f"{folder}: holds no training state, so it cannot be resumed")
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        tensors = load_file(str(tensors_path))
    except (OSError, json.JSONDecodeError, SafetensorError) as error:
        raise CheckpointError(f"{folder}: training state unreadable ({error})") from error
    rng = {k.removeprefix("rng."): v for k, v in tensors.items() if k.startswith("rng.")}
    opt_tensors = {k: v for k, v in tensors.items() if not k.startswith("rng.")}
    optimizer.load_state_dict(_optimizer_from_files(opt_tensors, state.pop("optimizer")))
    return state, rng


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
