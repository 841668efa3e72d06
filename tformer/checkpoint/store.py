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
        manifest.json      size and SHA-256 of every file above, written last
      best/                the checkpoint with the lowest validation loss (a run folder of its
        latest             own, so it is replaced as atomically as the run's checkpoints)
        step-000800/

Each checkpoint is written into a temporary folder, flushed to disk, and renamed into place;
``latest`` is replaced atomically afterwards. A crash at any point leaves the previous
checkpoint complete and ``latest`` pointing at it. Loading checks every file it reads against
the manifest, so a truncated or altered file is an error, never garbage weights. Both a run
folder and a single checkpoint folder can be given wherever a checkpoint is expected.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, load_model, save_file, save_model

from tformer.config import SPECIAL_TOKENS, ModelConfig, TrainConfig
from tformer.data.tokenizer import Tokenizer
from tformer.errors import CheckpointError, ConfigError
from tformer.model import Transformer
from tformer.version import __version__

FORMAT = "tformer-checkpoint"
FORMAT_VERSION = 2  # 2: manifest.json with the size and SHA-256 of every file
LATEST = "latest"
METRICS = "metrics.jsonl"
BEST = "best"
CONFIG = "config.json"
MANIFEST = "manifest.json"
WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.safetensors"
TRAINER_STATE = "trainer_state.json"
SHARED_TOKENIZER = "tokenizer.json"
SOURCE_TOKENIZER = "source_tokenizer.json"
TARGET_TOKENIZER = "target_tokenizer.json"
# Tests set this to a number of seconds to pause a save just before its rename, so that a kill
# lands while a checkpoint is half-written. Nothing else reads it.
SLOW_SAVE_ENV = "TFORMER_TEST_SLOW_SAVE"
_STEP_NAME = re.compile(r"^step-(\d{6,})$")
_HASH_CHUNK = 1 << 20


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
            "special_token_ids": {token: i for i, token in enumerate(SPECIAL_TOKENS)},
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


# -- the manifest -----------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: Path) -> dict[str, Any]:
    """Record the size and SHA-256 of every file in ``folder`` in its ``manifest.json``."""
    files = {
        path.name: {"size": path.stat().st_size, "sha256": file_sha256(path)}
        for path in sorted(folder.iterdir())
        if path.is_file() and path.name != MANIFEST
    }
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "files": files}
    (folder / MANIFEST).write_text(_manifest_text(manifest), encoding="utf-8")
    return manifest


def _manifest_text(manifest: dict[str, Any]) -> str:
    # One canonical spelling: reading checks the text is exactly this, so that no byte of the
    # manifest can change unnoticed (not even whitespace, which JSON would ignore).
    return json.dumps(manifest, indent=2) + "\n"


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _valid_entry(name: object, entry: object) -> bool:
    return (
        isinstance(name, str)
        and "/" not in name
        and "\\" not in name
        and name not in ("", ".", "..", MANIFEST)
        and isinstance(entry, dict)
        and set(entry) == {"size", "sha256"}
        and type(entry["size"]) is int
        and entry["size"] >= 0
        and isinstance(entry["sha256"], str)
        and _SHA256.match(entry["sha256"]) is not None
    )


def read_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """The manifest's ``{file name: {"size", "sha256"}}``.

    Raises:
        CheckpointError: the manifest is missing, unreadable, malformed or altered.
    """
    path = folder / MANIFEST
    if not path.is_file():
        raise CheckpointError(
            f"{path}: missing, so the checkpoint is partial or was not written by this tformer; "
            "use another checkpoint of the run"
        )
    try:
        text = path.read_text(encoding="utf-8")
        manifest = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: unreadable ({_first_line(error)})") from error
    files = manifest.get("files") if isinstance(manifest, dict) else None
    ok = (
        isinstance(manifest, dict)
        and set(manifest) == {"format", "format_version", "files"}
        and manifest["format"] == FORMAT
        and isinstance(files, dict)
        and all(_valid_entry(name, entry) for name, entry in files.items())
    )
    if not ok:
        raise CheckpointError(f"{path}: not a tformer manifest (corrupt or foreign)")
    if manifest["format_version"] != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: format version {manifest['format_version']!r} is not supported by this "
            f"tformer ({__version__}, format {FORMAT_VERSION})"
        )
    if text != _manifest_text(manifest):
        raise CheckpointError(f"{path}: altered after saving (it is not as tformer wrote it)")
    return files


def manifest_problem(folder: Path, name: str, entry: dict[str, Any], *, hashes: bool) -> str | None:
    """What is wrong with one listed file, or None when its size (and hash) match."""
    path = folder / name
    if not path.is_file():
        return f"{path}: listed in {MANIFEST} but missing"
    size = path.stat().st_size
    if size != entry["size"]:
        how = "truncated or altered" if size < entry["size"] else "altered"
        return f"{path}: {size} bytes but {MANIFEST} records {entry['size']} ({how})"
    if hashes and file_sha256(path) != entry["sha256"]:
        return f"{path}: SHA-256 differs from {MANIFEST} (corrupt or altered after saving)"
    return None


def check_manifest(
    folder: Path, names: Iterable[str] | None = None, *, hashes: bool = True
) -> None:
    """Check files of ``folder`` (default: all listed) against its manifest.

    Raises:
        CheckpointError: naming the first file that is missing, unlisted, truncated or altered.
    """
    files = read_manifest(folder)
    for name in files if names is None else names:
        if name not in files:
            raise CheckpointError(f"{folder / name}: not listed in {folder / MANIFEST}")
        problem = manifest_problem(folder, name, files[name], hashes=hashes)
        if problem:
            raise CheckpointError(problem)


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
        os.chmod(tmp, 0o644)  # mkstemp makes it private; these are ordinary files
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


def step_of(path: Path) -> int | None:
    """The step of a ``step-NNNNNN`` folder name, else None."""
    match = _STEP_NAME.match(path.name)
    return int(match.group(1)) if match else None


def _pause_for_tests() -> None:
    seconds = os.environ.get(SLOW_SAVE_ENV)
    if seconds:
        time.sleep(float(seconds))


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
        tmp.chmod(0o755)  # mkdtemp makes it private; a checkpoint is an ordinary folder
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
        if metrics:
            config["metrics"] = metrics
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        tokenizers.save(tmp)
        if optimizer is not None and trainer_state is not None:
            tensors, meta = _optimizer_to_files(optimizer)
            tensors.update({f"rng.{k}": v.contiguous() for k, v in (rng_state or {}).items()})
            tensors.update({f"extra.{k}": v.contiguous() for k, v in (extra_tensors or {}).items()})
            save_file(tensors, str(tmp / OPTIMIZER))
            state = {**trainer_state, "optimizer": meta}
            (tmp / TRAINER_STATE).write_text(json.dumps(state) + "\n", encoding="utf-8")
        write_manifest(tmp)  # last: a folder with a manifest was written completely
        for path in tmp.iterdir():
            with open(path, "rb+") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(tmp)
        _pause_for_tests()
        if final.exists():  # saving a step again (e.g. averaging into the same folder)
            old = Path(tempfile.mkdtemp(dir=run_dir, prefix=f".{final.name}.old."))
            os.replace(final, old / final.name)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        tmp = None
        _fsync_dir(run_dir)
        write_text_atomic(run_dir / LATEST, final.name + "\n")
    except OSError as error:
        raise CheckpointError(_write_failure(run_dir, error)) from error
    except CheckpointError as error:  # the tokenizer's own save reports its OSError this way
        raise CheckpointError(f"{error}; no checkpoint was written to {run_dir}") from error
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    _prune(run_dir, keep_last)
    return final


def _write_failure(where: Path, error: OSError) -> str:
    path = error.filename or where
    reason = error.strerror or _first_line(error)
    return (
        f"{path}: cannot write the checkpoint ({reason}); free some space, fix the "
        f"permissions or choose another --out (the previous checkpoint in {where} is intact)"
    )


def step_dirs(run_dir: Path) -> list[Path]:
    """The ``step-*`` checkpoint folders of a run, oldest first."""
    found = [(step_of(p), p) for p in run_dir.glob("step-*") if p.is_dir()]
    return [p for step, p in sorted((s, p) for s, p in found if s is not None)]


def _prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` step checkpoints."""
    for old in step_dirs(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    path = run_dir / METRICS
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
    except OSError as error:
        raise CheckpointError(_write_failure(run_dir, error)) from error


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl``; a line torn by a crash is skipped."""
    path = run_dir / METRICS
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def rewind_run(run_dir: Path, step: int) -> None:
    """Forget everything a run did after ``step``, before resuming from that step.

    Drops metric records after ``step`` (so ``metrics.jsonl`` stays the true trajectory),
    checkpoints newer than ``step`` (left by a run that died before updating ``latest``, or
    abandoned by resuming an older checkpoint), a ``best/`` checkpoint newer than ``step``, and
    temporaries of interrupted saves.
    """
    try:
        if (run_dir / checkpoint_name(step)).is_dir():  # first, so a crash now leaves it valid
            write_text_atomic(run_dir / LATEST, checkpoint_name(step) + "\n")
        kept = [
            r for r in read_metrics(run_dir) if isinstance(r.get("step"), int) and r["step"] <= step
        ]
        if (run_dir / METRICS).exists():
            write_text_atomic(run_dir / METRICS, "".join(json.dumps(r) + "\n" for r in kept))
        for folder in step_dirs(run_dir):
            if (step_of(folder) or 0) > step:
                shutil.rmtree(folder)
        best = run_dir / BEST
        if best.is_dir() and any((step_of(p) or 0) > step for p in step_dirs(best)):
            shutil.rmtree(best)
        clean_temporaries(run_dir)
    except OSError as error:
        raise CheckpointError(_write_failure(run_dir, error)) from error


def clean_temporaries(run_dir: Path) -> None:
    """Remove what interrupted saves left behind (``.step-*`` folders, ``.latest.*`` files)."""
    for folder in (run_dir, run_dir / BEST):
        if not folder.is_dir():
            continue
        for leftover in folder.glob(".step-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        for leftover in [*folder.glob(f".{LATEST}.*.tmp"), *folder.glob(f".{METRICS}.*.tmp")]:
            leftover.unlink(missing_ok=True)


def remove_run(run_dir: Path) -> None:
    """Delete what tformer wrote into a run folder; anything else in it is left alone."""
    try:
        for folder in step_dirs(run_dir):
            shutil.rmtree(folder)
        if (run_dir / BEST).is_dir():
            shutil.rmtree(run_dir / BEST)
        for name in (LATEST, METRICS):
            (run_dir / name).unlink(missing_ok=True)
        clean_temporaries(run_dir)
    except OSError as error:
        raise CheckpointError(_write_failure(run_dir, error)) from error


# -- reading ----------------------------------------------------------------------------------


def is_run_dir(path: Path) -> bool:
    """A run folder written by tformer: its ``latest`` names a ``step-*`` checkpoint."""
    latest = path / LATEST
    if not latest.is_file():
        return False
    try:
        return _STEP_NAME.match(latest.read_text(encoding="utf-8").strip()) is not None
    except (OSError, UnicodeDecodeError):
        return False


def is_checkpoint_dir(path: Path) -> bool:
    """One checkpoint folder written by tformer (its config.json says so)."""
    try:
        config = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(config, dict) and config.get("format") == FORMAT


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
        try:
            name = latest.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise CheckpointError(f"{latest}: unreadable ({_first_line(error)})") from error
        target = path / name
        if _STEP_NAME.match(name) and (target / CONFIG).is_file():
            return target
        others = [p.name for p in step_dirs(path) if (p / CONFIG).is_file()]
        hint = f"; other checkpoints here: {', '.join(others)}" if others else ""
        raise CheckpointError(f"{latest}: points at {name!r}, which is missing or incomplete{hint}")
    raise CheckpointError(f"{path}: not a tformer checkpoint (no {CONFIG} or {LATEST} file inside)")


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: unreadable ({_first_line(error)})") from error
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
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ConfigError(f"step {step!r} is not a step number")
    except (KeyError, TypeError, ValueError, AttributeError, ConfigError) as error:
        raise CheckpointError(f"{source}: invalid configuration ({_first_line(error)})") from error
    return model_config, train_config, step


def _tokenizer_files(folder: Path, config: dict[str, Any]) -> dict[str, str]:
    identity = config.get("tokenizer")
    files = identity.get("files") if isinstance(identity, dict) else None
    if files is None:
        return {"source": SHARED_TOKENIZER, "target": SHARED_TOKENIZER}
    allowed = {SHARED_TOKENIZER, SOURCE_TOKENIZER, TARGET_TOKENIZER}
    if not isinstance(files, dict) or not {files.get("source"), files.get("target")} <= allowed:
        raise CheckpointError(f"{folder / CONFIG}: invalid tokenizer file names {files!r}")
    return files


def load_tokenizers(folder: Path, config: dict[str, Any]) -> Tokenizers:
    """Load the checkpoint's tokenizer(s) and check them against what config.json recorded.

    Raises:
        CheckpointError: naming the tokenizer file and config.json when they disagree.
    """
    files = _tokenizer_files(folder, config)
    identity = config.get("tokenizer") if isinstance(config.get("tokenizer"), dict) else {}
    source = Tokenizer.load(folder / files["source"])
    target = (
        source if files["target"] == files["source"] else Tokenizer.load(folder / files["target"])
    )
    ids = identity.get("special_token_ids")
    if ids is not None and ids != {token: i for i, token in enumerate(SPECIAL_TOKENS)}:
        raise CheckpointError(
            f"{folder / CONFIG}: records special token ids {ids}, but tformer uses "
            f"{', '.join(f'{t}={i}' for i, t in enumerate(SPECIAL_TOKENS))}"
        )
    for side, tok in (("source", source), ("target", target)):
        expected = (identity.get("sha256") or {}).get(side)
        if expected and tok.sha256() != expected:
            raise CheckpointError(
                f"{folder / files[side]}: does not match the tokenizer recorded in "
                f"{folder / CONFIG} (sha256 differs); the model was trained with another one"
            )
        size = (identity.get("vocab_size") or {}).get(side)
        if size is not None and size != tok.vocab_size:
            raise CheckpointError(
                f"{folder / files[side]}: has {tok.vocab_size} tokens but {folder / CONFIG} "
                f"records {size} for the {side} vocabulary"
            )
    return Tokenizers(source, target)


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


def _load_weights(model: Transformer, weights: Path) -> None:
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing; the checkpoint is incomplete")
    try:
        load_model(model, str(weights), strict=True, device="cpu")
    except (SafetensorError, RuntimeError, OSError, ValueError) as error:
        raise CheckpointError(f"{weights}: cannot be loaded ({_first_line(error)})") from error


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> Checkpoint:
    """Load a checkpoint (or the latest one of a run folder) for inference.

    Every file read is checked against the checkpoint's manifest (size and SHA-256) first.

    Raises:
        CheckpointError: missing, partial, corrupt or foreign files, or a tokenizer mismatch.
    """
    folder = resolve(path)
    config = read_verified_config(folder)
    tokenizer_files = set(_tokenizer_files(folder, config).values())
    check_manifest(folder, [WEIGHTS, *sorted(tokenizer_files)])
    model_config, train_config, step = parse_configs(folder, config)
    tokenizers = load_tokenizers(folder, config)
    check_vocabulary(folder, tokenizers, model_config)
    model = Transformer(model_config)
    _load_weights(model, folder / WEIGHTS)
    model.to(device).eval()
    return Checkpoint(model, model_config, train_config, tokenizers, step, folder)


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
        state = json.loads(state_path.read_text(encoding="utf-8"))
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
            f"{folder}: training state unreadable ({_first_line(error)})"
        ) from error
    return state, rng, extra


# -- verification -----------------------------------------------------------------------------


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

    def run(name: str, action: Any) -> Any:
        try:
            detail, value = action()
        except (CheckpointError, ConfigError) as error:
            checks.append(Check(name, False, str(error)))
            return None
        checks.append(Check(name, True, detail))
        return value if value is not None else True

    files = run(MANIFEST, lambda: _verify_manifest(folder))
    for name, entry in (files or {}).items():
        run(f"file {name}", lambda n=name, e=entry: _verify_file(folder, n, e))
    if files is not None:
        unlisted = sorted(
            p.name for p in folder.iterdir() if p.is_file() and p.name not in {*files, MANIFEST}
        )
        if unlisted:
            checks.append(Check("unlisted files", True, f"ignored: {', '.join(unlisted)}"))
    config = run("configuration", lambda: _verify_config(folder))
    model_config = config[0] if config else None
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


def _safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (dtype, shape)} from a safetensors file's header, reading no tensor data."""
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        with safe_open(str(path), framework="pt") as handle:
            out = {}
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                piece = handle.get_slice(name)
                out[name] = (piece.get_dtype(), tuple(piece.get_shape()))
            return out
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise CheckpointError(f"{path}: bad safetensors header ({_first_line(error)})") from error


def _verify_weights_header(folder: Path, model_config: ModelConfig | None) -> tuple[str, None]:
    header = _safetensors_header(folder / WEIGHTS)
    if model_config is None:
        return f"{len(header)} tensors (config unreadable, shapes not compared)", None
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in Transformer(model_config).state_dict().items()}
    for name, (_dtype, shape) in header.items():
        if name not in expected:
            raise CheckpointError(f"{folder / WEIGHTS}: unexpected tensor {name!r}")
        if shape != expected[name]:
            raise CheckpointError(
                f"{folder / WEIGHTS}: tensor {name!r} has shape {list(shape)} but "
                f"{folder / CONFIG} implies {list(expected[name])}"
            )
    return f"{len(header)} tensors, shapes match {CONFIG}", None


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
    header = _safetensors_header(tensors_path)
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        position = state["position"]
        step, epoch = int(position["step"]), int(position["epoch"])
        state["optimizer"]["param_groups"]  # noqa: B018 (presence check)
    except (
        OSError,
        UnicodeDecodeError,
        json.JSONDecodeError,
        KeyError,
        TypeError,
        ValueError,
    ) as e:
        raise CheckpointError(f"{state_path}: unreadable or incomplete ({_first_line(e)})") from e
    return f"step {step}, epoch {epoch}, {len(header)} optimizer/RNG tensors", None


def _verify_load(folder: Path, model_config: ModelConfig | None) -> tuple[str, None]:
    if model_config is None:
        raise CheckpointError(f"{folder / CONFIG}: unreadable, so the weights cannot be loaded")
    model = Transformer(model_config)
    _load_weights(model, folder / WEIGHTS)
    bad = [n for n, p in model.state_dict().items() if not torch.isfinite(p).all()]
    if bad:
        raise CheckpointError(f"{folder / WEIGHTS}: non-finite values in {', '.join(bad[:3])}")
    return f"{model.parameter_counts()['total']:,} parameters, all finite", None


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
