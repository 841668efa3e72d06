"""One ``evaluate``, ``score`` and ``ablate`` for every model family.

Each reads the checkpoint's family record (``tformer.config.families``) and takes that family's
way: a translation model is measured on (source, reference) pairs by what it translates and by
teacher forcing, a language model on documents by its loss (perplexity, bits per character or
masked-token accuracy). A library user calls the same function for a Marian, a T5, a GPT-2 or
a BERT checkpoint, as the CLI does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tformer.analysis.ablate import Ablation, ablate_language, ablate_pairs
from tformer.analysis.evaluate import Evaluation, evaluate_pairs
from tformer.analysis.language import LanguageEvaluation, evaluate_language
from tformer.analysis.score import PairScore, score_pair
from tformer.analysis.score_text import score_masked_text, score_text
from tformer.checkpoint.store import Checkpoint
from tformer.config.families import Family, family_record
from tformer.data.sources import TextPair
from tformer.decoding.ensemble import Decodable
from tformer.decoding.settings import DecodingConfig
from tformer.errors import ConfigError
from tformer.model.heads import HeadName

# A family's examples: (source, reference) pairs, or a language model's documents.
Examples = Sequence[TextPair] | Sequence[str]


def family_of(ckpt: Checkpoint) -> Family:
    """The record of the family ``ckpt``'s model belongs to."""
    return family_record(ckpt.model_config.arch)


def _pairs(family: Family, examples: Examples) -> list[TextPair]:
    """``examples`` as a translation model's pairs, or one line saying what it reads."""
    if any(not isinstance(e, tuple) or len(e) != 2 for e in examples):
        raise ConfigError(
            f"a {family.name} model is measured on (source, reference) pairs, not on documents"
        )
    return list(examples)  # type: ignore[arg-type]


def _documents(family: Family, examples: Examples) -> list[str]:
    """``examples`` as a language model's documents, or one line saying what it reads."""
    if any(not isinstance(e, str) for e in examples):
        raise ConfigError(
            f"a {family.name} model is measured on documents (strings), not on pairs"
        )
    return list(examples)  # type: ignore[arg-type]


def evaluate(
    ckpt: Checkpoint,
    examples: Examples,
    *,
    split: str = "test",
    decoding: DecodingConfig | None = None,
    batch_size: int = 64,
    model: Decodable | None = None,
) -> Evaluation | LanguageEvaluation:
    """Measure ``ckpt`` on one split as its family is measured.

    A translation model (encoder-decoder) translates the pairs' sources with ``decoding`` and
    is scored with sacreBLEU and chrF against the references, and by its teacher-forced loss:
    an :class:`Evaluation`. A language model reads the documents as it was trained on them:
    a :class:`LanguageEvaluation` (loss, perplexity, bits per character or masked accuracy);
    ``decoding`` and ``batch_size`` do not apply to it. ``model``, an ensemble with
    ``ckpt``'s model and tokenizers (``tformer.decoding.ensemble``), translates and is scored
    in ``ckpt``'s place.

    Raises:
        ConfigError: ``examples`` are not what the family reads (pairs or documents), or an
            ensemble of language models.
    """
    family = family_of(ckpt)
    if family.reads == "pairs":
        return evaluate_pairs(
            ckpt, _pairs(family, examples), split=split, decoding=decoding,
            batch_size=batch_size, model=model,
        )  # fmt: skip
    if model is not None and model is not ckpt.model:
        raise ConfigError(
            f"a {family.name} model is measured by its own loss on documents; an ensemble "
            "is evaluated on translation pairs"
        )
    return evaluate_language(ckpt, _documents(family, examples), split=split)


def score(
    ckpt: Checkpoint,
    reference: str,
    *,
    source: str | None = None,
    label_smoothing: float | None = None,
) -> PairScore:
    """What ``ckpt`` makes of every position of ``reference`` under teacher forcing.

    A translation model reads ``source`` and predicts the reference; a decoder-only model
    predicts each next token of the reference as one document; an encoder-only model predicts
    each token masked in turn (pseudo-log-likelihood). ``label_smoothing`` (default: the
    checkpoint's training value) sets the smoothed loss shown beside the plain one.

    Raises:
        ConfigError: a source given to a language model, or none to a translation model.
        DataError: the text cannot be scored as given (see :func:`score_pair`).
    """
    family = family_of(ckpt)
    smoothing = (
        ckpt.train_config.label_smoothing if label_smoothing is None else label_smoothing
    )
    if family.reads == "pairs":
        if source is None:
            raise ConfigError(f"a {family.name} model scores a reference against its source")
        return score_pair(
            ckpt.model, ckpt.tokenizers, source, reference, label_smoothing=smoothing
        )
    if source is not None:
        raise ConfigError(f"a {family.name} model scores one text, without a source")
    scorer = score_masked_text if ckpt.model.fills_masks else score_text
    return scorer(ckpt.model, ckpt.tokenizers, reference, label_smoothing=smoothing)


def check_ablation_metric(family: Family, metric: str) -> None:
    """Refuse a metric the family cannot be ablated by: a language model has only its loss."""
    if family.reads != "pairs" and metric != "loss":
        raise ConfigError(
            f"--metric {metric}: a language model ({family.name}) is ablated by its loss; "
            "leave out --metric"
        )


def ablate(
    ckpt: Checkpoint,
    examples: Examples,
    *,
    metric: str = "loss",
    prune_step: float | None = None,
    decoding: DecodingConfig | None = None,
    batch_size: int = 64,
    on_head: Callable[[HeadName], None] | None = None,
) -> Ablation:
    """Rank every attention head of ``ckpt`` by what masking it alone costs on ``examples``.

    A translation model is measured by its teacher-forced loss or, with ``metric="bleu"``, by
    greedy translation's BLEU (``decoding``, ``batch_size``); a language model by its loss on
    the documents, read as :func:`evaluate` reads them. ``prune_step`` also prunes the least
    important heads greedily, that share of all heads at a time.

    Raises:
        ConfigError: ``examples`` are not what the family reads, or a language model is asked
            for another metric than its loss.
    """
    family = family_of(ckpt)
    if family.reads == "pairs":
        return ablate_pairs(
            ckpt.model, ckpt.tokenizers, _pairs(family, examples), metric=metric,
            prune_step=prune_step, decoding=decoding, batch_size=batch_size, on_head=on_head,
        )  # fmt: skip
    check_ablation_metric(family, metric)
    return ablate_language(
        ckpt, _documents(family, examples), prune_step=prune_step, on_head=on_head
    )
