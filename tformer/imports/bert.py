"""A Hugging Face ``BertForMaskedLM`` folder as an encoder-only tformer model and tokenizer.

BERT (Devlin et al. 2019) is tformer's encoder-only family with variants: post-norm layers
(the paper's) with BERT's epsilon, learned positions, token embeddings added unscaled with
segment 0's token-type vector (``segment_embedding``; tformer reads single texts), a layer norm
on the embeddings (``embedding_norm``), the masked-LM head (``mlm_head``) before the tied
output projection with its bias (``output_bias``), and [CLS] before every text
(``bos_first``). The vocabulary is BERT's in tformer's id order: [PAD] [CLS] [SEP] [UNK]
[MASK] become ``<pad> <bos> <eos> <unk> <mask>`` (0..4), the rest keep their order. tformer's
encoder-only texts end with ``<eos>``, so the model reads [CLS] text [SEP] as BERT does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tformer.config import ModelConfig
from tformer.data.hf_tokenizers import fast_tokenizer, reordered_tokenizer
from tformer.data.spm import special_first_order
from tformer.errors import CheckpointError
from tformer.imports.common import Imported, Key, family_config, one_tokenizer_import
from tformer.imports.weights import Tensors, rows_in_order
from tformer.paths import excerpt

# transformers' ACT2FN names -> tformer's (BERT's "gelu" is the exact, erf one).
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "relu": "relu", "silu": "silu"}


# What config.json's keys must hold, and the tformer setting each becomes.
KEYS: dict[str, Key] = {
    "hidden_size": Key.width(),
    "num_attention_heads": Key.heads(),
    "num_hidden_layers": Key.layers("n_encoder_layers"),
    "intermediate_size": Key.ffn(),
    # One position holds the [CLS]: tformer's max_len is one less.
    "max_position_embeddings": Key.positions(None, low=2, more=1),
    "vocab_size": Key.vocab(),
    "type_vocab_size": Key.vocab(),
    "hidden_dropout_prob": Key.fraction("dropout"),
    "attention_probs_dropout_prob": Key.fraction("attention_dropout"),
    "layer_norm_eps": Key.epsilon(),
    "pad_token_id": Key.token_id(null=True),
    "hidden_act": Key.text(),
    "position_embedding_type": Key.text(),
    "is_decoder": Key.flag(),
    "add_cross_attention": Key.flag(),
}


def _problems(config: Any) -> list[str]:
    problems = []
    if config.hidden_act not in ACTIVATIONS:
        problems.append(f"hidden_act {excerpt(config.hidden_act)}")
    kind = getattr(config, "position_embedding_type", "absolute")
    if kind != "absolute":
        problems.append(f"position_embedding_type {excerpt(kind)}")
    if config.is_decoder or config.add_cross_attention:
        problems.append("is_decoder / add_cross_attention (a BERT decoder)")
    if config.hidden_size % config.num_attention_heads:
        problems.append(
            f"hidden_size {config.hidden_size} not divisible by num_attention_heads "
            f"{config.num_attention_heads}"
        )
    return problems


def bert_order(hf_tokenizer: Any, size: int, where: Path) -> list[int | None]:
    """BERT's ids in tformer's order: [PAD] [CLS] [SEP] [UNK] [MASK], then the rest in order.

    Raises:
        CheckpointError: the tokenizer lacks one of them or does not fit the model.
    """
    names = ("pad_token", "cls_token", "sep_token", "unk_token", "mask_token")
    ids = [hf_tokenizer.convert_tokens_to_ids(getattr(hf_tokenizer, n)) for n in names]
    if len(hf_tokenizer) != size or any(i is None or not 0 <= i < size for i in ids):
        raise CheckpointError(
            f"{where}: the tokenizer ({len(hf_tokenizer)} tokens, specials {ids}) does not "
            f"fit the model's vocab_size {size}"
        )
    pad, cls, sep, unk, mask = ids
    order = special_first_order(size, pad=pad, bos=cls, eos=sep, unk=unk)
    order.remove(mask)
    order.insert(4, mask)  # an encoder-only tformer model's <mask> is id 4
    return order


def read_bert(folder: Path, *, source: str) -> Imported:
    """Read a ``save_pretrained`` BertForMaskedLM folder (with its BERT tokenizer).

    Raises:
        CheckpointError: a setting tformer cannot express, missing tokenizer files, or weights
            that do not match their config.
        ConfigError: transformers is not installed.
    """
    checked = family_config(folder, "BertConfig", "bert", KEYS, _problems)
    config = checked.config
    hf_tokenizer = fast_tokenizer(folder, "bert")
    order = bert_order(hf_tokenizer, config.vocab_size, folder)
    tokenizer = reordered_tokenizer(
        hf_tokenizer.backend_tokenizer, order, mask=True, where=str(folder)
    )
    # Buffers some versions save (position and token-type ids) are not weights, and a tied
    # decoder is the word embedding (its bias, cls.predictions.bias).
    copies = {"cls.predictions.decoder.bias"}
    if config.tie_word_embeddings:
        copies.add("cls.predictions.decoder.weight")
    return one_tokenizer_import(
        checked,
        source,
        (tokenizer, type(hf_tokenizer).__name__),
        lambda: bert_model_config(config, len(order)),
        lambda weights: _state(weights, config, order),
        lambda name: name.endswith(("position_ids", "token_type_ids")) or name in copies,
    )


def bert_model_config(config: Any, vocab_size: int) -> ModelConfig:
    """tformer's architecture of a (checked) ``BertConfig`` with ``vocab_size`` rows."""
    return ModelConfig(
        arch="encoder-only",
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        d_model=config.hidden_size,
        n_heads=config.num_attention_heads,
        n_encoder_layers=config.num_hidden_layers,
        d_ff=config.intermediate_size,
        dropout=config.hidden_dropout_prob,
        attention_dropout=config.attention_probs_dropout_prob,
        norm="post",
        activation=ACTIVATIONS[config.hidden_act],  # type: ignore[arg-type]
        max_len=config.max_position_embeddings - 1,  # one position holds the [CLS]
        positions="learned",
        tie_embeddings=bool(config.tie_word_embeddings),
        output_bias=True,
        embedding_scale=False,
        norm_eps=config.layer_norm_eps,
        embedding_norm=True,
        segment_embedding=True,
        mlm_head=True,
        bos_first=True,
    )


def _state(weights: Tensors, config: Any, order: list[int | None]) -> dict[str, torch.Tensor]:
    """tformer's state dict of BERT's tensors."""
    d, f, size = config.hidden_size, config.intermediate_size, config.vocab_size
    emb = "bert.embeddings"
    words = weights.take(f"{emb}.word_embeddings.weight", (size, d))
    types = weights.take(f"{emb}.token_type_embeddings.weight", (config.type_vocab_size, d))
    head = "cls.predictions"
    state = {
        "encoder.embedding.embedding.weight": rows_in_order(words, order),
        "encoder.embedding.segment": types[0],  # segment 0: every token of a single text
        "encoder.positions.table.weight": weights.take(
            f"{emb}.position_embeddings.weight", (config.max_position_embeddings, d)
        ),
        "logits_bias": rows_in_order(weights.take(f"{head}.bias", (size,))[:, None], order)[:, 0],
    }
    pairs = [
        (f"{emb}.LayerNorm", "encoder.positions.norm", (d,)),
        (f"{head}.transform.dense", "mlm_transform.dense", (d, d)),
        (f"{head}.transform.LayerNorm", "mlm_transform.norm", (d,)),
    ]
    if not config.tie_word_embeddings:
        decoder = weights.take(f"{head}.decoder.weight", (size, d))
        state["output_projection.weight"] = rows_in_order(decoder, order)
    for i in range(config.num_hidden_layers):
        theirs, ours = f"bert.encoder.layer.{i}", f"encoder.layers.{i}"
        k = weights.take(f"{theirs}.attention.self.key.weight", (d, d))
        v = weights.take(f"{theirs}.attention.self.value.weight", (d, d))
        k_b = weights.take(f"{theirs}.attention.self.key.bias", (d,))
        v_b = weights.take(f"{theirs}.attention.self.value.bias", (d,))
        state[f"{ours}.self_attn.kv_proj.weight"] = torch.cat([k, v])
        state[f"{ours}.self_attn.kv_proj.bias"] = torch.cat([k_b, v_b])
        pairs += [
            (f"{theirs}.attention.self.query", f"{ours}.self_attn.q_proj", (d, d)),
            (f"{theirs}.attention.output.dense", f"{ours}.self_attn.out_proj", (d, d)),
            (f"{theirs}.attention.output.LayerNorm", f"{ours}.norm1", (d,)),
            (f"{theirs}.intermediate.dense", f"{ours}.feed_forward.w1", (f, d)),
            (f"{theirs}.output.dense", f"{ours}.feed_forward.w2", (d, f)),
            (f"{theirs}.output.LayerNorm", f"{ours}.norm2", (d,)),
        ]
    for theirs, ours, shape in pairs:
        state[f"{ours}.weight"] = weights.take(f"{theirs}.weight", shape)
        state[f"{ours}.bias"] = weights.take(f"{theirs}.bias", (shape[0],))
    return state
