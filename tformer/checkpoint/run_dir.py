"""Run folders: their ``step-*`` checkpoints, ``latest``, ``best/`` and ``metrics.jsonl``.

A training run writes a *run folder*::

    checkpoints/dates/
      latest               the name of the newest complete checkpoint, e.g. "step-001200"
      metrics.jsonl        one JSON record per log / evaluation line
      step-001200/         one checkpoint (see tformer.checkpoint.store)
      best/                the checkpoint with the lowest validation loss (a run folder of its
        latest             own, so it is replaced as atomically as the run's checkpoints)
        step-000800/

``latest`` is replaced atomically after each save, so a crash at any point leaves it pointing
at a complete checkpoint. Both a run folder and a single checkpoint folder can be given
wherever a checkpoint is expected (``resolve``). This module also refuses to clobber what is
not ours, creates or rewinds a run folder, and finds what to resume.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from tformer.checkpoint.files import (
    CONFIG,
    FORMAT,
    first_line,
    write_failure,
    write_text_atomic,
)
from tformer.errors import CheckpointError, ConfigError

LATEST = "latest"
METRICS = "metrics.jsonl"
BEST = "best"
_STEP_NAME = re.compile(r"^step-(\d{6,})$")


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def step_of(path: Path) -> int | None:
    """The step of a ``step-NNNNNN`` folder name, else None."""
    match = _STEP_NAME.match(path.name)
    return int(match.group(1)) if match else None


def step_dirs(run_dir: Path) -> list[Path]:
    """The ``step-*`` checkpoint folders of a run, oldest first."""
    found = [(step_of(p), p) for p in run_dir.glob("step-*") if p.is_dir()]
    return [p for step, p in sorted((s, p) for s, p in found if s is not None)]


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` step checkpoints."""
    for old in step_dirs(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def point_latest(run_dir: Path, step: int) -> None:
    """Make ``latest`` name the checkpoint of ``step`` (atomically)."""
    write_text_atomic(run_dir / LATEST, checkpoint_name(step) + "\n")


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    path = run_dir / METRICS
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
    except OSError as error:
        raise CheckpointError(write_failure(run_dir, error)) from error


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
            point_latest(run_dir, step)
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
        raise CheckpointError(write_failure(run_dir, error)) from error


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
        raise CheckpointError(write_failure(run_dir, error)) from error


# -- finding checkpoints ---------------------------------------------------------------------


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
            raise CheckpointError(f"{latest}: unreadable ({first_line(error)})") from error
        target = path / name
        if _STEP_NAME.match(name) and (target / CONFIG).is_file():
            return target
        others = [p.name for p in step_dirs(path) if (p / CONFIG).is_file()]
        hint = f"; other checkpoints here: {', '.join(others)}" if others else ""
        raise CheckpointError(f"{latest}: points at {name!r}, which is missing or incomplete{hint}")
    raise CheckpointError(f"{path}: not a tformer checkpoint (no {CONFIG} or {LATEST} file inside)")


# -- preparing a run's output folder --------------------------------------------------------


def prepare_output(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber anything that is not ours. Checks only: nothing is written yet.

    ``--overwrite`` replaces a tformer run (its checkpoints and metrics; other files in the
    folder are left alone). A folder that is not empty and not a tformer run is refused even
    with ``--overwrite``: it may hold someone's work, and deleting it is not ours to do.
    """
    if resume:
        if not is_run_dir(out):
            raise CheckpointError(f"--resume {out}: no tformer run there to resume")
        return
    _check_writable_parent(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is a file; choose a folder name")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if is_checkpoint_dir(out):
        raise ConfigError(
            f"--out {out}: is one checkpoint of a run, not a run folder; choose another --out"
        )
    if not is_run_dir(out):
        raise ConfigError(
            f"--out {out}: exists, is not empty and is not a tformer run; choose another --out "
            "(--overwrite only replaces tformer runs)"
        )
    if not overwrite:
        raise ConfigError(
            f"--out {out}: already holds a run; --resume {out} to continue it or --overwrite "
            "to start again"
        )


def _check_writable_parent(out: Path) -> None:
    """The nearest existing ancestor of ``out`` must be a folder (not a file)."""
    for parent in out.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"--out {out}: {parent} is a file, so no folder can go there")
            return


def create_output(out: Path, *, resume_step: int | None, overwrite: bool) -> None:
    """Start the run folder afresh, or rewind it to the checkpoint being resumed.

    Called only after every check passed, so a refused run writes nothing.
    """
    if resume_step is not None:
        rewind_run(out, resume_step)
        return
    if overwrite and is_run_dir(out):
        remove_run(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CheckpointError(
            f"--out {out}: cannot create the run folder ({error.strerror or error}); "
            "choose another --out"
        ) from error


def resume_target(out: Path | None, resume: bool | str | Path) -> tuple[Path, Path]:
    """(run folder, checkpoint folder) for ``--resume``.

    ``resume`` is True (resume the run ``out`` from its latest checkpoint), a run folder, or one
    ``step-*`` checkpoint of a run (resume from it; the run forgets what came after).
    """
    given = Path(out) if resume is True else Path(resume)  # type: ignore[arg-type]
    if resume is True and out is None:
        raise ConfigError("--resume needs the run folder")
    if is_run_dir(given):
        run = given
    elif is_checkpoint_dir(given) and is_run_dir(given.parent):
        run = given.parent
    else:
        raise CheckpointError(
            f"--resume {given}: no tformer run there to resume (a run folder has a `latest` "
            "file and step-* checkpoints)"
        )
    if out is not None and Path(out).resolve() != run.resolve():
        raise ConfigError(f"--resume {given} belongs to the run {run}, not --out {out}")
    return run, resolve(given)
