"""Checkpoint averaging: the mean of several checkpoints' weights (Vaswani et al., section 6.1)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from tformer.checkpoint.store import load_checkpoint, save_checkpoint
from tformer.errors import CheckpointError


@torch.no_grad()
def average_checkpoints(paths: Sequence[Path], out: Path) -> Path:
    """Average the weights of ``paths`` (same architecture and tokenizer) into run ``out``.

    Returns:
        The written checkpoint folder.

    Raises:
        CheckpointError: fewer than two checkpoints, or ones that do not share an architecture
            and tokenizer.
    """
    if len(paths) < 2:
        raise CheckpointError("average needs at least two checkpoints")
    loaded = [load_checkpoint(p) for p in paths]
    first = loaded[0]
    for other in loaded[1:]:
        if other.model_config != first.model_config:
            raise CheckpointError(
                f"{other.path}: architecture differs from {first.path}; only checkpoints of one "
                "model can be averaged"
            )
        if other.tokenizers.source.sha256() != first.tokenizers.source.sha256():
            raise CheckpointError(f"{other.path}: tokenizer differs from {first.path}")
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
