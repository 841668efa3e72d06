"""Which heads matter: mask each attention head in turn and measure what it costs, then prune
the least important heads greedily (Michel et al. 2019, "Are Sixteen Heads Really Better than
One?"; Voita et al. 2019).

A head's importance is the change in a quality measure when it alone is masked: the
teacher-forced loss (higher when masked = important), or with ``metric="bleu"`` the drop in
sacreBLEU of greedy translations. Pruning removes, at each step, the heads whose masking
(on top of those already removed) costs least, and measures quality after each step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tformer.analysis.evaluate import batches_loss, teacher_forced_batches
from tformer.analysis.language import language_batches
from tformer.checkpoint.store import Checkpoint, Tokenizers
from tformer.data.batching import Batch
from tformer.data.sources import TextPair
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.text import translate
from tformer.errors import ConfigError
from tformer.metrics import corpus_scores
from tformer.model import EncoderOutput, TransformerBase
from tformer.model.heads import PARTS, HeadName, all_heads, attention_layers, heads_masked
from tformer.training.loss import sequence_loss

METRICS = ("loss", "bleu")


@dataclass(frozen=True)
class Quality:
    """What one configuration of masks scores: loss, and BLEU/chrF when measured."""

    loss: float
    bleu: float | None = None
    chrf: float | None = None


@dataclass(frozen=True)
class HeadEffect:
    """One head masked alone: the quality then, and the importance (how much worse)."""

    head: str  # e.g. "cross.1.3"
    part: str
    layer: int
    index: int
    quality: Quality
    importance: float  # loss increase, or BLEU drop with metric="bleu"


@dataclass(frozen=True)
class PrunePoint:
    """Quality with a share of all heads removed (the heads named in ``pruned``)."""

    removed: int
    share: float
    pruned: list[str]
    quality: Quality


@dataclass
class Ablation:
    """The baseline, every head's effect (most important first) and the pruning curve."""

    metric: str
    pairs: int  # what it was measured on: pairs, or a language model's documents (``unit``)
    baseline: Quality
    effects: list[HeadEffect]
    prune_curve: list[PrunePoint] = field(default_factory=list)
    unit: str = "pairs"

    def grid(self, part: str) -> list[list[float]]:
        """Importance of ``part``'s heads as (layers x heads), for heatmaps."""
        ours = [e for e in self.effects if e.part == part]
        if not ours:
            return []
        layers = 1 + max(e.layer for e in ours)
        heads = 1 + max(e.index for e in ours)
        grid = [[math.nan] * heads for _ in range(layers)]
        for e in ours:
            grid[e.layer][e.index] = e.importance
        return grid

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            self.unit: self.pairs,
            "baseline": asdict(self.baseline),
            "heads": [asdict(e) for e in self.effects],
            "grid": {part: self.grid(part) for part in PARTS},
            "prune_curve": [asdict(p) for p in self.prune_curve],
        }


Measure = Callable[[], Quality]


def quality_probe(
    model: TransformerBase,
    tokenizers: Tokenizers,
    pairs: Sequence[TextPair],
    *,
    metric: str,
    decoding: DecodingConfig | None = None,
    batch_size: int = 64,
) -> Measure:
    """A function measuring ``model`` as it is now on ``pairs`` (batches made once)."""
    if metric not in METRICS:
        raise ConfigError(f"--metric {metric!r} must be one of {', '.join(METRICS)}")
    device = next(model.parameters()).device
    batches = teacher_forced_batches(tokenizers, pairs, model.config.max_len, device)
    mean_loss = TeacherForcedLoss(model, batches)
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]

    def measure() -> Quality:
        loss = round(mean_loss(), 6)
        if metric == "loss":
            return Quality(loss)
        outputs = translate(model, tokenizers, sources, decoding, batch_size=batch_size)
        scores = corpus_scores([g[0].text for g in outputs], references)
        return Quality(loss, scores.bleu, scores.chrf)

    return measure


class TeacherForcedLoss:
    """The mean teacher-forced loss of ``model`` as it is now, over fixed batches.

    The encoder's outputs are kept while no encoder head is masked: masking a decoder or
    cross-attention head cannot change them, and those are two thirds of the heads.
    """

    def __init__(self, model: TransformerBase, batches: Sequence[Batch]) -> None:
        self.model, self.batches = model, batches
        self.memory: list[EncoderOutput] | None = None

    @torch.no_grad()
    def __call__(self) -> float:
        if any(a.head_gate is not None for a in attention_layers(self.model)["enc"]):
            return batches_loss(self.model, self.batches)[0]
        if self.memory is None:
            self.memory = [self.model.encode(batch.src) for batch in self.batches]
        total, tokens = 0.0, 0
        for batch, encoded in zip(self.batches, self.memory, strict=True):
            logits = self.model.decode(batch.tgt_in, encoded).logits
            total += float(sequence_loss(logits, batch.tgt_out))
            tokens += batch.n_target_tokens
        return total / max(tokens, 1)


def importance(metric: str, baseline: Quality, masked_quality: Quality) -> float:
    """How much worse masking made things: the loss increase, or the BLEU drop."""
    if metric == "bleu":
        assert baseline.bleu is not None and masked_quality.bleu is not None
        return round(baseline.bleu - masked_quality.bleu, 4)
    return round(masked_quality.loss - baseline.loss, 6)


def head_effects(
    model: TransformerBase,
    measure: Measure,
    metric: str,
    heads: Sequence[HeadName],
    *,
    already: Sequence[HeadName] = (),
    on_head: Callable[[HeadName], None] | None = None,
) -> tuple[Quality, list[HeadEffect]]:
    """Mask each of ``heads`` in turn (on top of ``already``); effects, most important first.

    Ties keep the model's order (encoder, decoder, cross; layer; head), so a ranking is
    reproducible.
    """
    with heads_masked(model, already):
        baseline = measure()
    effects = []
    for head in heads:
        with heads_masked(model, [*already, head]):
            quality = measure()
        effects.append(
            HeadEffect(
                str(head),
                head.part,
                head.layer,
                head.head,
                quality,
                importance(metric, baseline, quality),
            )
        )
        if on_head is not None:
            on_head(head)
    order = sorted(range(len(effects)), key=lambda i: -effects[i].importance)
    return baseline, [effects[i] for i in order]


def ablate_pairs(
    model: TransformerBase,
    tokenizers: Tokenizers,
    pairs: Sequence[TextPair],
    *,
    metric: str = "loss",
    prune_step: float | None = None,
    decoding: DecodingConfig | None = None,
    batch_size: int = 64,
    on_head: Callable[[HeadName], None] | None = None,
) -> Ablation:
    """Rank every head of ``model`` by what masking it alone costs on ``pairs``.

    Args:
        metric: "loss" (teacher forcing) or "bleu" (greedy translation; loss is kept too).
        prune_step: also prune greedily, this share of all heads per step (e.g. 0.1), and
            measure after each step until every head is gone.
        on_head: called after each head's measurement (progress).

    Every measurement masks exactly the heads it names; masks set on ``model`` before the
    call are restored afterwards.
    """
    if not pairs:
        raise ConfigError("nothing to ablate on: the split has no pairs")
    measure = quality_probe(
        model, tokenizers, pairs, metric=metric, decoding=decoding, batch_size=batch_size
    )
    return ablate_with(model, measure, metric, len(pairs), prune_step, on_head)


def ablate_language(
    ckpt: Checkpoint,
    docs: Sequence[str],
    *,
    prune_step: float | None = None,
    on_head: Callable[[HeadName], None] | None = None,
) -> Ablation:
    """Rank every head of a language model (decoder- or encoder-only) by the loss increase
    that masking it alone causes on ``docs``, read as ``tformer evaluate`` reads them."""
    if not docs:
        raise ConfigError("nothing to ablate on: the split has no documents")
    batches = language_batches(ckpt, docs)
    model = ckpt.model

    def measure() -> Quality:
        return Quality(round(batches_loss(model, batches)[0], 6))

    result = ablate_with(model, measure, "loss", len(docs), prune_step, on_head)
    result.unit = "documents"
    return result


def ablate_with(
    model: TransformerBase,
    measure: Measure,
    metric: str,
    measured: int,
    prune_step: float | None,
    on_head: Callable[[HeadName], None] | None,
) -> Ablation:
    """:func:`ablate` with its measurement given (``measured``: the pairs or documents)."""
    if prune_step is not None and not 0.0 < prune_step <= 1.0:
        raise ConfigError(f"--prune-step {prune_step} must be in (0, 1]")
    heads = all_heads(model)
    was_training = model.training
    model.eval()
    try:
        baseline, effects = head_effects(model, measure, metric, heads, on_head=on_head)
        curve = (
            []
            if prune_step is None
            else prune_curve(model, measure, metric, heads, (baseline, effects), prune_step)
        )
    finally:
        model.train(was_training)
    return Ablation(metric, measured, baseline, effects, curve)


def prune_curve(
    model: TransformerBase,
    measure: Measure,
    metric: str,
    heads: Sequence[HeadName],
    first: tuple[Quality, list[HeadEffect]],
    step: float,
) -> list[PrunePoint]:
    """Greedy pruning: each step removes the ``step`` share of all heads that cost least when
    masked on top of the heads removed so far (re-measured after every step), until none is
    left."""
    by_name = {str(h): h for h in heads}
    per_step = max(1, math.ceil(step * len(heads)))
    pruned: list[HeadName] = []
    quality, effects = first
    curve = []
    while True:
        share = round(len(pruned) / len(heads), 4)
        curve.append(PrunePoint(len(pruned), share, [str(h) for h in pruned], quality))
        if len(pruned) == len(heads):
            return curve
        pruned.extend(by_name[e.head] for e in effects[::-1][:per_step])
        remaining = [h for h in heads if h not in pruned]
        if remaining:
            quality, effects = head_effects(model, measure, metric, remaining, already=pruned)
        else:
            quality = measure_with(model, measure, pruned)


def measure_with(model: TransformerBase, measure: Measure, heads: Sequence[HeadName]) -> Quality:
    with heads_masked(model, heads):
        return measure()
