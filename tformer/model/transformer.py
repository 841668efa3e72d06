"""The encoder-decoder Transformer (Vaswani et al., 2017, figure 1).

Shape legend: B batch, S source length, T target length, D d_model, H heads, V target vocabulary.

Read top-down: ``Encoder`` maps source ids to "memory"; ``Decoder`` maps the target prefix and
the memory to hidden states; ``TransformerBase`` is what every family (this one and those of
``families.py``) shares and answers; ``Transformer`` ties the two stacks together with the
output projection and offers ``encode`` / ``decode`` for generation and ``forward`` for
teacher-forced training.
Attention weights are *returned* when asked for (``need_weights=True``), never stashed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import EOS_ID, PAD_ID, ModelConfig
from tformer.model.attention import MultiHeadAttention, padding_mask
from tformer.model.cache import DecoderCache, LayerCache
from tformer.model.layers import (
    DecoderLayer,
    EncoderLayer,
    TokenEmbedding,
    norm_layer,
    token_embedding,
)
from tformer.model.positions import RelativePositionBias, positional_encoding


@dataclass
class AttentionMaps:
    """Attention weights of one forward pass, one (B, H, rows, cols) tensor per layer."""

    encoder: list[Tensor] = field(default_factory=list)  # (B, H, S, S): source self-attention
    decoder: list[Tensor] = field(default_factory=list)  # (B, H, T, T): causal self-attention
    cross: list[Tensor] = field(default_factory=list)  # (B, H, T, S): target rows, source cols


@dataclass
class EncoderOutput:
    memory: Tensor  # (B, S, D)
    mask: Tensor  # (B, 1, 1, S): True where the source is not padding
    attentions: list[Tensor] | None = None


@dataclass
class DecoderOutput:
    logits: Tensor  # (B, T, V)
    self_attentions: list[Tensor] | None = None
    cross_attentions: list[Tensor] | None = None


@dataclass
class Seq2SeqOutput:
    logits: Tensor  # (B, T, V)
    attentions: AttentionMaps | None = None


class Encoder(nn.Module):
    """N identical layers of self-attention + feed-forward over the source (section 3.1)."""

    def __init__(self, config: ModelConfig, embedding: TokenEmbedding) -> None:
        super().__init__()
        self.embedding = embedding
        self.positions = positional_encoding(config, embedding_norm(config))
        self.relative = relative_bias(config, bidirectional=True)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
        # Pre-norm leaves the residual stream un-normalised; one LayerNorm at the end fixes that.
        self.final_norm = norm_layer(config) if config.norm == "pre" else nn.Identity()

    def forward(
        self, src: Tensor, mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor]]:
        x = self.positions(self.embedding(src))  # (B, S, D)
        length = src.size(1)
        bias = self.relative(length, length) if self.relative is not None else None
        maps: list[Tensor] = []
        for layer in self.layers:
            x, weights = layer(x, mask, need_weights, bias)
            if weights is not None:
                maps.append(weights)
        return self.final_norm(x), maps


class Decoder(nn.Module):
    """N identical layers of causal self-attention, cross-attention and feed-forward
    (without ``cross_attention``: a decoder-only language model's stack)."""

    def __init__(
        self, config: ModelConfig, embedding: TokenEmbedding, *, cross_attention: bool = True
    ) -> None:
        super().__init__()
        self.embedding = embedding
        self.positions = positional_encoding(config, embedding_norm(config))
        self.relative = relative_bias(config, bidirectional=False)
        self.layers = nn.ModuleList(
            DecoderLayer(config, cross_attention=cross_attention)
            for _ in range(config.n_decoder_layers)
        )
        self.final_norm = norm_layer(config) if config.norm == "pre" else nn.Identity()
        # T5 v1.0 rescales the output by d_model^-0.5 before its tied projection.
        self.output_scale = config.d_model**-0.5 if config.output_scale else 1.0

    def finish(self, x: Tensor) -> Tensor:
        """The last layer's output (B, T, D) as the output projection reads it: the final
        norm (pre-norm), then T5's rescaling (``output_scale``)."""
        x = self.final_norm(x)
        return x if self.output_scale == 1.0 else x * self.output_scale

    def inputs(
        self, tgt: Tensor, start: int, index: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """(B, T) ids at positions ``start`` onwards (or at the device tensor ``index``, for a
        step replayed as a CUDA graph) -> their embeddings with positions (B, T, D), and T5's
        relative position bias (1, H, T, start + T) or None."""
        x = self.embedding(tgt)
        x = self.positions(x, start) if index is None else self.positions.at(x, index)
        length = tgt.size(1)
        if self.relative is None:
            return x, None
        return x, self.relative(length, start + length, start)

    def step(
        self, tgt: Tensor, memory: Tensor, memory_mask: Tensor | None, cache: DecoderCache
    ) -> Tensor:
        """``forward`` for one new token per row (B, 1), at inference, with a cache: each
        layer's ``step``, then (B, 1, D) states as the output projection reads them."""
        x, bias = self.inputs(tgt, cache.length, cache.index)
        for layer, layer_cache in zip(self.layers, cache.layers, strict=True):
            assert isinstance(layer, DecoderLayer)
            x = layer.step(x, memory, memory_mask, layer_cache, bias)
        cache.length += 1
        return self.finish(x)

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None,
        *,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        x, bias = self.inputs(tgt, cache.length if cache is not None else 0)
        self_maps: list[Tensor] = []
        cross_maps: list[Tensor] = []
        for i, layer in enumerate(self.layers):
            x, self_w, cross_w = layer(
                x,
                memory,
                memory_mask,
                cache=cache.layers[i] if cache is not None else None,
                need_weights=need_weights,
                position_bias=bias,
            )
            if self_w is not None:
                self_maps.append(self_w)
            if cross_w is not None:
                cross_maps.append(cross_w)
        if cache is not None:
            cache.length += tgt.size(1)
        return self.finish(x), self_maps, cross_maps


class TransformerBase(nn.Module):
    """What the three families share, and what a command asks a model instead of its family.

    The protocol: ``encode`` (B, S) ids -> memory, ``decode`` a target prefix -> logits,
    ``project`` hidden states -> logits, and the attention sub-layers of each kind
    (``attention_parts``). The class attributes say what a model has; they are read from
    the class too, so a checkpoint's family answers them before its weights load.
    """

    family: ClassVar[str]  # its name, as config.arch spells it
    attention_kinds: ClassVar[tuple[str, ...]]  # the maps it returns: encoder, decoder, cross
    reads_source: ClassVar[bool]  # an encoder reads a source the decoder attends to
    generates: ClassVar[bool]  # a decoder writes output one token at a time
    continues_prompts: ClassVar[bool]  # its input is a prompt the decoder continues
    fills_masks: ClassVar[bool]  # it predicts the <mask> tokens of its input

    output_projection: nn.Linear | None
    logits_bias: nn.Parameter | None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config

    def _init_linear_weights(self) -> None:
        # Xavier-uniform for every projection, as in the reference implementations; biases 0.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def stacks(self) -> dict[str, Encoder | Decoder]:
        """The model's stacks by name (``encoder``, ``decoder``), in the order they run."""
        raise NotImplementedError

    def encode(self, src: Tensor, need_weights: bool = False) -> EncoderOutput:
        """(B, S) input ids -> (B, S, D) states and the padding mask: the memory a decoder
        attends to (empty for a prompt-continuing model), or an encoder-only model's output."""
        raise NotImplementedError

    def decode(
        self,
        tgt_in: Tensor,
        encoded: EncoderOutput,
        *,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> DecoderOutput:
        """(B, T) decoder input ids -> (B, T, V) next-token logits (a model that generates)."""
        raise NotImplementedError(f"{type(self).__name__} has no decoder")

    def step(
        self,
        tgt: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None,
        cache: DecoderCache,
        project: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor:
        """(B, 1) newest tokens -> (B, 1, V) logits, through the decoder's ``step``: the same
        result as ``decode(tgt, encoded, cache=cache).logits`` in eval mode, in fewer
        operations (a model that generates; ``memory`` is empty for a decoder-only one).

        ``project``: another output projection, such as :meth:`projection_onto`'s."""
        decoder = self.stacks()["decoder"]
        assert isinstance(decoder, Decoder)
        return (project or self.project)(decoder.step(tgt, memory, memory_mask, cache))

    def project(self, hidden: Tensor) -> Tensor:
        """(B, T, D) -> (B, T, V) logits (plus Marian's bias with ``output_bias``)."""
        return F.linear(hidden, self.output_weight(), self.logits_bias)

    def projection_onto(self, ids: Tensor) -> Callable[[Tensor], Tensor]:
        """:meth:`project` onto the target ids ``ids`` (C,) alone: (B, T, D) -> (B, T, C)
        logits, its rows sliced once for the many steps that use it."""
        weight = self.output_weight().detach()[ids]
        bias = None if self.logits_bias is None else self.logits_bias.detach()[ids]
        return partial(F.linear, weight=weight, bias=bias)

    def output_weight(self) -> Tensor:
        """The (V, D) output projection: when tied, the embedding of the stack that writes
        the output (the last one) (section 3.4)."""
        if self.output_projection is None:
            return list(self.stacks().values())[-1].embedding.weight
        return self.output_projection.weight

    def new_cache(self) -> DecoderCache:
        """Empty key/value caches for incremental decoding, one per decoder layer."""
        return DecoderCache([LayerCache() for _ in self.stacks()["decoder"].layers])

    def attention_parts(self) -> dict[str, list[MultiHeadAttention]]:
        """The attention sub-layers of each of ``attention_kinds``, in layer order."""
        parts: dict[str, list[MultiHeadAttention]] = {kind: [] for kind in self.attention_kinds}
        for stack in self.stacks().values():
            for layer in stack.layers:
                if isinstance(layer, EncoderLayer):
                    parts["encoder"].append(layer.self_attn)
                    continue
                assert isinstance(layer, DecoderLayer)
                parts["decoder"].append(layer.self_attn)
                if layer.has_cross:
                    parts["cross"].append(layer.cross_attn)
        return parts

    @torch.no_grad()
    def parameter_counts(self) -> dict[str, int]:
        """Unique parameter counts per part (a tied matrix is counted once, under embeddings;
        BERT's masked-LM head and the logits bias too)."""
        stacks = self.stacks()
        seen: set[int] = set()
        embeddings = sum(count_parameters(stack.embedding, seen) for stack in stacks.values())
        for head in (self.output_projection, getattr(self, "mlm_transform", None)):
            if head is not None:
                embeddings += count_parameters(head, seen)
        if self.logits_bias is not None:
            embeddings += self.logits_bias.numel()
        layers = {
            name: count_parameters(stack, seen, skip="embedding") for name, stack in stacks.items()
        }
        shares = [attention_and_feed_forward(stack.layers) for stack in stacks.values()]
        return {
            "embeddings": embeddings,
            **layers,
            "attention": sum(attention for attention, _ in shares),
            "feed_forward": sum(ff for _, ff in shares),
            "total": embeddings + sum(layers.values()),
        }


class Transformer(TransformerBase):
    """Encoder, decoder and the final linear projection to target-vocabulary logits."""

    family = "encoder-decoder"
    attention_kinds = ("encoder", "decoder", "cross")
    reads_source = True
    generates = True
    continues_prompts = False
    fills_masks = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        src_embedding = token_embedding(config, config.src_vocab_size)
        tgt_embedding = (
            src_embedding
            if config.share_embeddings
            else token_embedding(config, config.tgt_vocab_size)
        )
        self.encoder = Encoder(config, src_embedding)
        self.decoder = Decoder(config, tgt_embedding)
        # Tied: the output projection *is* the target embedding matrix (section 3.4), so no
        # separate parameter exists; untied it is an ordinary bias-free linear layer.
        self.output_projection = (
            None
            if config.tie_embeddings
            else nn.Linear(config.d_model, config.tgt_vocab_size, bias=False)
        )
        # Marian's bias on the logits (decoder_ff_logit_out_b), zeros to start; the paper has
        # none. Kept apart from the (possibly tied) matrix, so tying is unchanged.
        self.logits_bias = logits_bias(config, config.tgt_vocab_size)
        self._init_linear_weights()

    def stacks(self) -> dict[str, Encoder | Decoder]:
        return {"encoder": self.encoder, "decoder": self.decoder}

    # -- the three entry points ---------------------------------------------------------------

    def encode(self, src: Tensor, need_weights: bool = False) -> EncoderOutput:
        """(B, S) source ids -> memory (B, S, D) and its padding mask (with ``source_eos``,
        S + 1 positions: the <eos> each source is read with, as Marian reads it)."""
        if self.config.source_eos:
            src = append_eos(src, self.config.max_len)
        mask = padding_mask(src, PAD_ID)
        memory, maps = self.encoder(src, mask, need_weights)
        return EncoderOutput(memory, mask, maps if need_weights else None)

    def decode(
        self,
        tgt_in: Tensor,
        encoded: EncoderOutput,
        *,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> DecoderOutput:
        """(B, T) decoder input ids -> (B, T, V) logits for the next token at each position.

        With a ``cache``, ``tgt_in`` holds only the new positions (usually one).
        """
        hidden, self_maps, cross_maps = self.decoder(
            tgt_in, encoded.memory, encoded.mask, cache=cache, need_weights=need_weights
        )
        logits = self.project(hidden)
        if not need_weights:
            return DecoderOutput(logits)
        return DecoderOutput(logits, self_maps, cross_maps)

    def forward(self, src: Tensor, tgt_in: Tensor, need_weights: bool = False) -> Seq2SeqOutput:
        """Teacher-forced pass: logits for every target position at once."""
        encoded = self.encode(src, need_weights)
        decoded = self.decode(tgt_in, encoded, need_weights=need_weights)
        if not need_weights:
            return Seq2SeqOutput(decoded.logits)
        maps = AttentionMaps(
            encoder=encoded.attentions or [],
            decoder=decoded.self_attentions or [],
            cross=decoded.cross_attentions or [],
        )
        return Seq2SeqOutput(decoded.logits, maps)


def logits_bias(config: ModelConfig, vocab_size: int) -> nn.Parameter | None:
    """The learned logits bias of ``output_bias`` (zeros to start), or None (the paper)."""
    return nn.Parameter(torch.zeros(vocab_size)) if config.output_bias else None


def relative_bias(config: ModelConfig, *, bidirectional: bool) -> RelativePositionBias | None:
    """T5's relative position bias of one stack (``positions`` relative), or None."""
    if config.positions != "relative":
        return None
    return RelativePositionBias(config, bidirectional=bidirectional)


def embedding_norm(config: ModelConfig) -> nn.Module | None:
    """BERT's layer norm on the embeddings (``embedding_norm``), or None (the paper)."""
    return norm_layer(config) if config.embedding_norm else None


def append_eos(src: Tensor, max_len: int) -> Tensor:
    """(B, S) right-padded source ids -> (B, min(S + 1, max_len)) with <eos> after each
    source's last token. A source of ``max_len`` tokens loses its last one to make room, as
    Marian's tokenizer truncates (the <eos> always closes the source)."""
    lengths = (src != PAD_ID).sum(dim=1).clamp(max=max_len - 1)  # (B,)
    out = F.pad(src, (0, 1), value=PAD_ID)[:, :max_len]  # (B, S + 1) or (B, max_len)
    return out.scatter(1, lengths[:, None], EOS_ID)


def source_as_read(ids: Sequence[int], config: ModelConfig) -> list[int]:
    """A source's ids as the encoder reads them: with ``source_eos``, <eos> appended in the
    place :func:`append_eos` puts it (for labelling attention maps' source columns)."""
    if not config.source_eos:
        return list(ids)
    return [*ids[: config.max_len - 1], EOS_ID]


def count_parameters(module: nn.Module, seen: set[int], *, skip: str | None = None) -> int:
    """Parameters of ``module`` not in ``seen`` (then added to it), leaving out those whose
    name holds ``skip``."""
    total = 0
    for name, p in module.named_parameters():
        if id(p) in seen or (skip is not None and skip in name):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def attention_and_feed_forward(layers: nn.ModuleList) -> tuple[int, int]:
    """Parameters of the layers' attention and feed-forward sub-layers."""
    attention = ff = 0
    for layer in layers:
        for name, p in layer.named_parameters():
            if "attn" in name:
                attention += p.numel()
            elif "feed_forward" in name:
                ff += p.numel()
    return attention, ff
