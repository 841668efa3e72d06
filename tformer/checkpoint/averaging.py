"""Checkpoint averaging: the mean of several checkpoints' weights (Vaswani et al., section 6.1)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from tformer.checkpoint.store import Checkpoint, load_checkpoint, save_checkpoint
from tformer.errors import CheckpointError


@torch.no_grad()
def average_checkpoints(paths: Sequence[Path], out: Path) -> Path:
    """Average the weights of ``paths`` (same architecture and tokenizers) into run ``out``.

    Returns:
        The written checkpoint folder.

    Raises:
        CheckpointError: fewer than two checkpoints, or ones that differ in their model
            configuration or in either tokenizer (naming the two checkpoints and what differs).
    """
    if len(paths) < 2:
        raise CheckpointError("average needs at least two checkpoints")
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
    first.model.load_state_dict(averaged)
    return save_checkpoint(
        out,
        model=first.model,
        train_config=first.train_config,
        tokenizers=first.tokenizers,
        step=max(c.step for c in loaded),
    )


def _difference(first: Checkpoint, other: Checkpoint) -> str | None:
    """What keeps ``other`` from being averaged with ``first``, or None when nothing does."""
    mine, theirs = first.model_config.to_dict(), other.model_config.to_dict()
    fields = [name for name in mine if mine[name] != theirs.get(name)]
    if fields:
        shown = ", ".join(f"{n} {theirs.get(n)!r} vs {mine[n]!r}" for n in fields[:3])
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
