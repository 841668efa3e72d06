"""Translation quality scores: sacreBLEU BLEU and chrF, with the signatures that define them.

sacreBLEU is the reference implementation of both metrics; its signatures (tokeniser, casing,
smoothing, version) are reported with every score so figures can be compared across papers.
This module sits on the bottom floor so that training (validation scores) and analysis
(``tformer evaluate``) both use it without importing each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sacrebleu.metrics import BLEU, CHRF

# Padded tokens per evaluation batch: larger than training batches (no activations are kept).
EVAL_BATCH_TOKENS = 8192
PERPLEXITY_PLAIN = 1e6  # perplexities from here on are printed in scientific notation


@dataclass
class Scores:
    """Corpus-level scores with the sacreBLEU signatures that define them."""

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    bleu_detail: str


def perplexity_text(value: float) -> str:
    """A perplexity as every table, card and progress line prints it: three decimals below a
    million ("12.346"), scientific notation above ("5.185e+21", a random model's), so a
    huge value stays readable."""
    return f"{value:.3f}" if abs(value) < PERPLEXITY_PLAIN else f"{value:.3e}"


def sacrebleu_metrics() -> tuple[BLEU, CHRF]:
    """The BLEU and chrF every score of tformer is measured with: sacreBLEU's defaults."""
    # Lazy: sacrebleu is slow to import and only scoring needs it (not `import tformer`).
    from sacrebleu.metrics import BLEU, CHRF

    return BLEU(), CHRF()


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    """sacreBLEU BLEU and chrF of detokenised hypotheses against one reference each."""
    bleu, chrf = sacrebleu_metrics()
    refs = [list(references)]
    bleu_score = bleu.corpus_score(list(hypotheses), refs)
    chrf_score = chrf.corpus_score(list(hypotheses), refs)
    return Scores(
        bleu=round(bleu_score.score, 2),
        chrf=round(chrf_score.score, 2),
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        bleu_detail=str(bleu_score),
    )
