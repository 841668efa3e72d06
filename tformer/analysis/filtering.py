"""Corpus filtering: every pair scored by a translation model (and, given one, a reverse
model), the best kept by a fraction or a threshold.

With a forward model A (source -> target) and a reverse model B (target -> source), a pair
(x, y) is scored by dual conditional cross-entropy (Junczys-Dowmunt 2018, "Dual Conditional
Cross-Entropy Filtering of Noisy Parallel Corpora", WMT18)::

    score = |H_A(y|x) - H_B(x|y)| + (H_A(y|x) + H_B(x|y)) / 2

where H is a model's per-token cross-entropy (nats) of one side given the other under
teacher forcing: the mean of the plain losses of :func:`tformer.analysis.score.score_pairs`
over the label's tokens and ``<eos>``. Lower is better; the paper's adequacy is exp(-score),
in (0, 1]. With a forward model alone the score is H_A(y|x) by itself.

With ``contrast`` a pair is scored instead by how much its own source lowers the cross-entropy
of its target against another pair's source x' (and, with a reverse model, its own target
that of its source against another pair's target y')::

    score = H_A(y|x) - H_A(y|x') [+ H_B(x|y) - H_B(x|y')]

A misaligned target is about as likely after any source, so its score is near 0; a
translation's is well below it, however rare its words. Measured on a noisy copy of
Multi30k, this caught far more misaligned pairs than the dual score of the same two models
(docs/filtering.md). The other pair is the one half the corpus away, so no pair meets itself.

A pair a model cannot read (a side empty, or longer than its ``max_len``) has no score and is
never kept. Nor is a copy, a pair whose target is its source (letters and digits compared,
case aside), unless asked: a model trained on a corpus that holds copies learns to copy, and
then finds them easy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tformer.analysis.score import score_pairs
from tformer.checkpoint.store import Checkpoint
from tformer.config import article
from tformer.config.families import family_record
from tformer.data.sources import TextPair
from tformer.errors import ConfigError
from tformer.metrics import EVAL_BATCH_TOKENS

# Pairs teacher-forced per call: only one chunk's per-token figures are held at a time.
CHUNK_PAIRS = 2048
Progress = Callable[[str, int, int], None]  # (which model, pairs done, pairs in all)


@dataclass(frozen=True)
class CorpusScores:
    """Every pair's figures, in corpus order; NaN where a model cannot read the pair.

    Attributes:
        forward: H_A(y|x), the forward model's per-token cross-entropy of the target.
        reverse: H_B(x|y), the reverse model's of the source; None without a reverse model.
        score: the dual conditional cross-entropy (H_A alone without a reverse model).
        copied: whether each pair's target is its source (:func:`copied_pairs`); None when
            not looked for.
        forward_other: H_A(y|x'), the target's cross-entropy given another pair's source;
            None without ``contrast``.
        reverse_other: H_B(x|y'), likewise for the reverse model; None without ``contrast``
            or without a reverse model.
    """

    forward: np.ndarray
    reverse: np.ndarray | None
    score: np.ndarray
    copied: np.ndarray | None = None
    forward_other: np.ndarray | None = None
    reverse_other: np.ndarray | None = None

    @property
    def contrast(self) -> bool:
        """Whether the score is the source's gain (``contrast``), not the cross-entropy."""
        return self.forward_other is not None

    def __len__(self) -> int:
        return len(self.score)

    @property
    def scored(self) -> np.ndarray:
        """Whether each pair has a score."""
        return ~np.isnan(self.score)


def comparable(text: str) -> str:
    """The letters and digits of ``text``, case folded: what a copy keeps of its source."""
    return "".join(char for char in text.casefold() if char.isalnum())


def copied_pairs(pairs: Sequence[TextPair]) -> np.ndarray:
    """Whether each pair's target is its source, spacing, punctuation and case aside (an
    untranslated copy; Bicleaner's hard rules drop such pairs too). A pair with no letter or
    digit on either side is no copy: it has no text to compare."""
    flags = [bool(text) and text == comparable(target)
             for text, target in ((comparable(source), target) for source, target in pairs)]
    return np.array(flags, dtype=bool)


def dual_score(h_forward: np.ndarray, h_reverse: np.ndarray | None) -> np.ndarray:
    """|H_A - H_B| + (H_A + H_B) / 2, or H_A alone when there is no reverse model."""
    if h_reverse is None:
        return h_forward.copy()
    return np.abs(h_forward - h_reverse) + 0.5 * (h_forward + h_reverse)


def contrast_score(
    h_forward: np.ndarray,
    h_forward_other: np.ndarray,
    h_reverse: np.ndarray | None = None,
    h_reverse_other: np.ndarray | None = None,
) -> np.ndarray:
    """H_A(y|x) - H_A(y|x'), plus H_B(x|y) - H_B(x|y') given a reverse model."""
    score = h_forward - h_forward_other
    if h_reverse is not None and h_reverse_other is not None:
        score = score + (h_reverse - h_reverse_other)
    return score


def mismatched(pairs: Sequence[TextPair], *, side: int) -> list[TextPair]:
    """The pairs with their source (``side`` 0) or target (1) taken from the pair half the
    corpus away: a side that says nothing of the other, for :func:`contrast_score`."""
    shift = len(pairs) // 2
    others = [pairs[(i + shift) % len(pairs)] for i in range(len(pairs))]
    if side == 0:
        return [(other[0], target) for (_, target), other in zip(pairs, others, strict=True)]
    return [(source, other[1]) for (source, _), other in zip(pairs, others, strict=True)]


def check_translation_model(ckpt: Checkpoint, option: str) -> None:
    """Refuse a language model: only a model that reads a source scores a pair."""
    family = family_record(ckpt.model_config.arch)
    if family.reads != "pairs":
        raise ConfigError(
            f"{option} {ckpt.path}: {article(family.name)} {family.name} model; corpus "
            "filtering scores pairs with a translation (encoder-decoder) model"
        )


def check_reverse(forward: Checkpoint, reverse: Checkpoint) -> None:
    """Refuse a reverse model that is no translation model, or that reads the forward
    model's own source vocabulary (or writes its target one) where those two differ: such a
    model translates the same way as the forward one.

    Raises:
        ConfigError: naming ``--reverse`` and what is wrong.
    """
    check_translation_model(reverse, "--reverse")
    fwd, rev = forward.tokenizers, reverse.tokenizers
    if fwd.source.same_vocabulary(fwd.target):
        return  # one vocabulary for both sides: the direction cannot be told from it
    if rev.source.same_vocabulary(fwd.source) or rev.target.same_vocabulary(fwd.target):
        raise ConfigError(
            f"--reverse {reverse.path}: reads the source vocabulary of {forward.path} (or "
            "writes its target one), so it translates the same way; give a model trained "
            "from the targets to the sources"
        )


def mean_losses(
    ckpt: Checkpoint,
    pairs: Sequence[TextPair],
    *,
    swap: bool = False,
    progress: Progress | None = None,
    max_tokens: int = EVAL_BATCH_TOKENS,
) -> np.ndarray:
    """Each pair's per-token cross-entropy (nats) of its target given its source (with
    ``swap``, of its source given its target), NaN where the model cannot read it;
    teacher-forced a chunk of pairs at a time in token-budget batches (``score_pairs``),
    unsmoothed."""
    losses = np.full(len(pairs), math.nan)
    for start in range(0, len(pairs), CHUNK_PAIRS):
        chunk = [(t, s) if swap else (s, t) for s, t in pairs[start : start + CHUNK_PAIRS]]
        scored = score_pairs(ckpt.model, ckpt.tokenizers, chunk, max_tokens=max_tokens)
        for pair in scored:
            losses[start + pair.index] = pair.mean_loss
        if progress is not None:
            progress("reverse" if swap else "forward", start + len(chunk), len(pairs))
    return losses


def score_corpus(
    forward: Checkpoint,
    pairs: Sequence[TextPair],
    *,
    reverse: Checkpoint | None = None,
    contrast: bool = False,
    progress: Progress | None = None,
) -> CorpusScores:
    """Score every (source, target) pair: H_A by ``forward``, H_B by ``reverse`` reading
    (target, source), and their dual conditional cross-entropy; with ``contrast``, each
    model's cross-entropy given the other pair's side too, and the score by
    :func:`contrast_score` (each model reads the corpus twice).

    Raises:
        ConfigError: a language model given, or a reverse model of the same direction.
    """
    check_translation_model(forward, "CHECKPOINT")
    if reverse is not None:
        check_reverse(forward, reverse)
    h_forward = mean_losses(forward, pairs, progress=progress)
    h_reverse = None
    if reverse is not None:
        h_reverse = mean_losses(reverse, pairs, swap=True, progress=progress)
    copied = copied_pairs(pairs)
    if not contrast:
        return CorpusScores(h_forward, h_reverse, dual_score(h_forward, h_reverse), copied)
    other = _named(progress, "another source")
    h_forward_other = mean_losses(forward, mismatched(pairs, side=0), progress=other)
    h_reverse_other = None
    if reverse is not None:
        other = _named(progress, "another target")
        h_reverse_other = mean_losses(reverse, mismatched(pairs, side=1), swap=True,
                                      progress=other)  # fmt: skip
    score = contrast_score(h_forward, h_forward_other, h_reverse, h_reverse_other)
    return CorpusScores(h_forward, h_reverse, score, copied, h_forward_other, h_reverse_other)


def _named(progress: Progress | None, given: str) -> Progress | None:
    """``progress`` with the pass named: the model, then what it reads the pairs with."""
    if progress is None:
        return None
    say = progress
    return lambda model, done, total: say(f"{model} ({given})", done, total)


# -- which pairs are kept ---------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """The pairs kept, in corpus order, and the rule that kept them.

    ``cut``: the highest score kept (with ``keep``) or the threshold; None when nothing was
    kept under ``keep``. ``keep_copies``: whether copies could be kept.
    """

    kept: np.ndarray
    keep: float | None
    threshold: float | None
    cut: float | None
    keep_copies: bool = False

    @property
    def rule(self) -> str:
        if self.keep is not None:
            rule = f"--keep {self.keep:g} (the best {self.keep:.1%} of the pairs)"
        else:
            rule = f"--threshold {self.threshold:g} (score at most {self.threshold:g})"
        return rule + (" with --keep-copies" if self.keep_copies else "")


def check_rule(keep: float | None, threshold: float | None) -> None:
    """Refuse anything but exactly one of a fraction in (0, 1] and a finite threshold."""
    if (keep is None) == (threshold is None):
        raise ConfigError(
            "give exactly one of --keep F (the best fraction of pairs) and --threshold T "
            "(the highest score kept)"
        )
    if keep is not None and not 0.0 < keep <= 1.0:
        raise ConfigError(f"--keep {keep:g} must be a fraction above 0 and at most 1")
    if threshold is not None and not math.isfinite(threshold):
        raise ConfigError(f"--threshold {threshold:g} must be a finite number")


def select(
    scores: CorpusScores,
    *,
    keep: float | None = None,
    threshold: float | None = None,
    keep_copies: bool = False,
) -> Selection:
    """The pairs to keep: the best-scored ``keep`` share of all pairs (round(keep x pairs);
    ties go to the earlier pair), or every pair whose score is at most ``threshold``. A pair
    without a score is never kept, nor a copy unless ``keep_copies``.

    Raises:
        ConfigError: not exactly one of ``keep`` and ``threshold``, or one out of range.
    """
    check_rule(keep, threshold)
    keepable = scores.scored
    if scores.copied is not None and not keep_copies:
        keepable = keepable & ~scores.copied
    score = np.where(keepable, scores.score, math.inf)
    if threshold is not None:
        kept = np.flatnonzero(score <= threshold)
        return Selection(kept, None, threshold, threshold, keep_copies)
    assert keep is not None
    wanted = min(math.floor(keep * len(score) + 0.5), int(keepable.sum()))
    best = np.argsort(score, kind="stable")[:wanted]
    cut = float(score[best[-1]]) if wanted else None
    return Selection(np.sort(best), keep, None, cut, keep_copies)
