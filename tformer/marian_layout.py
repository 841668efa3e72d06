"""What a Hugging Face Marian folder written by ``tformer export --to huggingface`` and one
read by ``tformer import`` agree on: the order of Marian's features, and where the target
tokenizer of separate vocabularies lives. (Both sides import it from here, neither from the
other.)"""

from __future__ import annotations

import torch

TARGET_TOKENIZER = "target_tokenizer"  # subfolder: the target side of separate vocabularies


def marian_feature_order(d_model: int) -> torch.Tensor:
    """Marian's feature ``j`` is tformer's feature ``order[j]``: the even (sin) features, then
    the odd (cos) ones; ``argsort`` of it goes back."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])
