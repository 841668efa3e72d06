"""Naming attention heads and masking them (Michel et al., 2019).

A head is named ``<part>.<layer>.<head>``, 0-based: ``enc`` for the encoder's self-attention,
``dec`` for the decoder's causal self-attention and ``cross`` for its cross-attention, so
``cross.1.3`` is head 3 of the second decoder layer's cross-attention. ``*`` in place of the
head names every head of that layer. Masking sets the gate ξ of each named head to 0 (see
:class:`tformer.model.attention.MultiHeadAttention`): its output is zeroed before W^O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from tformer.config import article
from tformer.errors import ConfigError
from tformer.model.attention import MultiHeadAttention
from tformer.model.transformer import TransformerBase

PARTS: dict[str, str] = {
    "enc": "encoder self-attention",
    "dec": "decoder self-attention",
    "cross": "cross-attention",
}
KIND_PARTS = {"encoder": "enc", "decoder": "dec", "cross": "cross"}  # attention kind -> part


@dataclass(frozen=True)
class HeadName:
    """One attention head: its part (``enc``, ``dec``, ``cross``), layer and head, 0-based."""

    part: str
    layer: int
    head: int

    def __str__(self) -> str:
        return f"{self.part}.{self.layer}.{self.head}"


def attention_layers(model: TransformerBase) -> dict[str, list[MultiHeadAttention]]:
    """The model's attention sub-layers by part, in layer order (only the parts it has: a
    decoder-only model ``dec``, an encoder-only one ``enc``)."""
    return {KIND_PARTS[kind]: layers for kind, layers in model.attention_parts().items()}


def all_heads(model: TransformerBase) -> list[HeadName]:
    """Every head of the model, part by part, layer by layer."""
    return [
        HeadName(part, i, h)
        for part, layers in attention_layers(model).items()
        for i, layer in enumerate(layers)
        for h in range(layer.n_heads)
    ]


def parse_heads(text: str, model: TransformerBase, option: str = "--mask-heads") -> list[HeadName]:
    """``"enc.0.1,cross.1.*"`` -> the heads it names, checked against ``model``.

    Negative layer and head numbers count from the end, as in ``inspect-attention``.

    Raises:
        ConfigError: naming ``option``, for an unknown part, a malformed name or an index
            out of range.
    """
    layers = attention_layers(model)
    heads: list[HeadName] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        fields = item.split(".")
        if len(fields) != 3 or fields[0] not in PARTS:
            raise ConfigError(
                f"{option} {item!r}: write heads as PART.LAYER.HEAD with PART one of "
                f"{', '.join(PARTS)} (e.g. enc.0.1, cross.1.*)"
            )
        if fields[0] not in layers:
            family = model.family
            raise ConfigError(
                f"{option} {item!r}: {article(family)} {family} model has no {PARTS[fields[0]]}; "
                f"its heads are {', '.join(f'{p}.LAYER.HEAD' for p in layers)}"
            )
        part, layer_text, head_text = fields
        layer = _index(layer_text, len(layers[part]), f"{option} {item!r}: layer", part)
        n_heads = layers[part][layer].n_heads
        if head_text == "*":
            heads.extend(HeadName(part, layer, h) for h in range(n_heads))
        else:
            head = _index(head_text, n_heads, f"{option} {item!r}: head", part)
            heads.append(HeadName(part, layer, head))
    if not heads:
        raise ConfigError(f"{option} {text!r} names no head (e.g. enc.0.1,cross.1.*)")
    return sorted(set(heads), key=_model_order)


def _model_order(head: HeadName) -> tuple[int, int, int]:
    return list(PARTS).index(head.part), head.layer, head.head


def _index(text: str, size: int, what: str, part: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{what} {text!r} is not a number") from None
    if not -size <= value < size:
        raise ConfigError(
            f"{what} {value} is out of range: {PARTS[part]} has {size} "
            f"(0..{size - 1}, or negative from the end)"
        )
    return value % size


def mask_heads(model: TransformerBase, heads: Iterable[HeadName]) -> None:
    """Silence exactly ``heads`` (their gates to 0, every other head's back to 1), in place.

    An empty ``heads`` removes every mask. The gates follow the model's device and are not
    saved with it.
    """
    wanted = set(heads)
    device = model.output_weight().device  # float even in an int8 model
    for part, layers in attention_layers(model).items():
        for i, attention in enumerate(layers):
            silenced = [h for h in range(attention.n_heads) if HeadName(part, i, h) in wanted]
            if not silenced:
                attention.head_gate = None
                continue
            gate = torch.ones(attention.n_heads, device=device)
            gate[silenced] = 0.0
            attention.head_gate = gate


def masked(model: TransformerBase) -> list[HeadName]:
    """The heads masked in ``model`` now."""
    return [
        HeadName(part, i, h)
        for part, layers in attention_layers(model).items()
        for i, attention in enumerate(layers)
        if attention.head_gate is not None
        for h in range(attention.n_heads)
        if float(attention.head_gate[h]) == 0.0
    ]


@contextmanager
def heads_masked(model: TransformerBase, heads: Sequence[HeadName]) -> Iterator[TransformerBase]:
    """Within the block, ``heads`` are masked (and only they); the earlier masks come back
    afterwards."""
    before = masked(model)
    mask_heads(model, heads)
    try:
        yield model
    finally:
        mask_heads(model, before)
