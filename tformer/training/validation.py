"""What training measures on held-out data: loss, BLEU / chrF of translations, exact match."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from tformer import checkpoint as ckpt
from tformer.config import TrainConfig
from tformer.data.batching import BatchPlan
from tformer.data.lm import objective_for
from tformer.data.pairs import EncodedSplit
from tformer.decoding.api import decode_texts
from tformer.decoding.settings import DecodingConfig
from tformer.metrics import EVAL_BATCH_TOKENS, corpus_scores
from tformer.model import TransformerBase
from tformer.training.loss import sequence_loss
from tformer.training.precision import Precision


@torch.no_grad()
def evaluate_loss(
    model: TransformerBase,
    split: EncodedSplit,
    device: torch.device,
    precision: Precision | None = None,
    train: TrainConfig | None = None,
) -> float:
    """Mean per-token cross-entropy (no label smoothing) over a split (a masked LM's: over
    the masked tokens, chosen as ``train``'s masking settings say)."""
    model.eval()
    config = model.config
    # A masked LM is validated on one fixed masking (seed 0), the same at every evaluation.
    objective = objective_for(config.arch, config.src_vocab_size, train, seed=0)
    plan = BatchPlan(split.pairs, EVAL_BATCH_TOKENS, seed=0, objective=objective)
    total, tokens = 0.0, 0
    for batch in plan.batches(0):
        batch = batch.to(device)
        if precision is None:
            logits = model(batch.src, batch.tgt_in).logits
        else:
            with precision.autocast():
                logits = model(batch.src, batch.tgt_in).logits
        total += float(sequence_loss(logits, batch.tgt_out))
        tokens += batch.n_target_tokens
    model.train()
    return total / max(tokens, 1)


@torch.no_grad()
def translation_scores(
    model: TransformerBase, split: EncodedSplit, tokenizers: ckpt.Tokenizers, limit: int
) -> dict[str, float]:
    """sacreBLEU BLEU and chrF of greedy translations of the split's first ``limit`` pairs."""
    pairs = split.pairs[:limit]
    references = [t for _, t in split.texts[: len(pairs)]]
    max_new = max(8, model.config.max_len)
    hyps = decode_texts(model, [s for s, _ in pairs], DecodingConfig(max_new_tokens=max_new))
    outputs = tokenizers.target.decode_batch([h[0].ids for h in hyps])
    model.train()
    return text_scores(outputs, references)


def text_scores(outputs: list[str], references: list[str]) -> dict[str, float]:
    """sacreBLEU BLEU and chrF of ``outputs`` against ``references``, by name."""
    scores = corpus_scores(outputs, references)
    return {"bleu": scores.bleu, "chrf": scores.chrf}


def exact_match(
    model: TransformerBase,
    split: EncodedSplit,
    tokenizers: ckpt.Tokenizers,
    *,
    limit: int | None = None,
) -> tuple[float, list[dict[str, str]]]:
    """Share of greedy outputs equal to the reference target, with a few samples."""
    pairs = split.pairs[:limit] if limit else split.pairs
    texts = split.texts[: len(pairs)]
    # An output much longer than every reference cannot equal one: stop decoding there, so an
    # undertrained model that never emits <eos> does not run on to the length limit.
    longest = max((len(t) for _, t in pairs), default=0)
    max_new = min(256, 2 * longest + 8)
    hyps = decode_texts(model, [s for s, _ in pairs], DecodingConfig(max_new_tokens=max_new))
    outputs = tokenizers.target.decode_batch([h[0].ids for h in hyps])
    # Compare in the tokenizer's normal form so NFKC-equivalent strings count as equal.
    references = tokenizers.target.decode_batch([t for _, t in pairs])
    hits = sum(o.strip() == r.strip() for o, r in zip(outputs, references, strict=True))
    samples = [
        {"source": s, "reference": t, "output": o}
        for (s, t), o in zip(texts[:5], outputs[:5], strict=True)
    ]
    model.train()
    return hits / max(len(pairs), 1), samples


# Exact match is reported where a whole output is the unit of meaning: targets of a few words
# (dates, codes, digit strings). A sentence is judged by BLEU / chrF, where it rarely matches.
EXACT_MATCH_WORDS = 4
FINAL_CHUNK = 64  # the most pairs decoded between two looks at the clock
FIRST_CHUNK = 1  # under a deadline, the pair decoded first, to time a pair


@dataclass
class FinalScores:
    """The end-of-run validation of greedy outputs: BLEU, chrF, maybe exact match."""

    pairs: int
    of: int
    bleu: float
    chrf: float
    exact_match: float | None
    samples: list[dict[str, str]] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # the greedy outputs, in the split's order


def short_targets(split: EncodedSplit) -> bool:
    """Whether the split's targets are a few words on average (where exact match means
    something)."""
    words = [len(t.split()) for _, t in split.texts]
    return bool(words) and sum(words) / len(words) <= EXACT_MATCH_WORDS


def final_scores(
    model: TransformerBase,
    split: EncodedSplit,
    tokenizers: ckpt.Tokenizers,
    *,
    deadline: float | None = None,
    limit: int | None = None,
) -> FinalScores:
    """Greedy outputs of the split's (first ``limit``) pairs, scored against the references.

    With a ``deadline`` (a ``time.perf_counter()`` value) decoding stops before it: one pair
    first, to time a pair, then chunks sized to what the time left holds at that pace (at
    least one pair is always decoded)."""
    outputs: list[str] = []
    pairs = split.pairs[:limit] if limit else split.pairs
    longest = max((len(t) for _, t in pairs), default=0)
    settings = DecodingConfig(max_new_tokens=min(256, 2 * longest + 8))
    size, started = (FINAL_CHUNK if deadline is None else FIRST_CHUNK), time.perf_counter()
    while len(outputs) < len(pairs) and size > 0:
        chunk = pairs[len(outputs) : len(outputs) + size]
        hyps = decode_texts(model, [s for s, _ in chunk], settings)
        outputs += tokenizers.target.decode_batch([h[0].ids for h in hyps])
        if deadline is not None:
            now = time.perf_counter()
            per_pair = (now - started) / len(outputs)
            size = min(FINAL_CHUNK, int((deadline - now) / max(per_pair, 1e-9)))
    model.train()
    done = len(outputs)
    texts = split.texts[:done]
    scores = corpus_scores(outputs, [t for _, t in texts])
    exact = None
    if short_targets(split):
        # Compare in the tokenizer's normal form so NFKC-equivalent strings count as equal.
        references = tokenizers.target.decode_batch([t for _, t in pairs[:done]])
        hits = sum(o.strip() == r.strip() for o, r in zip(outputs, references, strict=True))
        exact = hits / max(done, 1)
    samples = [
        {"source": s, "reference": t, "output": o}
        for (s, t), o in zip(texts[:5], outputs[:5], strict=True)
    ]
    return FinalScores(done, len(pairs), scores.bleu, scores.chrf, exact, samples, outputs)
