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
    MANIFEST,
    remove_checkpoint,
    write_failure,
    write_text_atomic,
    written_files,
)
from tformer.checkpoint.lock import LOCK, RunLock
from tformer.errors import CheckpointError, ConfigError
from tformer.paths import check_replaceable, excerpt, file_kind, inside, json_loads, read_small_text

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
    """The ``step-*`` checkpoint folders of a run, oldest first (no link out of the run)."""
    found = [(step_of(p), p) for p in run_dir.glob("step-*") if p.is_dir() and inside(run_dir, p)]
    return [p for step, p in sorted((s, p) for s, p in found if s is not None)]


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` step checkpoints (only the files tformer wrote).

    Folders that hold no manifest (what a deletion left, e.g. a user's files) are not counted.
    """
    checkpoints = [p for p in step_dirs(run_dir) if (p / MANIFEST).is_file()]
    for old in checkpoints[:-keep_last]:
        try:
            remove_checkpoint(old, hashes=False)  # the run's own recent saves: sizes suffice
        except OSError:
            pass  # pruning is housekeeping: a file that will not go away stops nothing


def point_latest(run_dir: Path, step: int) -> None:
    """Make ``latest`` name the checkpoint of ``step`` (atomically)."""
    write_text_atomic(run_dir / LATEST, checkpoint_name(step) + "\n")


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    path = run_dir / METRICS
    check_replaceable(path)  # appending to a FIFO would block, to a link would write elsewhere
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
            record = json_loads(line)
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
                remove_checkpoint(folder)
        best = run_dir / BEST
        if best.is_dir() and any((step_of(p) or 0) > step for p in step_dirs(best)):
            _remove_checkpoints(best)
            _remove_if_empty(best)
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
    """Delete what tformer wrote into a run folder; anything else in it is left alone.

    In each checkpoint only the files its manifest lists go (with the manifest); a checkpoint
    folder that still holds something else afterwards stays, with that in it.
    """
    try:
        best = run_dir / BEST
        if best.is_dir() and not best.is_symlink():
            _remove_checkpoints(best)
            _remove_if_empty(best)
        _remove_checkpoints(run_dir)
        _unlink_file(run_dir / METRICS)
    except OSError as error:
        raise CheckpointError(write_failure(run_dir, error)) from error


def _remove_checkpoints(run_dir: Path) -> None:
    """The checkpoints, ``latest`` and temporaries of one run folder (the run or its best/)."""
    for folder in step_dirs(run_dir):
        remove_checkpoint(folder)
    _unlink_file(run_dir / LATEST)
    clean_temporaries(run_dir)


def _unlink_file(path: Path) -> None:
    if path.is_file() and not path.is_symlink():
        path.unlink()


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass  # something that is not ours is still in it


# -- finding checkpoints ---------------------------------------------------------------------


# What a run folder resolves to: its latest checkpoint, or the one in best/.
CHOICES = ("latest", "best")


def is_run_dir(path: Path) -> bool:
    """A run folder written by tformer: a regular ``latest`` file names a ``step-*`` checkpoint
    of this folder (not a link out of it) that has a manifest. A folder that merely holds a
    ``latest`` file is not one."""
    name = _latest_name(path)
    if name is None or _STEP_NAME.match(name) is None:
        return False
    target = path / name
    return target.is_dir() and inside(path, target) and written_files(target) is not None


def _latest_name(run: Path) -> str | None:
    """What ``latest`` says (stripped), when it is a small regular file of the run folder."""
    latest = run / LATEST
    if latest.is_symlink() and not inside(run, latest):
        return None
    text = read_small_text(latest)
    return None if text is None else text.strip()


def is_checkpoint_dir(path: Path) -> bool:
    """One checkpoint folder written by tformer (its config.json says so)."""
    text = read_small_text(path / CONFIG, limit=1 << 20)
    try:
        config = json_loads(text) if text is not None else None
    except json.JSONDecodeError:
        return False
    return isinstance(config, dict) and config.get("format") == FORMAT


def resolve(path: str | Path, prefer: str = "latest") -> Path:
    """A run folder or checkpoint folder -> the checkpoint folder to load.

    A run folder gives its latest checkpoint, or with ``prefer="best"`` the one in its
    ``best/`` (the best validation so far) when there is one.

    Raises:
        CheckpointError: the path is missing or holds no tformer checkpoint.
    """
    path = Path(path).expanduser()
    if prefer not in CHOICES:
        raise CheckpointError(f"--checkpoint {prefer!r} must be one of {', '.join(CHOICES)}")
    if prefer == "best" and path.is_dir() and not (path / CONFIG).is_file():
        best = path / BEST
        if is_run_dir(best) and inside(path, best):
            return resolve(best)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint folder; train one with `tformer train`")
    if not path.is_dir():
        raise CheckpointError(f"{path}: a checkpoint is a folder (with {CONFIG}), not a file")
    if (path / CONFIG).is_file():
        return path
    latest = path / LATEST
    if latest.is_symlink() and not inside(path, latest):
        raise CheckpointError(
            f"{latest}: a symbolic link out of the run folder; tformer follows no link out of a "
            "run, so replace it with the name of a step-* checkpoint"
        )
    if latest.exists():
        name = _latest_name(path)
        if name is None:
            raise CheckpointError(
                f"{latest}: not a regular file naming a checkpoint; write the name of a step-* "
                "checkpoint into it"
            )
        target = path / name
        if _STEP_NAME.match(name) and (target / CONFIG).is_file():
            if not inside(path, target):
                raise CheckpointError(
                    f"{target}: a symbolic link out of the run folder; tformer follows no link "
                    "out of a run"
                )
            return target
        others = [p.name for p in step_dirs(path) if (p / CONFIG).is_file()]
        hint = f"; other checkpoints here: {', '.join(others)}" if others else ""
        raise CheckpointError(
            f"{latest}: points at {excerpt(name)}, which is missing or incomplete{hint}"
        )
    raise CheckpointError(f"{path}: not a tformer checkpoint (no {CONFIG} or {LATEST} file inside)")


# -- preparing a run's output folder --------------------------------------------------------


def prepare_output(
    out: Path, *, resume: bool, overwrite: bool, again: str | None = None
) -> None:
    """Refuse to clobber anything that is not ours. Checks only: nothing is written yet.

    ``--overwrite`` replaces a tformer run (only the files tformer wrote: see ``remove_run``).
    A folder that is not empty and not a tformer run is refused even with ``--overwrite``: it
    may hold someone's work, and deleting it is not ours to do. ``again`` is what to suggest
    for a run that exists (default: ``--resume`` it or ``--overwrite`` it).
    """
    if resume:
        if not is_run_dir(out):
            raise CheckpointError(f"--resume {out}: no tformer run there to resume")
        return
    _check_writable_parent(out)
    if out.exists() and not out.is_dir():
        what = "a file" if out.is_file() else file_kind(out)
        raise ConfigError(f"--out {out}: exists and is {what}; choose a folder name")
    if not out.is_dir() or is_empty_folder(out):
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
        again = again or f"--resume {out} to continue it or --overwrite to start again"
        raise ConfigError(f"--out {out}: already holds a run; {again}")
    for name in (LATEST, METRICS):
        check_replaceable(out / name, "--out", ConfigError)


def is_empty_folder(folder: Path) -> bool:
    """Nothing in ``folder`` but (maybe) its lock file."""
    return all(p.name == LOCK for p in folder.iterdir())


def _check_writable_parent(out: Path) -> None:
    """The nearest existing ancestor of ``out`` must be a folder (not a file)."""
    for parent in out.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"--out {out}: {parent} is a file, so no folder can go there")
            return


def create_output(
    out: Path, *, resume_step: int | None, overwrite: bool, lock: RunLock | None = None
) -> None:
    """Start the run folder afresh, or rewind it to the checkpoint being resumed.

    Called only after every check passed, so a refused run writes nothing. ``lock`` (the run's,
    taken here when the folder is new) must be held before anything in the folder changes.
    """
    if resume_step is not None:
        rewind_run(out, resume_step)
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CheckpointError(
            f"--out {out}: cannot create the run folder ({error.strerror or error}); "
            "choose another --out"
        ) from error
    if lock is not None:
        lock.acquire()  # a new folder: only now can the lock go in it
    if overwrite and is_run_dir(out):
        remove_run(out)


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
