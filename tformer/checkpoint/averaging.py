"""Checkpoint averaging: the mean of several checkpoints' weights (Vaswani et al., section 6.1).

The average goes into a run folder of its own: it never writes over a run's checkpoints or
into a folder that is not a tformer run (see ``average_checkpoints``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from tformer.checkpoint.lock import RunLocks
from tformer.checkpoint.run_dir import create_output, prepare_output
from tformer.checkpoint.store import Checkpoint, load_checkpoint, save_checkpoint
from tformer.checkpoint.weights import check_finite
from tformer.errors import CheckpointError, ConfigError
from tformer.paths import excerpt, inside


def average_checkpoints(paths: Sequence[Path], out: Path, *, overwrite: bool = False) -> Path:
    """Average the weights of ``paths`` (same architecture and tokenizers) into run ``out``.

    ``out`` must be a new or empty folder, or (with ``overwrite``) a tformer run, which is
    replaced as ``tformer train --overwrite`` replaces one: only the files tformer wrote go.
    A folder that is not a tformer run, one checkpoint of a run, or a run holding one of the
    checkpoints being averaged is refused; a refusal writes nothing.

    Returns:
        The written checkpoint folder.

    Raises:
        ConfigError: ``out`` is refused (see above), or another process writes it.
        CheckpointError: fewer than two checkpoints, or ones that differ in their model
            configuration or in either tokenizer (naming the two checkpoints and what differs).
    """
    if len(paths) < 2:
        raise CheckpointError("average needs at least two checkpoints")
    return save_derived(out, paths, lambda: _average(paths), overwrite=overwrite)


def save_derived(
    out: Path, inputs: Sequence[Path], make: Callable[[], Checkpoint], *, overwrite: bool
) -> Path:
    """Write the checkpoint ``make`` builds from ``inputs`` as the only one of run ``out``
    (``tformer average`` and ``tformer shrink``), under the run's lock.

    ``out`` must be a new or empty folder, or (with ``overwrite``) a tformer run that holds
    none of ``inputs``; ``make`` runs once ``out`` has been accepted, so a refusal writes
    nothing.
    """
    locks = RunLocks(out)
    try:
        locks.acquire()
        prepare_output(out, resume=False, overwrite=overwrite, again=_AGAIN)
        _refuse_inputs_inside(inputs, out)
        made = make()
        create_output(out, resume_step=None, overwrite=overwrite, lock=locks.inside)
        return save_checkpoint(
            out,
            model=made.model,
            train_config=made.train_config,
            tokenizers=made.tokenizers,
            step=made.step,
        )
    finally:
        locks.release()


_AGAIN = "--overwrite to replace it (only the files tformer wrote go), or choose another --out"


def _refuse_inputs_inside(paths: Sequence[Path], out: Path) -> None:
    """With ``--overwrite``, the run being replaced must not hold a checkpoint it is made from."""
    if not out.is_dir():
        return
    for path in paths:
        if inside(out, Path(path)):
            raise ConfigError(
                f"--out {out}: holds {path}, a checkpoint it is made from; "
                "write to another --out"
            )


@torch.no_grad()
def _average(paths: Sequence[Path]) -> Checkpoint:
    """The first checkpoint, its model holding the average (step: the latest of them all)."""
    loaded = [load_checkpoint(p) for p in paths]
    first = loaded[0]
    for other in loaded[1:]:
        difference = _difference(first, other)
        if difference:
            raise CheckpointError(
                f"{other.path}: {difference} from {first.path}; only checkpoints of one model "
                "and one vocabulary can be averaged"
            )
    states = [c.model.state_dict() for c in loaded]
    averaged = {
        name: torch.stack([s[name].float() for s in states]).mean(0).to(tensor.dtype)
        for name, tensor in states[0].items()
    }
    # Each input is finite (loading checks it), but a sum of large values can overflow.
    why = "their values are too large to average in float32; nothing was written"
    check_finite(averaged, Path(f"the average of {len(loaded)} checkpoints"), why)
    first.model.load_state_dict(averaged)
    first.step = max(c.step for c in loaded)
    return first


def _difference(first: Checkpoint, other: Checkpoint) -> str | None:
    """What keeps ``other`` from being averaged with ``first``, or None when nothing does."""
    mine, theirs = first.model_config.to_dict(), other.model_config.to_dict()
    fields = [name for name in mine if mine[name] != theirs.get(name)]
    if fields:
        shown = ", ".join(f"{n} {excerpt(theirs.get(n))} vs {excerpt(mine[n])}" for n in fields[:3])
        more = f" and {len(fields) - 3} more" if len(fields) > 3 else ""
        return f"the model configuration differs ({shown}{more})"
    sides = [
        side
        for side in ("source", "target")
        if getattr(other.tokenizers, side).sha256() != getattr(first.tokenizers, side).sha256()
    ]
    if sides:
        return f"the {' and '.join(sides)} tokenizer differs (another vocabulary)"
    return None
