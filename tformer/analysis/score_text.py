"""A language model's text under the teacher-forcing X-ray, as :mod:`tformer.analysis.score`
shows a pair: a decoder-only model predicts each next token, an encoder-only one each token
masked in turn (its pseudo-log-likelihood)."""

from __future__ import annotations

import torch

from tformer.analysis.language import as_read, has_mask_token
from tformer.analysis.score import (
    PairScore,
    check_encodable,
    position_record,
    position_scores,
    shifted_record,
)
from tformer.checkpoint.store import Tokenizers
from tformer.config import MASK, MASK_ID
from tformer.data.lm import CausalObjective, lm_examples
from tformer.errors import ConfigError, DataError
from tformer.model import TransformerBase


@torch.no_grad()
def score_text(
    model: TransformerBase, tokenizers: Tokenizers, text: str, *, label_smoothing: float = 0.0
) -> PairScore:
    """A decoder-only model's ``text`` teacher-forced as it trains on one document (``<bos>``
    text ``<eos>``): at each position the next token's probability, rank and loss. The
    result's ``source`` is empty and its ``reference`` the text.

    Raises:
        DataError: the text is empty, holds characters the tokenizer encodes as ``<unk>``, or
            does not fit the model's positions.
    """
    check_encodable(tokenizers.target, text, "TEXT")
    ids = tokenizers.target.encode(text)
    limit = model.config.max_len
    if not ids or len(ids) + 1 > limit:
        what = "empty" if not ids else f"{len(ids)} tokens, and <bos> before them"
        raise DataError(f"TEXT: {what}; the model reads 1 to {limit - 1} tokens")
    (example,) = lm_examples([ids], "decoder-only", limit, pack=False)
    batch = CausalObjective().collate([example], [0]).to(next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        logits = model(batch.src, batch.tgt_in).logits  # (1, T, V)
    finally:
        model.train(was_training)
    figures = position_scores(logits, batch.tgt_out, label_smoothing)
    row = {name: value[0].cpu().tolist() for name, value in figures.items()}
    return shifted_record((0, ("", text)), [], ids, row, tokenizers, label_smoothing)


# Masked copies of a text run together in batches of at most this many rows.
_MASKED_ROWS = 32


@torch.no_grad()
def score_masked_text(
    model: TransformerBase, tokenizers: Tokenizers, text: str, *, label_smoothing: float = 0.0
) -> PairScore:
    """An encoder-only model's pseudo-log-likelihood of ``text`` (Salazar et al., 2020, "Masked
    Language Model Scoring"): each token in turn replaced by ``<mask>``, the rest left as it
    is, and that token's probability, rank and loss read at its position. Perplexity is then
    the pseudo-perplexity. The special tokens the model reads around the text are not scored.

    Raises:
        DataError: the text is empty, holds characters the tokenizer encodes as ``<unk>``, or
            does not fit the model's positions.
    """
    tokenizer = tokenizers.source
    if not has_mask_token(tokenizer):
        raise ConfigError(
            f"the tokenizer has no {MASK} token at id {MASK_ID}, which scoring a masked "
            "language model needs"
        )
    check_encodable(tokenizer, text, "TEXT", "model's")
    ids = tokenizer.encode(text)
    config = model.config
    read = as_read(config, ids)
    limit = config.max_len  # <bos>, with bos_first, has a position of its own beyond it
    if not ids or len(read) > limit:
        what = "empty" if not ids else f"{len(read)} tokens as the model reads it"
        raise DataError(f"TEXT: {what}; the model reads 1 to {limit} tokens")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    rows = []
    try:
        for start in range(0, len(ids), _MASKED_ROWS):
            positions = torch.arange(start, min(start + _MASKED_ROWS, len(ids)), device=device)
            copy = torch.arange(positions.numel(), device=device)
            copies = torch.tensor(read, device=device).repeat(positions.numel(), 1)
            copies[copy, positions] = MASK_ID
            rows.append(model(copies, None).logits[copy, positions])  # (rows, V)
    finally:
        model.train(was_training)
    figures = position_scores(torch.cat(rows)[None], torch.tensor([ids], device=device),
                              label_smoothing)  # fmt: skip
    row = {name: value[0].cpu().tolist() for name, value in figures.items()}
    masks = [MASK_ID] * len(ids)
    return position_record(
        (0, ("", text)), [], masks, ids, row, tokenizers, label_smoothing, masked=True
    )
