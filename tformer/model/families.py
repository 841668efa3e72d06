"""The other two Transformer families, built from the same blocks as the encoder-decoder.

- Decoder-only (GPT, Radford et al. 2018): the decoder stack without its cross-attention,
  trained to predict each next token (causal language modelling).
- Encoder-only (BERT, Devlin et al. 2019): the encoder stack with an output projection over
  the vocabulary, trained to recover masked tokens (masked language modelling).

Both subclass :class:`Transformer` so that everything written for a model (checkpoints,
attention maps, head masks, decoding steppers) takes them; each keeps the parts its family
has (``decoder`` or ``encoder``) and says which it is in ``config.arch``.

Shape legend: B batch, L length, D d_model, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import BOS_ID, PAD_ID, ModelConfig
from tformer.model.attention import padding_mask
from tformer.model.cache import DecoderCache
from tformer.model.layers import ACTIVATIONS, norm_layer, token_embedding
from tformer.model.transformer import (
    AttentionMaps,
    Decoder,
    DecoderOutput,
    Encoder,
    EncoderOutput,
    Seq2SeqOutput,
    Transformer,
    attention_and_feed_forward,
    count_parameters,
)


def _one_stack_counts(
    model: Transformer, stack: Encoder | Decoder, part: str
) -> dict[str, int]:
    """Parameter counts of a one-stack model: embeddings (the tied projection once), its
    ``part`` (encoder or decoder), and their attention and feed-forward shares."""
    seen: set[int] = set()
    embeddings = count_parameters(stack.embedding, seen)
    if model.output_projection is not None:
        embeddings += count_parameters(model.output_projection, seen)
    head = getattr(model, "mlm_transform", None)  # BERT's masked-LM head counts with them
    if head is not None:
        embeddings += count_parameters(head, seen)
    if model.logits_bias is not None:
        embeddings += model.logits_bias.numel()
    layers = count_parameters(stack, seen, skip="embedding")
    attention, ff = attention_and_feed_forward(stack.layers)
    return {
        "embeddings": embeddings,
        part: layers,
        "attention": attention,
        "feed_forward": ff,
        "total": embeddings + layers,
    }


class DecoderOnlyTransformer(Transformer):
    """A causal language model: embeddings, N blocks of causal self-attention and feed-forward,
    and the output projection (tied to the embedding unless ``tie_embeddings`` is off).

    ``forward(src, tgt_in)`` ignores ``src`` (the batch of a language model has none), so the
    training loop treats it as a translation model with an empty source.
    """

    def __init__(self, config: ModelConfig) -> None:
        nn.Module.__init__(self)
        self.config = config
        embedding = token_embedding(config, config.tgt_vocab_size)
        self.decoder = Decoder(config, embedding, cross_attention=False)
        self.output_projection = (
            None
            if config.tie_embeddings
            else nn.Linear(config.d_model, config.tgt_vocab_size, bias=False)
        )
        self.logits_bias = logits_bias(config, config.tgt_vocab_size)
        self._init_linear_weights()

    def encode(self, src: Tensor, need_weights: bool = False) -> EncoderOutput:
        """No encoder: an empty memory, so decoding code written for the encoder-decoder runs."""
        b = src.size(0)
        memory = self.decoder.embedding.weight.new_zeros(b, 0, self.config.d_model)
        mask = torch.ones(b, 1, 1, 0, dtype=torch.bool, device=src.device)
        return EncoderOutput(memory, mask, [] if need_weights else None)

    def forward(self, src: Tensor, tgt_in: Tensor, need_weights: bool = False) -> Seq2SeqOutput:
        """Teacher-forced pass over (B, L) inputs: (B, L, V) next-token logits."""
        decoded = self.decode(tgt_in, self.encode(tgt_in), need_weights=need_weights)
        if not need_weights:
            return Seq2SeqOutput(decoded.logits)
        return Seq2SeqOutput(decoded.logits, AttentionMaps(decoder=decoded.self_attentions or []))

    def decode(
        self,
        tgt_in: Tensor,
        encoded: EncoderOutput | None = None,
        *,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> DecoderOutput:
        # The layers have no cross-attention, so they never read the memory given here.
        no_memory = tgt_in.new_empty(0)
        hidden, self_maps, _ = self.decoder(
            tgt_in, no_memory, None, cache=cache, need_weights=need_weights
        )
        logits = self.project(hidden)
        return DecoderOutput(logits, self_maps if need_weights else None)

    @torch.no_grad()
    def parameter_counts(self) -> dict[str, int]:
        return _one_stack_counts(self, self.decoder, "decoder")


class EncoderOnlyTransformer(Transformer):
    """A masked language model: embeddings, N blocks of bidirectional self-attention and
    feed-forward, and an output projection over the vocabulary at every position (tied to the
    embedding unless ``tie_embeddings`` is off).

    ``forward(src, tgt_in)`` ignores ``tgt_in``: the logits are for the positions of ``src``.
    """

    def __init__(self, config: ModelConfig) -> None:
        nn.Module.__init__(self)
        self.config = config
        embedding = token_embedding(config, config.src_vocab_size)
        self.encoder = Encoder(config, embedding)
        self.mlm_transform = MaskedLMTransform(config) if config.mlm_head else None
        self.output_projection = (
            None
            if config.tie_embeddings
            else nn.Linear(config.d_model, config.src_vocab_size, bias=False)
        )
        self.logits_bias = logits_bias(config, config.src_vocab_size)
        self._init_linear_weights()

    def forward(
        self, src: Tensor, tgt_in: Tensor | None = None, need_weights: bool = False
    ) -> Seq2SeqOutput:
        """(B, L) ids (some of them ``<mask>``) -> (B, L, V) logits for every position.

        With ``bos_first`` the attention maps have one more row and column: the <bos> read
        first, whose logits are left out."""
        encoded = self.encode(src, need_weights)
        memory = encoded.memory[:, 1:] if self.config.bos_first else encoded.memory
        logits = self.project(memory)
        if not need_weights:
            return Seq2SeqOutput(logits)
        return Seq2SeqOutput(logits, AttentionMaps(encoder=encoded.attentions or []))

    def encode(self, src: Tensor, need_weights: bool = False) -> EncoderOutput:
        if self.config.bos_first:  # BERT's [CLS] before every text
            src = F.pad(src, (1, 0), value=BOS_ID)
        mask = padding_mask(src, PAD_ID)
        memory, maps = self.encoder(src, mask, need_weights)
        return EncoderOutput(memory, mask, maps if need_weights else None)

    def output_weight(self) -> Tensor:
        if self.output_projection is None:
            return self.encoder.embedding.weight
        return self.output_projection.weight

    def project(self, hidden: Tensor) -> Tensor:
        if self.mlm_transform is not None:
            hidden = self.mlm_transform(hidden)
        return F.linear(hidden, self.output_weight(), self.logits_bias)

    @torch.no_grad()
    def parameter_counts(self) -> dict[str, int]:
        return _one_stack_counts(self, self.encoder, "encoder")


class MaskedLMTransform(nn.Module):
    """BERT's masked-LM head before the (tied) output projection: LayerNorm(act(h W + b))
    (Devlin et al. 2019; ``cls.predictions.transform`` in its published checkpoints)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.activation = ACTIVATIONS[config.activation]
        self.norm = norm_layer(config)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.norm(self.activation(self.dense(hidden)))  # (B, L, D)


def logits_bias(config: ModelConfig, vocab_size: int) -> nn.Parameter | None:
    """The learned logits bias of ``output_bias`` (zeros to start), or None (the paper)."""
    return nn.Parameter(torch.zeros(vocab_size)) if config.output_bias else None


def build_model(config: ModelConfig) -> Transformer:
    """The model of ``config.arch``: the paper's encoder-decoder, decoder-only or encoder-only."""
    if config.arch == "decoder-only":
        return DecoderOnlyTransformer(config)
    if config.arch == "encoder-only":
        return EncoderOnlyTransformer(config)
    return Transformer(config)
