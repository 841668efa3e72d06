"""The run folder: refuse to clobber what is not ours, create or rewind it, find what to resume."""

from __future__ import annotations

from pathlib import Path

from tformer.checkpoint import store as ckpt
from tformer.errors import CheckpointError, ConfigError


def prepare_output(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber anything that is not ours. Checks only: nothing is written yet.

    ``--overwrite`` replaces a tformer run (its checkpoints and metrics; other files in the
    folder are left alone). A folder that is not empty and not a tformer run is refused even
    with ``--overwrite``: it may hold someone's work, and deleting it is not ours to do.
    """
    if resume:
        if not ckpt.is_run_dir(out):
            raise CheckpointError(f"--resume {out}: no tformer run there to resume")
        return
    _check_writable_parent(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is a file; choose a folder name")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if ckpt.is_checkpoint_dir(out):
        raise ConfigError(
            f"--out {out}: is one checkpoint of a run, not a run folder; choose another --out"
        )
    if not ckpt.is_run_dir(out):
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
        ckpt.rewind_run(out, resume_step)
        return
    if overwrite and ckpt.is_run_dir(out):
        ckpt.remove_run(out)
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
    if ckpt.is_run_dir(given):
        run = given
    elif ckpt.is_checkpoint_dir(given) and ckpt.is_run_dir(given.parent):
        run = given.parent
    else:
        raise CheckpointError(
            f"--resume {given}: no tformer run there to resume (a run folder has a `latest` "
            "file and step-* checkpoints)"
        )
    if out is not None and Path(out).resolve() != run.resolve():
        raise ConfigError(f"--resume {given} belongs to the run {run}, not --out {out}")
    return run, ckpt.resolve(given)
