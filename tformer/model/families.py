"""The other two Transformer families, built from the same blocks as the encoder-decoder.

- Decoder-only (GPT, Radford et al. 2018): the decoder stack without its cross-attention,
  trained to predict each next token (causal language modelling).
- Encoder-only (BERT, Devlin et al. 2019): the encoder stack with an output projection over
  the vocabulary, trained to recover masked tokens (masked language modelling).

Both are siblings of the encoder-decoder :class:`Transformer`: each derives from
:class:`TransformerBase`, keeps the stack its family has (``decoder`` or ``encoder``) and answers
the base's questions (what it reads, whether it generates or fills masks, which attention maps
it has), so commands, checkpoints, head masks and decoding take any of the three.

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
    TransformerBase,
    logits_bias,
)


class DecoderOnlyTransformer(TransformerBase):
    """A causal language model: embeddings, N blocks of causal self-attention and feed-forward,
    and the output projection (tied to the embedding unless ``tie_embeddings`` is off).

    ``forward(src, tgt_in)`` ignores ``src`` (the batch of a language model has none), so the
    training loop treats it as a translation model with an empty source.
    """

    family = "decoder-only"
    attention_kinds = ("decoder",)
    reads_source = False
    generates = True
    continues_prompts = True
    fills_masks = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        embedding = token_embedding(config, config.tgt_vocab_size)
        self.decoder = Decoder(config, embedding, cross_attention=False)
        self.output_projection = (
            None
            if config.tie_embeddings
            else nn.Linear(config.d_model, config.tgt_vocab_size, bias=False)
        )
        self.logits_bias = logits_bias(config, config.tgt_vocab_size)
        self._init_linear_weights()

    def stacks(self) -> dict[str, Encoder | Decoder]:
        return {"decoder": self.decoder}

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


class EncoderOnlyTransformer(TransformerBase):
    """A masked language model: embeddings, N blocks of bidirectional self-attention and
    feed-forward, and an output projection over the vocabulary at every position (tied to the
    embedding unless ``tie_embeddings`` is off).

    ``forward(src, tgt_in)`` ignores ``tgt_in``: the logits are for the positions of ``src``.
    """

    family = "encoder-only"
    attention_kinds = ("encoder",)
    reads_source = False
    generates = False
    continues_prompts = False
    fills_masks = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
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

    def stacks(self) -> dict[str, Encoder | Decoder]:
        return {"encoder": self.encoder}

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

    def project(self, hidden: Tensor) -> Tensor:
        if self.mlm_transform is not None:
            hidden = self.mlm_transform(hidden)
        return super().project(hidden)


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


# The one place a family's name becomes its class; everything else asks the model.
FAMILIES: dict[str, type[TransformerBase]] = {
    cls.family: cls for cls in (Transformer, DecoderOnlyTransformer, EncoderOnlyTransformer)
}


def model_class(arch: str) -> type[TransformerBase]:
    """The class of family ``arch`` (its capabilities are class attributes, so they answer
    before any weights exist)."""
    return FAMILIES[arch]


def build_model(config: ModelConfig) -> TransformerBase:
    """The model of ``config.arch``: the paper's encoder-decoder, decoder-only or encoder-only."""
    return model_class(config.arch)(config)
