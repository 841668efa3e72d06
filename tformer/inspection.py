"""Attention maps with token labels, from the same forward pass that training uses.

Shape legend: L layers, H heads, S source tokens, T decoder positions (BOS + target).
Rows of decoder and cross maps are decoder *input* positions: row i is the position that
predicts target token i (row 0 reads BOS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from tformer.checkpoint import Tokenizers
from tformer.decoding import DecodingConfig, decode_texts
from tformer.errors import ConfigError
from tformer.model import Transformer
from tformer.tokenizer import BOS_ID, EOS_ID

Kind = Literal["encoder", "decoder", "cross"]
KINDS: tuple[str, ...] = ("encoder", "decoder", "cross")


@dataclass(frozen=True)
class AttentionResult:
    """Every attention map of one (source, target) pair.

    Attributes:
        encoder: (L, H, S, S) source self-attention.
        decoder: (L, H, T, T) causal self-attention over BOS + target.
        cross: (L, H, T, S) decoder positions over source tokens.
        source_tokens / target_tokens: labels for S and T, as the tokenizer writes them.
        target_text: the target the maps were computed for (given or generated).
    """

    encoder: Tensor
    decoder: Tensor
    cross: Tensor
    source_tokens: list[str]
    target_tokens: list[str]
    source_text: str
    target_text: str
    generated: bool

    def maps(self, kind: str) -> Tensor:
        if kind not in KINDS:
            raise ConfigError(f"--kind {kind!r} must be one of {', '.join(KINDS)}")
        return getattr(self, kind)

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of a kind's maps."""
        if kind == "encoder":
            return self.source_tokens, self.source_tokens
        if kind == "decoder":
            return self.target_tokens, self.target_tokens
        return self.target_tokens, self.source_tokens

    def select(self, kind: str, layer: int, head: int | str) -> Tensor:
        """One map (rows, cols) for ``head`` a number or ``mean``; (H, rows, cols) for ``all``.

        Negative layers count from the last one, as in Python.
        """
        maps = self.maps(kind)
        n_layers, n_heads = maps.shape[0], maps.shape[1]
        if not -n_layers <= layer < n_layers:
            raise ConfigError(
                f"--layer {layer} is out of range: the {kind} has {n_layers} layers "
                f"(0..{n_layers - 1}, or -1..-{n_layers})"
            )
        per_layer = maps[layer]
        if head == "all":
            return per_layer
        if head == "mean":
            return per_layer.mean(dim=0)
        if not isinstance(head, int) or not -n_heads <= head < n_heads:
            raise ConfigError(
                f"--head {head} is out of range: {n_heads} heads (0..{n_heads - 1}), "
                "'all' or 'mean'"
            )
        return per_layer[head]


@torch.no_grad()
def inspect_attention(
    model: Transformer,
    tokenizers: Tokenizers,
    source: str,
    target: str | None = None,
    decoding: DecodingConfig | None = None,
) -> AttentionResult:
    """Attention maps for ``source`` with ``target`` teacher-forced, or the model's own output.

    Args:
        target: the target text; None decodes one with ``decoding`` (greedy by default).
    """
    model.eval()
    device = next(model.parameters()).device
    src_ids = tokenizers.source.encode(source) or [EOS_ID]
    generated = target is None
    if target is None:
        hyp = decode_texts(model, [src_ids], decoding or DecodingConfig())[0][0]
        tgt_ids = hyp.ids
        target = tokenizers.target.decode(tgt_ids)
    else:
        tgt_ids = tokenizers.target.encode(target)
    limit = model.config.max_len
    src_ids, tgt_ids = src_ids[:limit], tgt_ids[: limit - 1]
    tgt_in = [BOS_ID, *tgt_ids]
    src = torch.tensor([src_ids], device=device)
    out = model(src, torch.tensor([tgt_in], device=device), need_weights=True)
    assert out.attentions is not None
    stack = lambda maps: torch.stack([m[0] for m in maps]).float().cpu()  # noqa: E731
    return AttentionResult(
        encoder=stack(out.attentions.encoder),
        decoder=stack(out.attentions.decoder),
        cross=stack(out.attentions.cross),
        source_tokens=tokenizers.source.tokens(src_ids),
        target_tokens=tokenizers.target.tokens(tgt_in),
        source_text=source,
        target_text=target,
        generated=generated,
    )
