"""What each model family is, once, for every part of tformer around the model.

The model's classes (``tformer.model.families``) say what a family computes; this record says
what the rest of the tool needs to know of it before any model exists: what it reads (pairs or
documents), how it is trained, which ``ModelConfig`` fields it reads and which only it may
set, its default recipe, the special tokens its tokenizer adds, and what it is for. Data,
training, the CLI, analysis and ``tformer info`` read it here instead of testing the family's
name, so a new family is one record (and one model class).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from tformer.config.tokens import MASK

Objective = Literal["teacher-forcing", "causal", "masked"]


@dataclass(frozen=True)
class Family:
    """One model family, as everything outside the model sees it."""

    name: str  # the --arch value
    reads: Literal["pairs", "documents"]  # what its data is: (source, target) pairs or texts
    objective: Objective  # how its batches are made (tformer.data.lm.objective_for)
    stacks: tuple[str, ...]  # "encoder", "decoder": the layer counts it reads
    default_recipe: str  # the recipe for the bundled data when none is named
    tokenizer_specials: tuple[str, ...]  # special tokens after <pad> <bos> <eos> <unk>
    purpose: str  # what a user does with it, named when a command wants another family
    own_fields: tuple[str, ...]  # ModelConfig fields only this family may set
    # TrainConfig values under every recipe, config file and flag: how this family trains
    # when nothing says otherwise (the paper's defaults are TrainConfig's own).
    train_defaults: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def caches(self) -> bool:
        """Whether it decodes with a key/value cache (it has a decoder)."""
        return "decoder" in self.stacks

    @property
    def shared_vocabulary(self) -> bool:
        """One stack reads and writes one vocabulary; the encoder-decoder may have two."""
        return len(self.stacks) == 1


# A language model is scored on its perplexity and its completions: GPT-2 and BERT trained
# without label smoothing, and the paper's 0.1 cost a small decoder-only model exact completions
# on a task of its own (docs/families.md has the measurement).
LANGUAGE_MODEL_TRAINING = MappingProxyType({"label_smoothing": 0.0})

FAMILY_RECORDS: dict[str, Family] = {
    family.name: family
    for family in (
        Family(
            name="encoder-decoder",
            reads="pairs",
            objective="teacher-forcing",
            stacks=("encoder", "decoder"),
            default_recipe="dates",
            tokenizer_specials=(),
            purpose="translate with tformer generate",
            own_fields=("source_eos",),
        ),
        Family(
            name="decoder-only",
            reads="documents",
            objective="causal",
            stacks=("decoder",),
            default_recipe="dates-text",
            tokenizer_specials=(),
            purpose="continue text with tformer generate",
            own_fields=("document_bos",),
            train_defaults=LANGUAGE_MODEL_TRAINING,
        ),
        Family(
            name="encoder-only",
            reads="documents",
            objective="masked",
            stacks=("encoder",),
            default_recipe="dates-text",
            tokenizer_specials=(MASK,),
            purpose="fill in <mask> tokens with tformer fill-mask",
            own_fields=("mlm_head", "bos_first"),
            train_defaults=LANGUAGE_MODEL_TRAINING,
        ),
    )
}


def family_record(name: str) -> Family:
    """The record of family ``name`` (an ``--arch`` value, checked by ``ModelConfig``).

    Raises:
        KeyError: ``name`` is no family.
    """
    return FAMILY_RECORDS[name]
