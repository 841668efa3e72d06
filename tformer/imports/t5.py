"""A Hugging Face ``T5ForConditionalGeneration`` folder (T5 v1.0 or v1.1) as an encoder-decoder
model.

T5 (Raffel et al. 2020) is tformer's encoder-decoder with variants: pre-norm RMSNorm layers
and a final norm per stack (T5LayerNorm, eps 1e-6), unscaled embeddings shared by both sides,
the relative position bias (``positions: relative``, one table per stack), unscaled attention
scores, linear layers without biases, and with the tied output the rescaling by
d_model^-0.5 (``output_scale``). It reads sources closed by ``</s>`` (``source_eos``).

Its SentencePiece vocabulary has ``<pad> </s> <unk>`` at 0..2, no ``<s>``, and starts decoding
from ``<pad>``; so tformer's ``<bos>`` is T5's ``<pad>``, ``<eos>`` its ``</s>``, ``<unk>`` its
``<unk>``, and tformer's ``<pad>`` a new row (zeros, never predicted). The sentinels
``<extra_id_N>`` at the end of the vocabulary stay whole tokens.

T5 v1.1 (and mT5, Flan-T5) differs in two ways: a gated feed-forward whose gate is GELU's tanh
approximation (``activation: geglu_tanh``; its hidden width F is written as ``d_ff`` = 3F/2,
tformer's rule for gated widths), and an output that is not rescaled. Its published checkpoints
also hold an output projection of their own (``tie_word_embeddings: false``); transformers 5
writes v1.1 tied, with ``scale_decoder_outputs: false``. Both are read as written.
Configurations tformer cannot express are refused in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tformer.config import ModelConfig
from tformer.data.hf_tokenizers import fast_tokenizer, reordered_tokenizer
from tformer.errors import CheckpointError
from tformer.imports.common import Imported, Key, family_config, one_tokenizer_import
from tformer.imports.weights import Tensors, rows_in_order
from tformer.paths import excerpt

# T5 has no position table, so no limit of its own; tformer's model needs one.
MAX_LEN = 512
# T5Config.feed_forward_proj -> tformer's activation: v1.0's relu, v1.1's gated gelu_new.
FEED_FORWARDS = {"relu": "relu", "gated-gelu": "geglu_tanh"}


def gated(config: Any) -> bool:
    """T5 v1.1's gated feed-forward (read from feed_forward_proj: a saved config.json also
    holds T5Config's derived ``is_gated_act``, which from_dict takes as written)."""
    return bool(config.feed_forward_proj == "gated-gelu")


# What config.json's keys must hold, and the tformer setting each becomes.
KEYS: dict[str, Key] = {
    "d_model": Key.width(),
    "d_kv": Key.width(None),
    "num_heads": Key.heads(),
    "d_ff": Key.ffn(),
    "num_layers": Key.layers("n_encoder_layers"),
    "num_decoder_layers": Key.layers("n_decoder_layers", null=True),
    "vocab_size": Key.vocab(),
    "relative_attention_num_buckets": Key.positions("relative_buckets", low=2),
    "relative_attention_max_distance": Key.positions("relative_max_distance"),
    "dropout_rate": Key.fraction("dropout"),
    "layer_norm_epsilon": Key.epsilon(),
    "pad_token_id": Key.token_id(null=True),
    "eos_token_id": Key.token_id(null=True),
    "decoder_start_token_id": Key.token_id(null=True),
    "feed_forward_proj": Key.text(),
    "is_encoder_decoder": Key.flag(),
    "scale_decoder_outputs": Key.flag(null=True),
}


def _problems(config: Any) -> list[str]:
    problems = []
    if config.feed_forward_proj not in FEED_FORWARDS:
        problems.append(
            f"feed_forward_proj {excerpt(config.feed_forward_proj)} (tformer imports "
            f"{' and '.join(map(repr, FEED_FORWARDS))})"
        )
    elif gated(config) and config.d_ff % 8:
        problems.append(f"d_ff {config.d_ff} (a gated width tformer holds is a multiple of 8)")
    if config.num_heads * config.d_kv != config.d_model:
        problems.append(f"num_heads x d_kv {config.num_heads * config.d_kv} != d_model")
    if not config.is_encoder_decoder:
        problems.append("is_encoder_decoder false")
    starts = (config.pad_token_id, config.eos_token_id, config.decoder_start_token_id)
    if starts != (0, 1, 0):
        problems.append(f"pad/eos/decoder_start ids {starts} (T5's are 0, 1, 0)")
    return problems


def t5_order(size: int) -> list[int | None]:
    """T5's ids in tformer's order: <pad> new, <bos> T5's <pad> (its decoder start), <eos>
    its </s>, <unk> its <unk>, then every other id in its order."""
    return [None, 0, 1, 2, *range(3, size)]


def output_layout(config: Any, raw: dict[str, Any]) -> tuple[bool, bool]:
    """Whether the output projection is the embedding (tied), and whether the decoder's output
    is rescaled by d_model^-0.5, from config.json as written (T5Config forces the tie)."""
    tied = raw.get("tie_word_embeddings", True) is not False
    return tied, bool(getattr(config, "scale_decoder_outputs", tied))


def t5_tokenizer(folder: Path, size: int) -> tuple[Any, list[int | None], list[str]]:
    """The folder's T5 tokenizer, tformer's id order over it, and its sentinels.

    Raises:
        CheckpointError: no readable tokenizer, or one that does not fit the model.
    """
    hf = fast_tokenizer(folder, "t5")
    ids = (hf.pad_token_id, hf.eos_token_id, hf.unk_token_id)
    if ids != (0, 1, 2) or len(hf) > size:
        raise CheckpointError(
            f"{folder}: the tokenizer ({len(hf)} tokens, <pad> </s> <unk> at {ids}) does not "
            f"fit the model (vocab_size {size}, specials at 0, 1, 2)"
        )
    sentinels = [t for t in hf.get_vocab() if t.startswith("<extra_id_")]
    return hf, t5_order(len(hf)), sentinels


def read_t5(folder: Path, *, source: str) -> Imported:
    """Read a ``save_pretrained`` T5ForConditionalGeneration folder (with its tokenizer).

    Rows of the embedding beyond the tokenizer's vocabulary (t5-small pads 32,100 tokens to
    32,128 rows) stand for no token and are left out.

    Raises:
        CheckpointError: a setting tformer cannot express, missing tokenizer files, or weights
            that do not match their config.
        ConfigError: transformers is not installed.
    """
    checked = family_config(folder, "T5Config", "t5", KEYS, _problems)
    config = checked.config
    hf, order, sentinels = t5_tokenizer(folder, config.vocab_size)
    tokenizer = reordered_tokenizer(
        hf.backend_tokenizer, order, mask=False, where=str(folder), keep=sentinels
    )
    tied, scaled = output_layout(config, checked.raw)
    copies = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"}
    if tied:
        copies.add("lm_head.weight")
    return one_tokenizer_import(
        checked,
        source,
        (tokenizer, type(hf).__name__),
        lambda: t5_model_config(config, len(order), tied=tied, scaled=scaled),
        lambda weights: t5_state(weights, config, order, tied=tied),
        copies.__contains__,
    )


def t5_model_config(
    config: Any, vocab_size: int, *, tied: bool = True, scaled: bool = True
) -> ModelConfig:
    """tformer's architecture of a (checked) T5 v1.0 or v1.1 config (see output_layout)."""
    v1_1 = gated(config)
    return ModelConfig(
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        d_model=config.d_model,
        n_heads=config.num_heads,
        n_encoder_layers=config.num_layers,
        n_decoder_layers=config.num_decoder_layers,
        d_ff=config.d_ff * 3 // 2 if v1_1 else config.d_ff,  # ffn_hidden is T5's d_ff
        dropout=config.dropout_rate,
        attention_dropout=config.dropout_rate,
        norm="pre",
        normalization="rmsnorm",
        norm_eps=config.layer_norm_epsilon,
        activation=FEED_FORWARDS[config.feed_forward_proj],  # type: ignore[arg-type]
        max_len=MAX_LEN,
        positions="relative",
        relative_buckets=config.relative_attention_num_buckets,
        relative_max_distance=config.relative_attention_max_distance,
        attention_scale=False,
        linear_bias=False,
        embedding_scale=False,
        tie_embeddings=tied,
        share_embeddings=True,
        output_scale=scaled,
        source_eos=True,
    )


def t5_state(
    weights: Tensors, config: Any, order: list[int | None], *, tied: bool = True
) -> dict[str, torch.Tensor]:
    """tformer's state dict from the T5 tensors."""
    d, f, h = config.d_model, config.d_ff, config.num_heads
    shared = weights.take(
        "shared.weight", (config.vocab_size, d), "encoder.embed_tokens.weight", "lm_head.weight"
    )
    embedding = rows_in_order(shared, order)
    state = {
        "encoder.embedding.embedding.weight": embedding,
        "decoder.embedding.embedding.weight": embedding,
    }
    if not tied:  # an output projection of its own, rows in tformer's order
        head = weights.take("lm_head.weight", (config.vocab_size, d))
        state["output_projection.weight"] = rows_in_order(head, order)
    for side, count in (("encoder", config.num_layers), ("decoder", config.num_decoder_layers)):
        bias = f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        state[f"{side}.relative.table.weight"] = weights.take(
            bias, (config.relative_attention_num_buckets, h)
        )
        state[f"{side}.final_norm.weight"] = weights.take(f"{side}.final_layer_norm.weight", (d,))
        # T5's sub-layers in order: self-attention, (cross-attention,) feed-forward.
        parts = [("SelfAttention", "self_attn", "norm1")]
        if side == "decoder":
            parts.append(("EncDecAttention", "cross_attn", "norm2"))
        ff_norm = "norm3" if side == "decoder" else "norm2"
        for i in range(count):
            theirs, ours = f"{side}.block.{i}.layer", f"{side}.layers.{i}"
            for j, (name, mine, norm) in enumerate(parts):
                at = f"{theirs}.{j}.{name}"
                q, k, v, o = (weights.take(f"{at}.{x}.weight", (d, d)) for x in "qkvo")
                state[f"{ours}.{mine}.q_proj.weight"] = q
                state[f"{ours}.{mine}.kv_proj.weight"] = torch.cat([k, v])
                state[f"{ours}.{mine}.out_proj.weight"] = o
                state[f"{ours}.{norm}.weight"] = weights.take(
                    f"{theirs}.{j}.layer_norm.weight", (d,)
                )
            j = len(parts)
            dense = f"{theirs}.{j}.DenseReluDense"
            if gated(config):  # act(x wi_0) * (x wi_1): the gate and the gated value
                state[f"{ours}.feed_forward.w1.weight"] = weights.take(
                    f"{dense}.wi_0.weight", (f, d)
                )
                state[f"{ours}.feed_forward.v.weight"] = weights.take(
                    f"{dense}.wi_1.weight", (f, d)
                )
            else:
                state[f"{ours}.feed_forward.w1.weight"] = weights.take(f"{dense}.wi.weight", (f, d))
            state[f"{ours}.feed_forward.w2.weight"] = weights.take(
                f"{theirs}.{j}.DenseReluDense.wo.weight", (d, f)
            )
            state[f"{ours}.{ff_norm}.weight"] = weights.take(
                f"{theirs}.{j}.layer_norm.weight", (d,)
            )
    return state
