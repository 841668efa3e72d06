"""Ensemble decoding: several models that share a target vocabulary, decoded as one.

Shape legend: B source rows, R rows being decoded, T target length, V target vocabulary.

At each step every member takes the step with its own stepper (its own key/value cache and
encoded source) and the ensemble's scores are the weighted mean of the members'
log-probabilities, log p(y) = sum_m w_m log p_m(y) with the weights summing to 1. Greedy
decoding, sampling and beam search read these scores as they read one model's logits, so
their softmax is the normalised weighted geometric mean of the members' distributions (as
Marian and OpenNMT average log-probabilities). Beam search's row reordering reorders every
member's cache.

One model with a lexical shortlist (``tformer.decoding.shortlist``) decodes as an ensemble of
one: each batch's candidates are read from the first member's source ids, every member
projects onto them, and the decoding loops see positions in the candidates, which they map
back to token ids at the end (``steppers.token_ids``).

The members may read the source with different tokenizers: the decoding loop holds the
first member's source ids, and another member reads that source detokenised and encoded with
its own tokenizer (ids its tokenizer shares with the first are passed as they are).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from functools import partial

from torch import Tensor, nn

from tformer.checkpoint.store import Checkpoint
from tformer.config import EOS_ID, PAD_ID, ModelConfig
from tformer.config.families import family_record
from tformer.data.batching import pad
from tformer.data.tokenizer import Tokenizer
from tformer.decoding.shortlist import Shortlist
from tformer.decoding.steppers import Stepper, make_stepper
from tformer.errors import CheckpointError, ConfigError
from tformer.fast.accelerate import accelerate
from tformer.fast.int8 import is_quantized
from tformer.model import TransformerBase
from tformer.model.transformer import Seq2SeqOutput

# A member's source ids from the first member's: None when both read the same vocabulary.
SourceMap = Callable[[list[int]], list[int]] | None


def mean_log_probs(logits: Iterable[Tensor], weights: Sequence[float]) -> Tensor:
    """sum_m w_m log_softmax(logits_m): the members' weighted mean log-probabilities."""
    total: Tensor | None = None
    for member_logits, weight in zip(logits, weights, strict=True):
        logp = member_logits.log_softmax(dim=-1) * weight
        total = logp if total is None else total.add_(logp)
    assert total is not None
    return total


class EnsembleStepper:
    """The members' steppers stepped together; ``step`` gives their mean log-probabilities."""

    def __init__(self, steppers: Sequence[Stepper], weights: Sequence[float]) -> None:
        self.steppers = list(steppers)
        self.weights = list(weights)

    def step(self, tokens: Tensor) -> Tensor:
        """(R,) newest tokens -> (R, V) weighted mean of the members' log-probabilities (one
        member's logits as they are: the same softmax)."""
        if len(self.steppers) == 1:
            return self.steppers[0].step(tokens)
        return mean_log_probs((s.step(tokens) for s in self.steppers), self.weights)

    def reorder(self, index: Tensor, *, same_source: bool = False) -> None:
        for stepper in self.steppers:
            stepper.reorder(index, same_source=same_source)


class Ensemble(nn.Module):
    """Models that share one target vocabulary, decoded together (see the module docstring).

    Every function of ``tformer.decoding`` that takes a model takes an ``Ensemble`` too.
    ``config`` is the first member's with the smallest ``max_len`` of all: every member's
    decoder holds every step, and the source is read up to that length.
    """

    def __init__(
        self,
        members: Sequence[TransformerBase],
        weights: Sequence[float] | None = None,
        source_maps: Sequence[SourceMap] | None = None,
        shortlist: Shortlist | None = None,
    ) -> None:
        super().__init__()
        if not members:
            raise ConfigError("an ensemble needs at least one model")
        weights = [1.0] * len(members) if weights is None else list(weights)
        if len(weights) != len(members) or any(not w > 0 for w in weights):
            raise ConfigError(
                f"ensemble weights {weights} must be one positive number per member "
                f"({len(members)})"
            )
        self.members = nn.ModuleList(members)
        self.weights = [w / sum(weights) for w in weights]
        self.source_maps = list(source_maps or [None] * len(members))
        self.shortlist = shortlist
        first = members[0]
        self.continues_prompts = first.continues_prompts
        max_len = min(m.config.max_len for m in members)
        self.config: ModelConfig = dataclasses.replace(first.config, max_len=max_len)

    def models(self) -> list[TransformerBase]:
        return [m for m in self.members if isinstance(m, TransformerBase)]

    def member_sources(self, src: Tensor) -> list[Tensor]:
        """The (B, S_m) source ids each member reads, from the first member's (B, S)."""
        sources = []
        for model, source_map in zip(self.models(), self.source_maps, strict=True):
            if source_map is None:
                sources.append(src[:, : model.config.max_len])
                continue
            rows = [[t for t in row if t != PAD_ID] for row in src.tolist()]
            mapped = [source_map(ids)[: model.config.max_len] for ids in rows]
            sources.append(pad(mapped).to(src.device))
        return sources

    def candidates(self, src: Tensor) -> Tensor | None:
        """(C,) the target ids the shortlist allows for the (B, S) sources ``src``; None
        without a shortlist (every id)."""
        return None if self.shortlist is None else self.shortlist.candidates(src)

    def stepper(
        self, src: Tensor, use_cache: bool = True, vocab: Tensor | None = None
    ) -> EnsembleStepper:
        """Each member's stepper over its own reading of ``src`` (see ``make_stepper``), over
        the candidate ids ``vocab`` (:meth:`candidates`) when given."""
        steppers = [
            make_stepper(model, member_src, use_cache, vocab)
            for model, member_src in zip(self.models(), self.member_sources(src), strict=True)
        ]
        return EnsembleStepper(steppers, self.weights)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Seq2SeqOutput:
        """Teacher forcing: (B, T, V) mean log-probabilities of the members, as logits."""
        pairs = zip(self.models(), self.member_sources(src), strict=True)
        logits = (model(member_src, tgt_in).logits.float() for model, member_src in pairs)
        return Seq2SeqOutput(mean_log_probs(logits, self.weights))


# What the decoding functions take: one model, or an ensemble of them.
Decodable = TransformerBase | Ensemble


def members_of(model: Decodable) -> list[TransformerBase]:
    """The models ``model`` decodes with: its members, or itself."""
    return model.models() if isinstance(model, Ensemble) else [model]


def accelerate_members(model: Decodable) -> None:
    """Give every model ``model`` decodes with tformer's speed-ups (in place), keeping a model
    quantised to int8 as it is: the one preparation of each decoding entry point."""
    for member in members_of(model):
        if not is_quantized(member):
            accelerate(member)


def _reencode(reader: Tokenizer, writer: Tokenizer, ids: list[int]) -> list[int]:
    return writer.encode(reader.decode(ids)) or [EOS_ID]  # the encoder needs one position


def _vocabulary_difference(ours: Checkpoint, theirs: Checkpoint) -> str:
    """Where two checkpoints' target vocabularies first differ, in a few words."""
    a, b = ours.tokenizers.target, theirs.tokenizers.target
    if a.vocab_size != b.vocab_size:
        return f"{ours.path} has {a.vocab_size} tokens, {theirs.path} {b.vocab_size}"
    ids_a = {i: t for t, i in a.inner.get_vocab().items()}
    ids_b = {i: t for t, i in b.inner.get_vocab().items()}
    first = min(i for i in ids_a if ids_a[i] != ids_b.get(i))
    return f"id {first} is {ids_a[first]!r} in {ours.path}, {ids_b.get(first)!r} in {theirs.path}"


def check_members(checkpoints: Sequence[Checkpoint]) -> None:
    """Refuse, in one line naming both checkpoints, members that cannot decode together:
    another family, a model that does not generate, or another target vocabulary."""
    first = checkpoints[0]
    family = family_record(first.model_config.arch).name
    for other in checkpoints:
        other_family = family_record(other.model_config.arch).name
        if not other.model.generates:
            raise ConfigError(
                f"ensemble member {other.path} is {other_family}: it does not generate, so it "
                "cannot join an ensemble"
            )
        if other_family != family:
            raise ConfigError(
                f"ensemble members must be of one family: {first.path} is {family}, "
                f"{other.path} is {other_family}"
            )
        if not first.tokenizers.target.same_vocabulary(other.tokenizers.target):
            raise CheckpointError(
                "ensemble members must share one target vocabulary: "
                + _vocabulary_difference(other, first)
            )


def ensemble_of(
    checkpoints: Sequence[Checkpoint],
    weights: Sequence[float] | None = None,
    shortlist: tuple[Shortlist, str] | None = None,
) -> Ensemble:
    """The loaded ``checkpoints`` as one ensemble, after :func:`check_members`, decoding over
    ``shortlist``'s candidates (the shortlist and its file) when given.

    Raises:
        ConfigError: a member of another family, or one that does not generate; a shortlist
            for another vocabulary, or for a model that reads no source.
        CheckpointError: a member with another target vocabulary.
    """
    check_members(checkpoints)
    if shortlist is not None:
        first = checkpoints[0]
        if not first.model.reads_source:
            raise ConfigError(
                f"--shortlist {shortlist[1]}: {first.path} reads no source, and a shortlist "
                "holds the target tokens of source tokens; drop --shortlist"
            )
        shortlist[0].check_fits(first.tokenizers.source, first.tokenizers.target, shortlist[1])
    reader = checkpoints[0].tokenizers.source
    maps: list[SourceMap] = []
    for ckpt in checkpoints:
        writer = ckpt.tokenizers.source
        maps.append(None if reader.same_vocabulary(writer) else partial(_reencode, reader, writer))
    chosen = None if shortlist is None else shortlist[0]
    return Ensemble([c.model for c in checkpoints], weights, maps, chosen)
