"""One decoder step over an encoded source batch, with or without the key/value cache.

Shape legend: R rows being decoded (sources x samples or beams), V target vocabulary (or the
C candidate ids of a lexical shortlist, ``tformer.decoding.shortlist``).

A model prepared by ``tformer.fast.accelerate`` takes its lean cached step, on a CUDA GPU
replayed as a CUDA graph (``tformer.fast.graphs``); any other model runs the paper's
``decode`` with the cache, the same result in more operations.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from tformer.decoding.settings import DecodingConfig, Hypothesis
from tformer.fast.graphs import GraphStepper, graphs_fit
from tformer.fast.step import FastTransformer, LeanStep, step_mask
from tformer.model import TransformerBase
from tformer.model.transformer import EncoderOutput

if TYPE_CHECKING:  # the ensemble steps its members through make_stepper
    from tformer.decoding.ensemble import Decodable


def select_rows(encoded: EncoderOutput, index: Tensor) -> EncoderOutput:
    return EncoderOutput(encoded.memory.index_select(0, index), encoded.mask.index_select(0, index))


class CachedStepper:
    """Feeds one new token per row; everything earlier comes from the key/value cache.

    The source is encoded once by the caller; the cross-attention keys/values are projected
    on the first step and kept; each layer's self-attention keys/values grow by one a step.
    """

    def __init__(
        self,
        model: TransformerBase,
        encoded: EncoderOutput,
        prompts: Tensor | None = None,
        vocab: Tensor | None = None,
    ) -> None:
        self.model = model
        self.encoded = encoded
        self.cache = model.new_cache()
        self.prompts = prompts  # decoder-only: (R, P) ids read after <bos> on the first step
        self._step_mask: Tensor | None = None
        self._step_mask_of: Tensor | None = None  # the source mask _step_mask was read from
        self.vocab = vocab  # (C,) a shortlist's ids: tokens and logits index these
        self._project = None if vocab is None else model.projection_onto(vocab)

    def step(self, tokens: Tensor) -> Tensor:
        """(R,) newest tokens -> (R, V) float32 logits for the next one (with a shortlist,
        tokens and logits are positions in its ids)."""
        model = self.model
        if self.vocab is not None:
            tokens = self.vocab[tokens]
        if self.prompts is not None:
            # A language model continues its prompt: <bos> and the prompt in one pass.
            first = torch.cat([tokens[:, None], self.prompts], dim=1)
            self.prompts = None
            logits = model.decode(first, self.encoded, cache=self.cache).logits
        elif isinstance(model, LeanStep) and not model.training:
            logits = model.step(
                tokens[:, None], self.encoded.memory, self._mask(), self.cache, self._project
            )
            return logits[:, -1].float()  # projected onto the shortlist already
        else:
            logits = model.decode(tokens[:, None], self.encoded, cache=self.cache).logits
        return _kept(logits[:, -1], self.vocab).float()

    def _mask(self) -> Tensor | None:
        """The source mask for lean steps, read back once per source batch (see step_mask)."""
        if self._step_mask_of is not self.encoded.mask:
            self._step_mask_of = self.encoded.mask
            self._step_mask = step_mask(self.encoded.mask)
        return self._step_mask

    def reorder(self, index: Tensor, *, same_source: bool = False) -> None:
        """Keep rows ``index`` in that order (beams reordered, finished rows dropped).

        ``same_source``: every row ``index[i]`` decodes the same source as row ``i`` (beams
        reshuffled inside their source), so the source-side tensors stay as they are and
        only the self-attention caches move.
        """
        if same_source:
            for layer in self.cache.layers:
                layer.self_attn.reorder(index)
            return
        self.cache.reorder(index)
        self.encoded = select_rows(self.encoded, index)


class RecomputeStepper:
    """The cache-free reference: re-runs the decoder over the whole prefix at every step."""

    def __init__(
        self,
        model: TransformerBase,
        encoded: EncoderOutput,
        prompts: Tensor | None = None,
        vocab: Tensor | None = None,
    ) -> None:
        self.model = model
        self.encoded = encoded
        self.prompts = prompts
        self.vocab = vocab
        self.prefix: Tensor | None = None  # (R, t + 1) with <bos> (and a prompt)

    def step(self, tokens: Tensor) -> Tensor:
        new = (tokens if self.vocab is None else self.vocab[tokens])[:, None]
        if self.prefix is None and self.prompts is not None:
            new = torch.cat([new, self.prompts], dim=1)
        self.prefix = new if self.prefix is None else torch.cat([self.prefix, new], dim=1)
        logits = self.model.decode(self.prefix, self.encoded).logits[:, -1]
        return _kept(logits, self.vocab).float()

    def reorder(self, index: Tensor, *, same_source: bool = False) -> None:
        assert self.prefix is not None
        self.prefix = self.prefix.index_select(0, index)
        if not same_source:
            self.encoded = select_rows(self.encoded, index)


def _kept(logits: Tensor, vocab: Tensor | None) -> Tensor:
    """(R, V) logits -> (R, C) those of a shortlist's ids (all of them without one)."""
    return logits if vocab is None else logits.index_select(-1, vocab)


class Stepper(Protocol):
    """What the decoding loops step: the steppers above, ``GraphStepper`` and the
    ensemble's."""

    def step(self, tokens: Tensor) -> Tensor: ...

    def reorder(self, index: Tensor, *, same_source: bool = False) -> None: ...


def make_stepper(
    model: Decodable, src: Tensor, use_cache: bool = True, vocab: Tensor | None = None
) -> Stepper:
    """Encode ``src`` (B, S) once and return the object that runs decoder steps over it.

    For a decoder-only model ``src`` holds the prompts, all of one length (no padding).
    An ensemble (``tformer.decoding.ensemble``) gives each member its own stepper. ``vocab``:
    the (C,) candidate ids of a shortlist (:func:`candidates`) the steps are over."""
    # Imported here: the ensemble module builds its members' steppers with this function.
    from tformer.decoding.ensemble import Ensemble

    if isinstance(model, Ensemble):
        return model.stepper(src, use_cache, vocab)
    encoded = model.encode(src)
    prompts = src if model.continues_prompts else None
    if use_cache and vocab is None and graphs_fit(model, encoded, prompts):
        assert isinstance(model, FastTransformer)
        return GraphStepper(model, encoded)
    kind = CachedStepper if use_cache else RecomputeStepper
    return kind(model, encoded, prompts, vocab)


def candidates(model: Decodable, src: Tensor) -> Tensor | None:
    """The (C,) target ids a model with a shortlist decodes the (B, S) sources ``src`` over
    (the loops see positions in them); None for the whole vocabulary."""
    from tformer.decoding.ensemble import Ensemble

    return model.candidates(src) if isinstance(model, Ensemble) else None


def token_ids(hyps: list[list[Hypothesis]], vocab: Tensor | None) -> list[list[Hypothesis]]:
    """Hypotheses of positions in a shortlist's candidates ``vocab`` as token ids."""
    if vocab is None:
        return hyps
    ids = vocab.tolist()
    return [[replace(h, ids=[ids[i] for i in h.ids]) for h in row] for row in hyps]


def step_limit(model: Decodable, config: DecodingConfig, src: Tensor | None = None) -> int:
    """Decoder steps at most: --max-new-tokens (the <eos> counts), within the model's positions
    (a decoder-only model's prompt, after <bos>, takes some of them)."""
    room = model.config.max_len
    if model.continues_prompts and src is not None:
        room -= src.size(1)
    return max(min(config.max_new_tokens, room), 1)
