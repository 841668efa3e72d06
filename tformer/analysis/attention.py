"""Attention maps with token labels, from the same forward pass that training uses.

Shape legend: L layers, H heads, S source tokens, T decoder positions (BOS + target),
R / C the rows / columns of one map (queries / keys).
Rows of decoder and cross maps are decoder positions, labelled by what each predicts: row i
reads BOS + target[:i] and predicts target token i (the last row predicts EOS). Columns of
decoder maps are the tokens read (BOS + target).

``inspect_attention`` runs the pass and returns an ``AttentionResult``, whose ``selection``
picks the maps a user asked for. ``head_stats`` summarises each head and names its dominant
pattern; ``attention_files`` writes and reads a selection as JSON or NumPy ``.npz``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch
from torch import Tensor

from tformer.analysis.language import as_read, encode_with_masks_of
from tformer.checkpoint.store import Checkpoint, Tokenizers
from tformer.config import BOS_ID, EOS, EOS_ID, article
from tformer.data.display import display_token, display_tokens
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.text import translate
from tformer.errors import ConfigError
from tformer.model import TransformerBase, model_class
from tformer.model.transformer import source_as_read

Kind = Literal["encoder", "decoder", "cross"]
KINDS: tuple[str, ...] = ("encoder", "decoder", "cross")
Layer = int | Literal["all"]
Head = int | Literal["all", "mean"]

FILE_FORMAT = "tformer-attention"
FILE_VERSION = 1


def default_kind(family: type[TransformerBase]) -> str:
    """The maps shown unless --kind says: cross-attention where the model has it, else the
    one kind it has (a decoder-only model's causal, an encoder-only one's bidirectional)."""
    kinds = family.attention_kinds
    return "cross" if "cross" in kinds else kinds[0]


def check_kind(kind: str, family: type[TransformerBase]) -> None:
    """Refuse ``--kind`` maps that a model of ``family`` does not have, in one line."""
    if kind not in family.attention_kinds:
        name = family.family
        raise ConfigError(
            f"--kind {kind}: {article(name)} {name} model has no {kind} attention; use --kind "
            f"{' or '.join(family.attention_kinds)}"
        )


@dataclass(frozen=True)
class AttentionSelection:
    """Some of the maps of one (source, target) pair, labelled: what a file export holds.

    Attributes:
        weights: the maps; ``dims`` names their axes, e.g. ("row", "column") for one head of
            one layer, ("layer", "head", "row", "column") for every head of every layer.
        layer / head: what was selected: a number, "all", or for heads also "mean".
        rows / columns: the token labels of the last two axes.
        checkpoint: where the model came from (None when unknown).
    """

    kind: str
    layer: Layer
    head: Head
    dims: tuple[str, ...]
    weights: Tensor
    rows: list[str]
    columns: list[str]
    source: str
    target: str
    generated: bool
    checkpoint: str | None = None

    def metadata(self) -> dict[str, Any]:
        """Everything but the weights and labels, JSON-ready."""
        return {
            "format": FILE_FORMAT,
            "version": FILE_VERSION,
            "checkpoint": self.checkpoint,
            "source": self.source,
            "target": self.target,
            "target_generated": self.generated,
            "kind": self.kind,
            "layer": self.layer,
            "head": self.head,
            "dims": list(self.dims),
            "shape": list(self.weights.shape),
        }


@dataclass(frozen=True)
class AttentionResult:
    """Every attention map of one (source, target) pair.

    Attributes:
        encoder: (L, H, S, S) source self-attention.
        decoder: (L, H, T, T) causal self-attention over BOS + target.
        cross: (L, H, T, S) decoder positions over source tokens.
        source_tokens / target_tokens: labels for S and T, as tables show them
            (:func:`tformer.data.display.display_token`).
        target_text: the target the maps were computed for (given or generated).
        eos_token: how the target's <eos> is shown (an import's own name, e.g. "</s>").
    """

    encoder: Tensor
    decoder: Tensor
    cross: Tensor
    source_tokens: list[str]
    target_tokens: list[str]
    source_text: str
    target_text: str
    generated: bool
    arch: str = "encoder-decoder"
    eos_token: str = EOS

    def maps(self, kind: str) -> Tensor:
        if kind not in KINDS:
            raise ConfigError(f"--kind {kind!r} must be one of {', '.join(KINDS)}")
        check_kind(kind, model_class(self.arch))
        return getattr(self, kind)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of maps the model has (its family's ``attention_kinds``)."""
        return model_class(self.arch).attention_kinds

    @property
    def predicted_tokens(self) -> list[str]:
        """What each decoder position predicts: the next token it reads, then EOS (the labels
        of the rows of decoder and cross maps)."""
        return [*self.target_tokens[1:], self.eos_token] if self.target_tokens else []

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of a kind's maps: a decoder row is labelled by the
        token it predicts (the row that produced "Zwei" reads "Zwei"), a column by the token
        read there."""
        if kind == "encoder":
            return self.source_tokens, self.source_tokens
        if kind == "decoder":
            return self.predicted_tokens, self.target_tokens
        return self.predicted_tokens, self.source_tokens

    def select(self, kind: str, layer: Layer, head: Head) -> Tensor:
        """The maps of ``layer`` (a number or "all") and ``head`` (a number, "all" or "mean").

        Negative numbers count from the end, as in Python. Returns (R, C) for one layer and
        one head or the mean, (H, R, C) for all heads of one layer, and (L, ...) for all layers.
        """
        maps = self.maps(kind)
        n_layers, n_heads = maps.shape[0], maps.shape[1]
        if layer != "all" and not _in_range(layer, n_layers):
            raise ConfigError(
                f"--layer {layer} is out of range: the {kind} attention has {n_layers} layers "
                f"(0..{n_layers - 1}, -1..-{n_layers}, or 'all')"
            )
        if head not in ("all", "mean") and not _in_range(head, n_heads):
            raise ConfigError(
                f"--head {head} is out of range: {n_heads} heads (0..{n_heads - 1}, "
                f"-1..-{n_heads}), 'all' or 'mean'"
            )
        chosen = maps if layer == "all" else maps[layer]  # (L, H, R, C) or (H, R, C)
        head_axis = 1 if layer == "all" else 0
        if head == "all":
            return chosen
        if head == "mean":
            return chosen.mean(dim=head_axis)
        return chosen.select(head_axis, head)

    def selection(
        self, kind: str, layer: Layer, head: Head, *, checkpoint: str | None = None
    ) -> AttentionSelection:
        """``select`` plus labels and provenance, with negative numbers made absolute."""
        weights = self.select(kind, layer, head)
        n_layers, n_heads = self.maps(kind).shape[:2]
        dims = (
            *(("layer",) if layer == "all" else ()),
            *(("head",) if head == "all" else ()),
            "row",
            "column",
        )
        rows, columns = self.labels(kind)
        return AttentionSelection(
            kind=kind,
            layer=layer if layer == "all" else layer % n_layers,
            head=head if isinstance(head, str) else head % n_heads,
            dims=dims,
            weights=weights.contiguous(),
            rows=list(rows),
            columns=list(columns),
            source=self.source_text,
            target=self.target_text,
            generated=self.generated,
            checkpoint=checkpoint,
        )


def _in_range(index: object, size: int) -> bool:
    return isinstance(index, int) and not isinstance(index, bool) and -size <= index < size


@overload
def inspect_attention(
    checkpoint: Checkpoint,
    source: str,
    target: str | None = None,
    decoding: DecodingConfig | None = None,
) -> AttentionResult: ...


@overload
def inspect_attention(
    checkpoint: TransformerBase,
    source: Tokenizers,
    target: str,
    decoding: str | None = None,
    legacy_decoding: DecodingConfig | None = None,
) -> AttentionResult: ...


def inspect_attention(
    checkpoint: Checkpoint | TransformerBase,
    source: str | Tokenizers,
    target: str | None = None,
    decoding: DecodingConfig | str | None = None,
    legacy_decoding: DecodingConfig | None = None,
) -> AttentionResult:
    """Attention maps for ``source`` with ``target`` teacher-forced, or the model's own output.

    Called like ``generate``: ``inspect_attention(load_checkpoint(run), "6 Mar. 2025")``.
    The older form ``inspect_attention(model, tokenizers, source, target, decoding)`` still
    works and warns (DeprecationWarning); ``attention_maps`` takes a model and tokenizers.

    Args:
        checkpoint: a loaded checkpoint (``load_checkpoint``).
        target: the target text; None decodes one with ``decoding`` (greedy by default).
    """
    if isinstance(checkpoint, Checkpoint):
        if not isinstance(source, str) or isinstance(decoding, str):
            raise TypeError("inspect_attention(checkpoint, source, target=None, decoding=None)")
        return attention_maps(
            checkpoint.model, checkpoint.tokenizers, source, target, decoding
        )
    warnings.warn(
        "inspect_attention(model, tokenizers, source, ...) is deprecated; pass the checkpoint "
        "as generate() takes it: inspect_attention(ckpt, source, target=None, decoding=None)",
        DeprecationWarning,
        stacklevel=2,
    )
    if not isinstance(source, Tokenizers) or not isinstance(target, str):
        raise TypeError("inspect_attention(model, tokenizers, source, target, decoding)")
    given = decoding if isinstance(decoding, str) else None
    return attention_maps(checkpoint, source, target, given, legacy_decoding)


@torch.no_grad()
def attention_maps(
    model: TransformerBase,
    tokenizers: Tokenizers,
    source: str,
    target: str | None = None,
    decoding: DecodingConfig | None = None,
) -> AttentionResult:
    """``inspect_attention`` for a model and its tokenizers (what a server holds).

    The model runs in eval mode (no dropout) and is put back in the mode it was in.
    """
    was_training = model.training
    model.eval()
    try:
        if not model.generates:
            return _inspect_encoder(model, tokenizers, source)
        if model.continues_prompts:
            return _inspect_decoder(model, tokenizers, source, target, decoding)
        return _inspect(model, tokenizers, source, target, decoding)
    finally:
        model.train(was_training)


def _stack(maps: list[Tensor]) -> Tensor:
    """One row's maps of every layer as (L, H, R, C); (0, 0, 0, 0) when the model has none."""
    if not maps:
        return torch.zeros(0, 0, 0, 0)
    return torch.stack([m[0] for m in maps]).float().cpu()


def _inspect_encoder(model: TransformerBase, tokenizers: Tokenizers, text: str) -> AttentionResult:
    """An encoder-only model's self-attention over ``text`` (whose ``<mask>`` are masks)."""
    device = next(model.parameters()).device
    ids = encode_with_masks_of(tokenizers.source, text)
    ids = as_read(model.config, ids)[: model.config.max_len] or [EOS_ID]
    out = model(torch.tensor([ids], device=device), None, need_weights=True)
    if model.config.bos_first:  # the maps hold the <bos> the model read first
        ids = [BOS_ID, *ids]
    assert out.attentions is not None
    empty = torch.zeros(0, 0, 0, 0)
    return AttentionResult(
        encoder=_stack(out.attentions.encoder),
        decoder=empty,
        cross=empty,
        source_tokens=display_tokens(tokenizers.source, ids),
        target_tokens=[],
        source_text=text,
        target_text="",
        generated=False,
        arch=model.family,
    )


def _inspect_decoder(
    model: TransformerBase,
    tokenizers: Tokenizers,
    prompt: str,
    target: str | None,
    decoding: DecodingConfig | None,
) -> AttentionResult:
    """A decoder-only model's causal self-attention over <bos> + prompt + continuation (the
    given ``target``, or the model's own)."""
    device = next(model.parameters()).device
    generated = target is None
    tgt_ids, target = _target(model, tokenizers, prompt, target, decoding)
    sequence = [BOS_ID, *tokenizers.source.encode(prompt), *tgt_ids][: model.config.max_len]
    ids = torch.tensor([sequence], device=device)
    out = model(ids, ids, need_weights=True)
    assert out.attentions is not None
    empty = torch.zeros(0, 0, 0, 0)
    return AttentionResult(
        encoder=empty,
        decoder=_stack(out.attentions.decoder),
        cross=empty,
        source_tokens=[],
        target_tokens=display_tokens(tokenizers.target, sequence),
        source_text=prompt,
        target_text=target,
        generated=generated,
        arch=model.family,
        eos_token=display_token(tokenizers.target, EOS_ID),
    )


def _target(
    model: TransformerBase,
    tokenizers: Tokenizers,
    text: str,
    target: str | None,
    decoding: DecodingConfig | None,
) -> tuple[list[int], str]:
    """The ids and text of ``target``, or of the model's own output for ``text``."""
    if target is not None:
        return tokenizers.target.encode(target), target
    output = translate(model, tokenizers, [text], decoding)[0][0]
    return output.hypothesis.ids, output.text


def _inspect(
    model: TransformerBase,
    tokenizers: Tokenizers,
    source: str,
    target: str | None,
    decoding: DecodingConfig | None,
) -> AttentionResult:
    device = next(model.parameters()).device
    src_ids = tokenizers.source.encode(source) or [EOS_ID]
    generated = target is None
    tgt_ids, target = _target(model, tokenizers, source, target, decoding)
    limit = model.config.max_len
    src_ids, tgt_ids = src_ids[:limit], tgt_ids[: limit - 1]
    tgt_in = [BOS_ID, *tgt_ids]
    src = torch.tensor([src_ids], device=device)
    out = model(src, torch.tensor([tgt_in], device=device), need_weights=True)
    assert out.attentions is not None

    def stack(maps: list[Tensor]) -> Tensor:
        return torch.stack([m[0] for m in maps]).float().cpu()  # (L, H, R, C)

    return AttentionResult(
        encoder=stack(out.attentions.encoder),
        decoder=stack(out.attentions.decoder),
        cross=stack(out.attentions.cross),
        source_tokens=display_tokens(tokenizers.source, source_as_read(src_ids, model.config)),
        target_tokens=display_tokens(tokenizers.target, tgt_in),
        source_text=source,
        target_text=target,
        generated=generated,
        eos_token=display_token(tokenizers.target, EOS_ID),
    )
