"""The teacher-forcing X-ray: what the model makes of every position of a reference.

Shape legend: B pairs in a batch, S source tokens, T decoder positions, V target vocabulary.

Position t of a pair reads decoder input t (``<bos>``, then the reference's tokens) and must
predict label t (the reference's tokens, then ``<eos>``): the shift training uses
(``tformer.data.batching.shift_right``). For each position :func:`score_pairs` records the
label's probability and rank, the model's own top choice, and the label's cross-entropy, plain
and label-smoothed exactly as ``tformer.training.loss`` defines it, so the plain losses of a
pair sum to its share of ``evaluate``'s teacher-forced loss and the smoothed ones to the
training loss of the same batch with dropout off.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tformer.checkpoint.store import Tokenizers
from tformer.config import PAD_ID, UNK, UNK_ID
from tformer.data.batching import BatchPlan, shift_right
from tformer.data.display import display_tokens
from tformer.data.pairs import KeptTexts, encode_pairs, unfit
from tformer.data.sources import TextPair
from tformer.data.tokenizer import Tokenizer
from tformer.errors import DataError
from tformer.metrics import EVAL_BATCH_TOKENS
from tformer.model import TransformerBase
from tformer.model.attention import causal_mask, padding_mask
from tformer.model.transformer import source_as_read
from tformer.paths import excerpt

# Columns of one position, in the order of records, the TSV and the JSON.
POSITION_FIELDS = (
    "position",
    "input",
    "label",
    "p_label",
    "rank",
    "top",
    "p_top",
    "loss",
    "smoothed_loss",
    "mismatch",
)


@dataclass(frozen=True)
class PairScore:
    """One pair under teacher forcing: lists with one entry per decoder position.

    Attributes:
        index: the pair's place in the list given to :func:`score_pairs` (0 = the first).
        input_ids / input_tokens: what the decoder read: ``<bos>`` + the reference's tokens.
        label_ids / label_tokens: what it had to predict: the reference's tokens + ``<eos>``.
        p_label, rank: the label's probability and rank (1 = the model's top choice).
        top_ids / top_tokens, p_top: the model's most probable token and its probability.
        loss: the label's cross-entropy, -log p_label (nats).
        smoothed_loss: the label-smoothed cross-entropy with ``label_smoothing`` (the
            training objective; equal to ``loss`` at 0).
    """

    index: int
    source: str
    reference: str
    source_ids: list[int]
    source_tokens: list[str]
    input_ids: list[int]
    input_tokens: list[str]
    label_ids: list[int]
    label_tokens: list[str]
    p_label: list[float]
    rank: list[int]
    top_ids: list[int]
    top_tokens: list[str]
    p_top: list[float]
    loss: list[float]
    smoothed_loss: list[float]
    label_smoothing: float
    # A masked language model's pseudo-log-likelihood: each position scored with its token
    # alone replaced by <mask> (``input`` is then <mask> throughout).
    masked: bool = False

    @property
    def tokens(self) -> int:
        """Positions scored: the reference's tokens and ``<eos>``."""
        return len(self.label_ids)

    @property
    def loss_sum(self) -> float:
        return math.fsum(self.loss)

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.mean_loss, 50.0))

    @property
    def smoothed_loss_sum(self) -> float:
        return math.fsum(self.smoothed_loss)

    @property
    def mismatches(self) -> list[int]:
        """Positions where the model's top choice is not the label."""
        pairs = zip(self.top_ids, self.label_ids, strict=True)
        return [t for t, (top, label) in enumerate(pairs) if top != label]

    def records(self) -> list[dict[str, Any]]:
        """One plain dict per position, keyed by ``POSITION_FIELDS``."""
        return [
            {
                "position": t,
                "input": self.input_tokens[t],
                "input_id": self.input_ids[t],
                "label": self.label_tokens[t],
                "label_id": self.label_ids[t],
                "p_label": self.p_label[t],
                "rank": self.rank[t],
                "top": self.top_tokens[t],
                "top_id": self.top_ids[t],
                "p_top": self.p_top[t],
                "loss": self.loss[t],
                "smoothed_loss": self.smoothed_loss[t],
                "mismatch": self.top_ids[t] != self.label_ids[t],
            }
            for t in range(self.tokens)
        ]

    def totals(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "loss_sum": self.loss_sum,
            "mean_loss": self.mean_loss,
            "perplexity": self.perplexity,
            "smoothed_loss_sum": self.smoothed_loss_sum,
            "smoothed_mean_loss": self.smoothed_loss_sum / self.tokens,
            "mismatches": len(self.mismatches),
        }

    def to_dict(self, *, positions: bool = True) -> dict[str, Any]:
        """JSON-ready: the pair, its totals and (with ``positions``) every position."""
        out: dict[str, Any] = {
            "index": self.index,
            "source": self.source,
            "reference": self.reference,
            "label_smoothing": self.label_smoothing,
            **self.totals(),
        }
        if self.masked:
            out["objective"] = "pseudo-log-likelihood"
        if positions:
            out["positions"] = self.records()
        return out


# -- the maths of one batch -------------------------------------------------------------------


def position_scores(logits: Tensor, labels: Tensor, smoothing: float) -> dict[str, Tensor]:
    """Per-position figures of (B, T, V) logits against (B, T) labels, each (B, T).

    The losses follow ``tformer.training.loss`` term by term, in float32: with
    lse = log Σ_j exp(x_j), loss = lse - x_y and the smoothed loss
    lse - (1 - ε) x_y - (ε / V) Σ_j x_j. A label's rank counts the tokens scored strictly
    higher, plus one (ties share the better rank).
    """
    x = logits.float()
    vocab = x.size(-1)
    peak = x.amax(dim=-1)  # (B, T)
    lse = peak + (x - peak[..., None]).exp().sum(dim=-1).log()
    target = x.gather(-1, labels[..., None]).squeeze(-1)  # (B, T) x_y
    smoothed = lse - (1.0 - smoothing) * target
    if smoothing:
        smoothed = smoothed - (smoothing / vocab) * x.sum(dim=-1)
    top = x.argmax(dim=-1)
    return {
        "loss": lse - target,
        "smoothed_loss": smoothed,
        "p_label": (target - lse).exp(),
        "rank": (x > target[..., None]).sum(dim=-1) + 1,
        "top": top,
        "p_top": (peak - lse).exp(),
    }


@torch.no_grad()
def score_pairs(
    model: TransformerBase,
    tokenizers: Tokenizers,
    pairs: Sequence[TextPair],
    *,
    label_smoothing: float = 0.0,
    max_tokens: int = EVAL_BATCH_TOKENS,
) -> list[PairScore]:
    """Teacher-force every (source, reference) pair through ``model`` and score each position.

    Pairs are batched by length under a budget of ``max_tokens`` padded tokens, as
    ``evaluate``'s loss is. Pairs that do not fit the model (a side empty, or longer than
    ``max_len``) are skipped, as ``evaluate`` skips them: each result's ``index`` says which
    pair it is. The model runs in eval mode (no dropout) and is put back in the mode it was in;
    it is used as given, so a caller may change it first (silence a head, say).

    Returns:
        One :class:`PairScore` per kept pair, in the order of ``pairs``.
    """
    split = encode_pairs(pairs, tokenizers.source, tokenizers.target, model.config.max_len)
    assert isinstance(split.texts, KeptTexts)
    kept = split.texts.kept.tolist()  # the index in ``pairs`` of each encoded pair
    device = next(model.parameters()).device
    plan = BatchPlan(split.pairs, max_tokens, seed=0)
    scores: dict[int, PairScore] = {}
    was_training = model.training
    model.eval()
    try:
        for indices in plan.epoch(0):
            batch = plan.collate(indices).to(device)
            logits = model(batch.src, batch.tgt_in).logits  # (B, T, V)
            figures = position_scores(logits, batch.tgt_out, label_smoothing)
            lists = {name: value.cpu().tolist() for name, value in figures.items()}
            for row, i in enumerate(indices.tolist()):
                src_ids, tgt_ids = (list(map(int, ids)) for ids in split.pairs[i])
                figures_of_row = {name: value[row] for name, value in lists.items()}
                scores[i] = shifted_record(
                    (kept[i], pairs[kept[i]]),
                    source_as_read(src_ids, model.config),  # the <eos> Marian's read with
                    tgt_ids,
                    figures_of_row,
                    tokenizers,
                    label_smoothing,
                )
    finally:
        model.train(was_training)
    return [scores[i] for i in range(len(split.pairs))]


def shifted_record(
    pair_at: tuple[int, TextPair],
    src_ids: list[int],
    tgt_ids: list[int],
    row: dict[str, list[Any]],
    tokenizers: Tokenizers,
    smoothing: float,
) -> PairScore:
    """One pair's record from its row of the batch (padding positions cut off)."""
    tgt_in, tgt_out = shift_right(tgt_ids)
    return position_record(pair_at, src_ids, tgt_in, tgt_out, row, tokenizers, smoothing)


def position_record(
    pair_at: tuple[int, TextPair],
    src_ids: list[int],
    input_ids: list[int],
    label_ids: list[int],
    row: dict[str, list[Any]],
    tokenizers: Tokenizers,
    smoothing: float,
    *,
    masked: bool = False,
) -> PairScore:
    """The record of ``label_ids`` read from ``input_ids``, with ``row``'s figures for them
    (the positions beyond the labels cut off); labels are in the target's vocabulary."""
    index, pair = pair_at
    n = len(label_ids)
    top_ids = [int(i) for i in row["top"][:n]]
    target = tokenizers.target
    return PairScore(
        index=index,
        source=pair[0],
        reference=pair[1],
        source_ids=src_ids,
        source_tokens=display_tokens(tokenizers.source, src_ids),
        input_ids=input_ids,
        input_tokens=display_tokens(target, input_ids),
        label_ids=label_ids,
        label_tokens=display_tokens(target, label_ids),
        p_label=row["p_label"][:n],
        rank=[int(r) for r in row["rank"][:n]],
        top_ids=top_ids,
        top_tokens=display_tokens(target, top_ids),
        p_top=row["p_top"][:n],
        loss=row["loss"][:n],
        smoothed_loss=row["smoothed_loss"][:n],
        label_smoothing=smoothing,
        masked=masked,
    )


def score_pair(
    model: TransformerBase,
    tokenizers: Tokenizers,
    source: str,
    reference: str,
    *,
    label_smoothing: float = 0.0,
) -> PairScore:
    """Score one pair, refusing one that cannot be scored as given.

    Raises:
        DataError: the reference holds characters the target tokenizer cannot encode (they
            would be scored as ``<unk>``), a side is empty, or the pair is over ``max_len``.
    """
    check_encodable(tokenizers.target, reference, "REFERENCE")
    src, tgt = tokenizers.source.encode(source), tokenizers.target.encode(reference)
    problem = unfit(len(src), len(tgt), model.config.max_len)
    if problem is not None:
        raise DataError(f"SOURCE / REFERENCE: {problem}; give a shorter or non-empty pair")
    (scored,) = score_pairs(
        model, tokenizers, [(source, reference)], label_smoothing=label_smoothing
    )
    return scored


def unknown_characters(tokenizer: Tokenizer, text: str) -> list[str]:
    """The pieces of ``text`` that ``tokenizer`` can only encode as ``<unk>``."""
    (encoding,) = tokenizer.encodings([text])
    pieces = zip(encoding.ids, encoding.offsets, strict=True)
    return [text[start:end] for i, (start, end) in pieces if i == UNK_ID]


def check_encodable(tokenizer: Tokenizer, text: str, name: str, side: str = "target") -> None:
    """Refuse ``text`` when the tokenizer maps part of it to ``<unk>``."""
    unknown = unknown_characters(tokenizer, text)
    if unknown:
        raise DataError(
            f"{name} {excerpt(text)}: {excerpt(''.join(dict.fromkeys(unknown)))} cannot be "
            f"encoded by the {side} tokenizer (it would be scored as {UNK}); "
            f"give a {name.lower()} in the tokenizer's alphabet"
        )


def decoder_masks(scored: PairScore) -> tuple[Tensor, Tensor]:
    """The masks the decoder used for a pair scored alone, True = may attend.

    Returns:
        (T, T) causal self-attention mask and (T, S) cross-attention mask (every real source
        token; a pair scored alone has no padding).
    """
    t = len(scored.input_ids)
    causal = causal_mask(t, t)[0, 0]
    src = torch.tensor([scored.source_ids])
    cross = padding_mask(src, PAD_ID)[0, 0].expand(t, -1)
    return causal, cross


# -- a split's summary ------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoreSummary:
    """Totals over scored pairs; ``mismatch_share``: positions whose top choice is not the
    label, over all positions."""

    pairs: int
    dropped: int
    tokens: int
    loss_sum: float
    mean_loss: float
    perplexity: float
    smoothed_loss_sum: float
    smoothed_mean_loss: float
    mismatch_share: float
    label_smoothing: float


def summarize(scores: Sequence[PairScore], *, dropped: int = 0) -> ScoreSummary:
    tokens = sum(s.tokens for s in scores)
    loss_sum = math.fsum(s.loss_sum for s in scores)
    smoothed_sum = math.fsum(s.smoothed_loss_sum for s in scores)
    mean = loss_sum / max(tokens, 1)
    return ScoreSummary(
        pairs=len(scores),
        dropped=dropped,
        tokens=tokens,
        loss_sum=loss_sum,
        mean_loss=mean,
        perplexity=math.exp(min(mean, 50.0)),
        smoothed_loss_sum=smoothed_sum,
        smoothed_mean_loss=smoothed_sum / max(tokens, 1),
        mismatch_share=sum(len(s.mismatches) for s in scores) / max(tokens, 1),
        label_smoothing=scores[0].label_smoothing if scores else 0.0,
    )


def worst(scores: Sequence[PairScore], n: int) -> list[PairScore]:
    """The ``n`` pairs of highest mean loss, highest first (ties: the earlier pair first)."""
    return sorted(scores, key=lambda s: (-s.mean_loss, s.index))[:n]


def _tsv_field(value: object) -> str:
    """A TSV cell: backslash, tab and line breaks escaped, so every row stays one line."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    for char, escaped in (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r")):
        text = text.replace(char, escaped)
    return text


def score_tsv(scores: Sequence[PairScore]) -> str:
    """Every position of every pair, one line each, after a header row."""
    lines = ["\t".join(("pair", *POSITION_FIELDS))]
    for scored in scores:
        for record in scored.records():
            cells = [scored.index, *(record[name] for name in POSITION_FIELDS)]
            lines.append("\t".join(_tsv_field(c) for c in cells))
    return "\n".join(lines) + "\n"
