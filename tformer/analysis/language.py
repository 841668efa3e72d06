"""Measuring and querying the two language-model families: perplexity and bits per character
of a decoder-only model, masked-token accuracy of an encoder-only one, and fill-mask.

Shape legend: B rows, L length, V vocabulary.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tformer.checkpoint.store import Checkpoint
from tformer.config import EOS_ID, MASK, MASK_ID, PAD_ID, ModelConfig
from tformer.data.batching import Batch, BatchPlan
from tformer.data.display import display_token, mask_names
from tformer.data.lm import lm_examples, objective_for
from tformer.data.tokenizer import Tokenizer
from tformer.errors import ConfigError
from tformer.metrics import EVAL_BATCH_TOKENS
from tformer.training.loss import sequence_loss

LN2 = math.log(2.0)


@dataclass
class LanguageEvaluation:
    """A language model on one split: mean loss (nats a predicted token) and what follows."""

    split: str
    documents: int
    tokens: int  # predicted tokens (decoder-only: all; encoder-only: the masked ones)
    loss: float
    perplexity: float
    wall_time: float
    metrics: dict[str, float] = field(default_factory=dict)  # bits_per_char | masked_accuracy

    def to_dict(self) -> dict[str, Any]:
        return {
            "loss": self.loss,
            "perplexity": self.perplexity,
            "tokens": self.tokens,
            **self.metrics,
        }


@torch.no_grad()
def language_batches(ckpt: Checkpoint, docs: Sequence[str]) -> list[Batch]:
    """``docs`` as the model was trained on them, in fixed token-budget batches on its device:
    packed into blocks of its ``--block-size`` (or one document a row with ``--no-pack``); an
    encoder-only model's masking fixed by seed 0."""
    config, train = ckpt.model_config, ckpt.train_config
    device = next(ckpt.model.parameters()).device
    ids = ckpt.tokenizers.source.encode_batch(list(docs))
    block = train.block_size or config.max_len
    examples = lm_examples(
        ids, config.arch, block, pack=train.pack, document_bos=config.document_bos
    )
    objective = objective_for(config.arch, config.src_vocab_size, train, seed=0)
    plan = BatchPlan(examples, EVAL_BATCH_TOKENS, seed=0, objective=objective)
    return [batch.to(device) for batch in plan.batches(0)]


@torch.inference_mode()  # a score, not a training step: no autograd graph to build
def evaluate_language(ckpt: Checkpoint, docs: Sequence[str], *, split: str = "test") -> (
    LanguageEvaluation
):
    """Teacher-forced loss of ``docs`` as the model was trained on them (packed into blocks of
    its ``--block-size``, or one document a row with ``--no-pack``).

    Decoder-only: every token of the joined text (each document's <eos> too) is predicted
    once; bits per character = total loss / ln 2 / characters (a document's <eos> counts
    as its newline). Encoder-only: a fixed masking (seed 0, the checkpoint's settings);
    the loss and the accuracy of the top prediction are over the masked tokens only.
    """
    started = time.perf_counter()
    model = ckpt.model
    model.eval()
    total, tokens, correct = 0.0, 0, 0
    for batch in language_batches(ckpt, docs):
        logits = model(batch.src, batch.tgt_in).logits
        total += float(sequence_loss(logits, batch.tgt_out))
        tokens += batch.n_target_tokens
        labelled = batch.tgt_out != PAD_ID
        correct += int((logits.argmax(dim=-1) == batch.tgt_out)[labelled].sum())
    loss = total / max(tokens, 1)
    metrics: dict[str, float] = {}
    if model.fills_masks:
        metrics["masked_accuracy"] = round(correct / max(tokens, 1), 5)
    else:
        characters = sum(len(doc) + 1 for doc in docs if doc)
        metrics["bits_per_char"] = round(total / LN2 / max(characters, 1), 5)
    return LanguageEvaluation(
        split=split,
        documents=len(docs),
        tokens=tokens,
        loss=round(loss, 5),
        perplexity=round(math.exp(min(loss, 50.0)), 4),
        wall_time=round(time.perf_counter() - started, 2),
        metrics=metrics,
    )


@dataclass(frozen=True)
class Filler:
    token: str  # as tables show it ("▁March", an import's "[MASK]"): display_token
    text: str  # as it reads ("March")
    probability: float


@dataclass(frozen=True)
class FilledMask:
    """The ``top_k`` fillers of one <mask> of the input, most probable first."""

    position: int  # the mask's token position in the input
    fillers: list[Filler]


def encode_with_masks(ckpt: Checkpoint, text: str) -> list[int]:
    """Token ids of ``text`` with each literal ``<mask>`` as the mask token."""
    return encode_with_masks_of(ckpt.tokenizers.source, text)


def masks_written(tokenizer: Tokenizer, text: str) -> str:
    """``text`` with the tokenizer's own name of the mask token (BERT's ``[MASK]``, where the
    checkpoint records one) written ``<mask>``."""
    for name in mask_names(tokenizer)[1:]:
        text = text.replace(name, MASK)
    return text


def encode_with_masks_of(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` with each literal ``<mask>`` (or the tokenizer's own name of it,
    :func:`masks_written`) as the mask token.

    The text is tokenised whole, with a character no vocabulary holds in each mask's place, so
    the tokens around a mask are those of the full sentence ("20<mask>5" masks one digit of a
    year). That character's token becomes <mask>; a mask that starts a word and is not followed
    by a digit also takes the word-boundary piece "▁" before it, so it stands for a whole word
    with its leading space, as a masked word did in training.
    """
    if _HOLE in text:
        raise ConfigError("the input holds U+E000, which fill-mask reserves; remove it")
    text = masks_written(tokenizer, text)
    joined = text.replace(MASK, _HOLE)
    holes = [i for i, ch in enumerate(joined) if ch == _HOLE]
    (encoding,) = tokenizer.encodings([joined])
    boundary = tokenizer.inner.token_to_id(_WORD_START)
    ids: list[int] = []
    filled: set[int] = set()
    for token, (start, end) in zip(encoding.ids, encoding.offsets, strict=True):
        hole = next((h for h in holes if start <= h < end), None)
        if hole is None:
            ids.append(token)
            continue
        if hole in filled:
            continue  # one hole split into several pieces: one mask
        filled.add(hole)
        word_start = hole == 0 or joined[hole - 1].isspace()
        before_digit = hole + 1 < len(joined) and joined[hole + 1].isdigit()
        if ids and ids[-1] == boundary and word_start and not before_digit:
            ids.pop()
        ids.append(MASK_ID)
    if len(filled) < len(holes):
        # A normaliser dropped the character (BERT's removes private-use ones): the literal
        # <mask>, a special token of the vocabulary, is then cut out of the text as it is.
        return tokenizer.inner.encode(text, add_special_tokens=False).ids
    return ids


def as_read(config: ModelConfig, ids: list[int]) -> list[int]:
    """An encoder-only model's input for the text ``ids``: with ``bos_first`` closed by <eos>
    (the model puts <bos> before it: BERT's [CLS] text [SEP]); else the ids themselves."""
    return [*ids, EOS_ID] if config.bos_first else ids


def has_mask_token(tokenizer: Tokenizer) -> bool:
    """Whether the vocabulary holds <mask> at the id an encoder-only model is trained with."""
    return tokenizer.inner.token_to_id(MASK) == MASK_ID


# A private-use character: in no training text, so each tokenizer makes it a token of its own.
_HOLE = "\ue000"
_WORD_START = "\u2581"  # "▁", the Metaspace word boundary of tformer's tokenizers


@torch.no_grad()
def fill_mask(ckpt: Checkpoint, text: str, *, top_k: int = 5) -> list[FilledMask]:
    """The ``top_k`` most probable tokens at each ``<mask>`` of ``text``.

    Raises:
        ConfigError: no ``<mask>`` in ``text``, or the input is longer than the model reads.
    """
    names = mask_names(ckpt.tokenizers.source)
    if MASK not in masks_written(ckpt.tokenizers.source, text):
        written = " or ".join(names)
        raise ConfigError(
            f"the input has no {written}: write {names[-1]} where a word is to be filled in"
        )
    config = ckpt.model_config
    if not has_mask_token(ckpt.tokenizers.source):
        raise ConfigError(
            f"the checkpoint's tokenizer has no {MASK} token at id {MASK_ID}, so this model "
            "cannot fill masks"
        )
    ids = as_read(config, encode_with_masks(ckpt, text))
    if len(ids) > config.max_len:
        raise ConfigError(
            f"the input is {len(ids)} tokens, over the model's --max-len {config.max_len}; "
            "shorten it"
        )
    model = ckpt.model.eval()
    device = next(model.parameters()).device
    logits = model(torch.tensor([ids], device=device), None).logits[0].float()  # (L, V)
    tokenizer = ckpt.tokenizers.source
    k = max(1, min(top_k, logits.size(-1)))
    results = []
    for position, token_id in enumerate(ids):
        if token_id != MASK_ID:
            continue
        probs = logits[position].softmax(dim=-1)
        top = probs.topk(k)
        fillers = [
            Filler(display_token(tokenizer, i), tokenizer.decode([i]), round(float(p), 6))
            for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)
        ]
        results.append(FilledMask(position, fillers))
    return results
