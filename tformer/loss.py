"""The training objective: label-smoothed cross-entropy over the non-padding labels."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tformer.tokenizer import PAD_ID


def sequence_loss(
    logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Summed cross-entropy over the non-padding labels (divide by their count for a mean).

    Args:
        logits: (B, T, V); labels: (B, T) with PAD_ID where nothing is predicted.
    """
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(),
        labels.reshape(-1),
        ignore_index=PAD_ID,
        label_smoothing=label_smoothing,
        reduction="sum",
    )
