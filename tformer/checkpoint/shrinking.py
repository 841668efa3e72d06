"""A smaller model started from a larger one's layers (Shleifer & Rush 2020, "Pre-trained
Summarization Distillation": shrink, then fine-tune).

A student with fewer encoder or decoder layers than its teacher, and otherwise the same shape
and tokenizer, starts from the teacher's embeddings, final norms and a spread of its layers
instead of random weights; training it on the teacher's translations (``tformer distill``,
then ``train --init-from``) then has far less to learn.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from tformer.checkpoint.averaging import save_derived
from tformer.checkpoint.store import Checkpoint, load_checkpoint
from tformer.config import ModelConfig
from tformer.errors import CheckpointError, ConfigError
from tformer.model import build_model

STACKS = {"encoder": "n_encoder_layers", "decoder": "n_decoder_layers"}


def spread(kept: int, layers: int) -> list[int]:
    """Which of ``layers`` layers a stack of ``kept`` starts from: the first alone, else
    evenly spaced from the first to the last (the choice of Shleifer & Rush's students)."""
    if kept == 1:
        return [0]
    return [round(i * (layers - 1) / (kept - 1)) for i in range(kept)]


def shrink_checkpoint(
    path: Path,
    out: Path,
    *,
    n_encoder_layers: int | None = None,
    n_decoder_layers: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write into run ``out`` the model of checkpoint ``path`` with ``n_encoder_layers``
    encoder and ``n_decoder_layers`` decoder layers (None: all), each stack taken from the
    checkpoint's layers by :func:`spread`; every other weight and the tokenizers are copied.

    ``out`` is accepted or refused as ``tformer average`` does (a new or empty folder, or with
    ``overwrite`` a tformer run), at step 0: a model to train, not a trained one.

    Raises:
        ConfigError: a count below 1 or above the checkpoint's, or ``out`` refused.
        CheckpointError: the checkpoint is missing or damaged, or its model has no such stack.
    """
    counts = {"encoder": n_encoder_layers, "decoder": n_decoder_layers}
    for stack, count in counts.items():
        if count is not None and count < 1:
            raise ConfigError(f"--n-{stack}-layers {count} must be at least 1")
    return save_derived(out, [path], lambda: _shrunk(path, counts), overwrite=overwrite)


@torch.no_grad()
def _shrunk(path: Path, counts: dict[str, int | None]) -> Checkpoint:
    teacher = load_checkpoint(path, "cpu")
    config = teacher.model_config
    weights = teacher.model.state_dict()
    kept = {field: getattr(config, field) for field in STACKS.values()}
    for stack, count in counts.items():
        if count is None:
            continue
        have = kept[STACKS[stack]]
        if not any(k.startswith(f"{stack}.layers.") for k in weights):
            raise CheckpointError(f"{path}: its model ({config.arch}) has no {stack} layers")
        if count > have:
            raise ConfigError(
                f"--n-{stack}-layers {count}: {path} has {have} {stack} layers; a shrunk "
                "model can only have fewer"
            )
        kept[STACKS[stack]] = count
    student_config = dataclasses.replace(config, **kept)
    student = build_model(student_config)
    student.load_state_dict(_renamed(weights, config, counts))
    student.eval()
    return Checkpoint(
        model=student,
        model_config=student_config,
        train_config=teacher.train_config,
        tokenizers=teacher.tokenizers,
        step=0,
        path=path,
    )


def _renamed(
    weights: dict[str, torch.Tensor], config: ModelConfig, counts: dict[str, int | None]
) -> dict[str, torch.Tensor]:
    """The teacher's weights under the student's names: layer ``spread(...)[i]`` of each
    shrunk stack becomes its layer ``i``; the other stacks' layers and weights keep theirs."""
    renamed: dict[str, torch.Tensor] = {}
    sources: dict[str, dict[int, int]] = {}
    for stack, count in counts.items():
        if count is not None:
            chosen = spread(count, getattr(config, STACKS[stack]))
            sources[stack] = {old: new for new, old in enumerate(chosen)}
    for name, tensor in weights.items():
        stack, _, rest = name.partition(".layers.")
        if stack in sources and rest:
            index, _, tail = rest.partition(".")
            new = sources[stack].get(int(index))
            if new is None:
                continue  # a layer the student leaves out
            name = f"{stack}.layers.{new}.{tail}"
        renamed[name] = tensor.clone()
    return renamed
