"""Checkpoints: safetensors weights + JSON config + tokenizer file(s). No pickle anywhere.

One checkpoint folder (``step-NNNNNN`` of a run folder, see ``tformer.checkpoint.run_dir``)::

    step-001200/
      model.safetensors  weights (a tied matrix is stored once)
      config.json        format version, ModelConfig, TrainConfig, tokenizer identity
      tokenizer.json     (source_tokenizer.json + target_tokenizer.json when not shared)
      optimizer.safetensors + trainer_state.json   what --resume needs
      manifest.json      size and SHA-256 of every file above, written last

Each checkpoint is written into a temporary folder, flushed to disk, and renamed into place;
``latest`` is replaced atomically afterwards. A crash at any point leaves the previous
checkpoint complete and ``latest`` pointing at it. Loading checks every file it reads against
the manifest (``tformer.checkpoint.files``), so a truncated or altered file is an error.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from tformer.checkpoint.files import (
    CONFIG,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    WEIGHTS,
    check_manifest,
    first_line,
    foreign_files,
    fsync_dir,
    fsync_files,
    write_failure,
    write_manifest,
    written_files,
)
from tformer.checkpoint.run_dir import (
    checkpoint_name,
    point_latest,
    prune,
    resolve,
    step_of,
)
from tformer.checkpoint.tokenizers import Tokenizers, load_tokenizers, tokenizer_files_of
from tformer.checkpoint.training_state import write_training_state
from tformer.checkpoint.weights import check_finite, check_weights, weights_metadata
from tformer.config import INT_LIMIT, ModelConfig, TrainConfig
from tformer.errors import CheckpointError, ConfigError
from tformer.model import TransformerBase, build_model
from tformer.paths import excerpt, follow_umask_tree, json_loads, whole_message
from tformer.version import __version__

# Tests set this to a number of seconds to pause a save just before its rename, so that a kill
# lands while a checkpoint is half-written. Nothing else reads it.
SLOW_SAVE_ENV = "TFORMER_TEST_SLOW_SAVE"


@dataclass
class Checkpoint:
    """A loaded checkpoint: model (in eval mode), configs, tokenizers and where it came from."""

    model: TransformerBase
    model_config: ModelConfig
    train_config: TrainConfig
    tokenizers: Tokenizers
    step: int
    path: Path


# -- writing ----------------------------------------------------------------------------------


def _pause_for_tests() -> None:
    seconds = os.environ.get(SLOW_SAVE_ENV)
    if seconds:
        time.sleep(float(seconds))


def save_checkpoint(
    run_dir: Path,
    *,
    model: TransformerBase,
    train_config: TrainConfig,
    tokenizers: Tokenizers,
    step: int,
    optimizer: torch.optim.Optimizer | None = None,
    trainer_state: dict[str, Any] | None = None,
    rng_state: dict[str, torch.Tensor] | None = None,
    extra_tensors: dict[str, torch.Tensor] | None = None,
    keep_last: int = 2,
    metrics: dict[str, float] | None = None,
) -> Path:
    """Write checkpoint ``step-NNNNNN`` into ``run_dir`` atomically and point ``latest`` at it.

    ``metrics`` (e.g. the validation loss of a best checkpoint) go into config.json.
    ``extra_tensors`` (e.g. the raw weights behind an averaged model) join the training state.

    Returns:
        The checkpoint folder.

    Raises:
        CheckpointError: the folder cannot be written (read-only, full, not a folder ...);
            nothing of the new checkpoint is left behind and the previous one stays valid.
    """
    final = run_dir / checkpoint_name(step)
    tmp: Path | None = None
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=run_dir, prefix=f".{final.name}."))
        _write_model_files(tmp, model, train_config, tokenizers, step, metrics)
        if optimizer is not None and trainer_state is not None:
            tensors = {f"rng.{k}": v for k, v in (rng_state or {}).items()}
            tensors.update({f"extra.{k}": v for k, v in (extra_tensors or {}).items()})
            write_training_state(tmp, optimizer, trainer_state, tensors)
        write_manifest(tmp)  # last: a folder with a manifest was written completely
        # mkdtemp and safetensors make private entries; a checkpoint is ordinary files
        follow_umask_tree(tmp)
        fsync_files(tmp)
        _pause_for_tests()
        _move_into_place(tmp, final)
        tmp = None
        fsync_dir(run_dir)
        point_latest(run_dir, step)
    except OSError as error:
        raise CheckpointError(write_failure(run_dir, error)) from error
    except CheckpointError as error:  # the tokenizer's own save reports its OSError this way
        raise CheckpointError(f"{error}; no checkpoint was written to {run_dir}") from error
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    prune(run_dir, keep_last)
    return final


def write_checkpoint_files(
    folder: Path,
    *,
    model: TransformerBase,
    train_config: TrainConfig,
    tokenizers: Tokenizers,
    origin: dict[str, Any] | None = None,
) -> None:
    """Write one checkpoint (step 0, outside any run folder) into the existing, empty
    ``folder``, manifest last. ``origin`` (where the weights came from, e.g. an imported
    model) goes into config.json.

    The caller makes ``folder`` whole or not at all (``tformer.folders.MarkedFolder.staging``
    writes into a temporary sibling and renames it).
    """
    _write_model_files(folder, model, train_config, tokenizers, 0, None, origin)
    write_manifest(folder)


ORIGIN = "origin"  # config.json key: the source of imported weights


def read_origin(folder: Path) -> dict[str, Any] | None:
    """What config.json records about where an imported checkpoint came from, if anything."""
    origin = read_config(folder).get(ORIGIN)
    return origin if isinstance(origin, dict) else None


def _write_model_files(
    folder: Path,
    model: TransformerBase,
    train_config: TrainConfig,
    tokenizers: Tokenizers,
    step: int,
    metrics: dict[str, float] | None,
    origin: dict[str, Any] | None = None,
) -> None:
    """What inference needs: weights, config.json and the tokenizer file(s)."""
    save_model(model, str(folder / WEIGHTS), metadata=weights_metadata(model.config, FORMAT))
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tformer_version": __version__,
        "step": step,
        "model": model.config.to_dict(),
        "train": train_config.to_dict(),
        "tokenizer": tokenizers.identity(),
    }
    if metrics:
        config["metrics"] = metrics
    if origin:
        config[ORIGIN] = origin
    (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tokenizers.save(folder)


def _move_into_place(tmp: Path, final: Path) -> None:
    """Rename the written folder ``tmp`` to ``final``, replacing an older one of that name.

    An older ``final`` is replaced only when everything in it is what tformer wrote (its
    manifest says so). A folder holding only what tformer did not write (what ``--overwrite``
    left of a checkpoint) receives the new files beside its own, manifest last. Anything else
    (a link, our checkpoint with other files in it, a name in the way) is refused, untouched.
    """
    if not final.is_symlink() and not final.exists():
        os.replace(tmp, final)
        return
    foreign = foreign_files(final)  # [final] itself for a link or a file
    if not foreign:  # saving a step again: swap the whole folder atomically
        old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.old."))
        os.replace(final, old / final.name)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        return
    names = sorted((p.name for p in tmp.iterdir()), key=lambda name: name == MANIFEST)
    in_the_way = [final / n for n in names if os.path.lexists(final / n)]
    if foreign == [final] or written_files(final) is not None or in_the_way:
        blocker = (in_the_way or foreign)[0]
        raise CheckpointError(
            f"{blocker}: not written by tformer and in the way of checkpoint {final}; move it "
            "away (nothing was deleted)"
        )
    for name in names:  # the manifest last: until it is there, this is no checkpoint
        os.replace(tmp / name, final / name)
    tmp.rmdir()
    fsync_dir(final)


# -- reading ----------------------------------------------------------------------------------


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG
    if path.exists() and not path.is_file():  # a FIFO or a device would block or never end
        raise CheckpointError(f"{path}: not a regular file, so not a tformer checkpoint config")
    try:
        config = json_loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: unreadable ({first_line(error)})") from error
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a tformer checkpoint config")
    if config.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: format version {config.get('format_version')} is not supported by this "
            f"tformer ({__version__}, format {FORMAT_VERSION})"
        )
    return config


def read_verified_config(folder: Path) -> dict[str, Any]:
    """``read_config`` after checking config.json against the manifest."""
    if not (folder / MANIFEST).is_file():
        read_config(folder)  # a foreign folder is named as such before "manifest missing"
    check_manifest(folder, [CONFIG])
    return read_config(folder)


def parse_configs(folder: Path, config: dict[str, Any]) -> tuple[ModelConfig, TrainConfig, int]:
    """The ModelConfig, TrainConfig and step recorded in ``config.json``, strictly."""
    source = str(folder / CONFIG)
    try:
        model_config = ModelConfig.from_dict(config["model"], source=source)
        train_config = TrainConfig.from_dict(config["train"], source=source)
        step = config["step"]
        if type(step) is not int or not 0 <= step <= INT_LIMIT:
            raise ConfigError(f"step {excerpt(step)} is not a step number")
        named = step_of(folder)
        if named is not None and step != named:
            raise ConfigError(f"step {step} contradicts the folder's name {folder.name}")
    except (KeyError, TypeError, ValueError, AttributeError, ConfigError) as error:
        raise CheckpointError(f"{source}: invalid configuration ({first_line(error)})") from error
    return model_config, train_config, step


def check_vocabulary(folder: Path, tokenizers: Tokenizers, model_config: ModelConfig) -> None:
    """The tokenizers' vocabularies must match the model's embeddings."""
    files = tokenizers.files()
    for side, tok, size in (
        ("source", tokenizers.source, model_config.src_vocab_size),
        ("target", tokenizers.target, model_config.tgt_vocab_size),
    ):
        if tok.vocab_size != size:
            raise CheckpointError(
                f"{folder / files[side]} has {tok.vocab_size} tokens but the {side} embeddings "
                f"in {folder / CONFIG} and {folder / WEIGHTS} have {size}; the tokenizer does "
                "not belong to this model"
            )


def load_weights(model: TransformerBase, weights: Path) -> None:
    """Load ``weights`` into ``model``, refusing a file whose values are not all finite."""
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing; the checkpoint is incomplete")
    try:
        load_model(model, str(weights), strict=True, device="cpu")
    except (SafetensorError, RuntimeError, OSError, ValueError) as error:
        raise CheckpointError(f"{weights}: cannot be loaded ({whole_message(error)})") from error
    check_finite(model.state_dict(), weights)


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> Checkpoint:
    """Load a checkpoint (or the latest one of a run folder) for inference.

    Every file read is checked against the checkpoint's manifest (size and SHA-256) first.

    Raises:
        CheckpointError: missing, partial, corrupt or foreign files, a tokenizer mismatch, or
            weights that disagree with config.json (names, shapes, dtypes, architecture).
    """
    folder = resolve(path)
    config = read_verified_config(folder)
    tokenizer_files = set(tokenizer_files_of(folder, config).values())
    check_manifest(folder, [WEIGHTS, *sorted(tokenizer_files)])
    model_config, train_config, step = parse_configs(folder, config)
    tokenizers = load_tokenizers(folder, config)
    check_vocabulary(folder, tokenizers, model_config)
    # Built once the header's own checks pass, then read for the expected shapes and loaded.
    built = functools.cache(functools.partial(build_model, model_config))
    check_weights(folder / WEIGHTS, model_config, folder / CONFIG, built)
    model = built()
    load_weights(model, folder / WEIGHTS)
    model.to(device).eval()
    return Checkpoint(model, model_config, train_config, tokenizers, step, folder)
