"""An encoder-only checkpoint as a Hugging Face ``BertForMaskedLM`` (the inverse of
``tformer.imports.bert``).

BERT is post-norm LayerNorm layers, learned positions, a token-type embedding, a LayerNorm on
the embeddings, biases everywhere and the masked-LM head (dense, activation, LayerNorm) before
the tied output projection with its bias. tformer's segment vector is every token-type row
(tformer reads single texts); the √d_model embedding scale is folded into the word embeddings
(and out of the head's LayerNorm when the output is tied), the paper's sinusoids become the
position table.

The vocabulary is tformer's rows with the specials renamed and in the order the tokenizers
library's BERT training gives them, ``[PAD] [UNK] [CLS] [SEP] [MASK]`` (0..4; tformer's
``<pad> <unk> <bos> <eos> <mask>``), the rest in tformer's order: an imported BERT whose
specials stood there gets its own ids back. The tokenizer frames a text as tformer reads it:
``[CLS] text [SEP]`` (``text [SEP]`` without ``--bos-first``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tformer.checkpoint.store import Checkpoint
from tformer.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ModelConfig
from tformer.export.hf_common import (
    README,
    Vocabulary,
    embedding_scale,
    exported_tokenizer,
    float_state,
    input_embedding,
    load_exact,
    position_table,
    readme,
    refuse,
    save_tokenizer,
    segment,
    unsupported,
)
from tformer.model.families import EncoderOnlyTransformer

MODEL = "BertForMaskedLM"
MASK_ID = 4  # an encoder-only tformer model's <mask>
# tformer's activation -> transformers' name for it (BERT's "gelu" is the exact, erf one).
ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}
WHY = (
    "BERT has post-norm LayerNorm layers, a position table, a LayerNorm on the embeddings, "
    "the masked-LM head, multi-head attention scaled by 1/sqrt(d_k), ungated "
    "relu/gelu/gelu_tanh/silu feed-forward layers and biases"
)
NAMES = {PAD_ID: "[PAD]", UNK_ID: "[UNK]", BOS_ID: "[CLS]", EOS_ID: "[SEP]", MASK_ID: "[MASK]"}


def problems(config: ModelConfig) -> list[str]:
    """The options of an encoder-only ``config`` BERT has no equivalent for, as flags."""
    return unsupported(
        config,
        allowed={
            "norm": ("post",),
            "normalization": ("layernorm",),
            "positions": ("learned", "sinusoidal"),
            "kv_heads": (),
            "activation": tuple(ACTIVATIONS),
            "attention_scale": (True,),
            "linear_bias": (True,),
            "embedding_norm": (True,),
            "mlm_head": (True,),
        },
    )


def vocabulary(config: ModelConfig) -> Vocabulary:
    """tformer's rows, BERT's special tokens first in the tokenizers library's order."""
    specials = [PAD_ID, UNK_ID, BOS_ID, EOS_ID, MASK_ID]
    roles = {"pad_token": PAD_ID, "unk_token": UNK_ID, "cls_token": BOS_ID}
    roles |= {"sep_token": EOS_ID, "mask_token": MASK_ID}
    return Vocabulary(
        [*specials, *range(5, config.src_vocab_size)],
        NAMES,
        roles,
        prefix=(BOS_ID,) if config.bos_first else (),
        suffix=(EOS_ID,),
    )


def bert_state(model: EncoderOnlyTransformer, vocab: Vocabulary) -> dict[str, torch.Tensor]:
    """BertForMaskedLM's weights of ``model``."""
    c = model.config
    d = c.d_model
    ours = float_state(model)
    enc = model.encoder
    tied = c.tie_embeddings
    factor = 1.0 / embedding_scale(c) if tied else 1.0  # the word embeddings carry the scale
    emb, head = "bert.embeddings", "cls.predictions"
    bias = ours.get("logits_bias", torch.zeros(c.src_vocab_size))
    state = {
        f"{emb}.word_embeddings.weight": vocab.take(input_embedding(enc, c)),
        f"{emb}.position_embeddings.weight": position_table(enc, c),
        f"{emb}.token_type_embeddings.weight": segment(enc, c).expand(2, d),
        f"{emb}.LayerNorm.weight": ours["encoder.positions.norm.weight"],
        f"{emb}.LayerNorm.bias": ours["encoder.positions.norm.bias"],
        f"{head}.transform.dense.weight": ours["mlm_transform.dense.weight"],
        f"{head}.transform.dense.bias": ours["mlm_transform.dense.bias"],
        f"{head}.transform.LayerNorm.weight": ours["mlm_transform.norm.weight"] * factor,
        f"{head}.transform.LayerNorm.bias": ours["mlm_transform.norm.bias"] * factor,
        f"{head}.bias": vocab.take(bias),
    }
    if not tied:
        state[f"{head}.decoder.weight"] = vocab.take(model.output_weight().detach().float())
    for i in range(c.n_encoder_layers):
        ours_l, theirs = f"encoder.layers.{i}", f"bert.encoder.layer.{i}"
        at = f"{ours_l}.self_attn"
        kv_w, kv_b = ours[f"{at}.kv_proj.weight"], ours[f"{at}.kv_proj.bias"]
        state.update({
            f"{theirs}.attention.self.key.weight": kv_w[:d],
            f"{theirs}.attention.self.key.bias": kv_b[:d],
            f"{theirs}.attention.self.value.weight": kv_w[d:],
            f"{theirs}.attention.self.value.bias": kv_b[d:],
        })  # fmt: skip
        for mine, name in (
            (f"{at}.q_proj", "attention.self.query"),
            (f"{at}.out_proj", "attention.output.dense"),
            (f"{ours_l}.norm1", "attention.output.LayerNorm"),
            (f"{ours_l}.feed_forward.w1", "intermediate.dense"),
            (f"{ours_l}.feed_forward.w2", "output.dense"),
            (f"{ours_l}.norm2", "output.LayerNorm"),
        ):
            state[f"{theirs}.{name}.weight"] = ours[f"{mine}.weight"]
            state[f"{theirs}.{name}.bias"] = ours[f"{mine}.bias"]
    return {k: v.contiguous() for k, v in state.items()}


def to_bert(model: EncoderOnlyTransformer) -> Any:
    """A ``BertForMaskedLM`` (eval mode) computing ``model``'s logits over the exported
    vocabulary (``vocabulary(model.config)``).

    Raises:
        ConfigError: the architecture has no BERT equivalent.
    """
    from transformers import BertConfig, BertForMaskedLM

    c = model.config
    refuse(MODEL, problems(c), WHY)
    vocab = vocabulary(c)
    config = BertConfig(
        vocab_size=len(vocab.rows),
        hidden_size=c.d_model,
        num_hidden_layers=c.n_encoder_layers,
        num_attention_heads=c.n_heads,
        intermediate_size=c.d_ff,
        hidden_act=ACTIVATIONS[c.activation],
        hidden_dropout_prob=c.dropout,
        attention_probs_dropout_prob=c.attention_dropout,
        max_position_embeddings=c.positions_held,
        type_vocab_size=2,
        layer_norm_eps=c.layer_norm_eps,
        pad_token_id=vocab.id(PAD_ID),
        tie_word_embeddings=c.tie_embeddings,
    )
    bert = BertForMaskedLM(config)
    computed: tuple[str, ...] = ("position_ids", "token_type_ids", "decoder.bias")
    if c.tie_embeddings:
        computed += ("decoder.weight",)
    bert = load_exact(bert, bert_state(model, vocab), computed)
    bert.tie_weights()
    return bert


def export_bert(checkpoint: Checkpoint, folder: Path) -> None:
    """The whole BERT export of ``checkpoint`` into the (new, empty) ``folder``."""
    model = checkpoint.model
    assert isinstance(model, EncoderOnlyTransformer)
    to_bert(model).save_pretrained(str(folder))
    config = checkpoint.model_config
    fast = exported_tokenizer(
        checkpoint.tokenizers.source,
        vocabulary(config),
        config.max_len,
        input_names=("input_ids", "token_type_ids", "attention_mask"),
    )
    save_tokenizer(fast, folder)
    (folder / README).write_text(bert_readme(config), encoding="utf-8")


def bert_readme(config: ModelConfig) -> str:
    """How to load and call the exported BERT."""
    framing = "`[CLS] text [SEP]`" if config.bos_first else "`text [SEP]` (no `[CLS]`)"
    return readme(
        "Hugging Face BERT model",
        """
from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

model = AutoModelForMaskedLM.from_pretrained(".")  # a BertForMaskedLM
tokenizer = AutoTokenizer.from_pretrained(".")  # a fast tokenizer
fill = pipeline("fill-mask", model=model, tokenizer=tokenizer)
print(fill(f"your {tokenizer.mask_token} here", top_k=5))
""",
        f"""
- the tokenizer frames a text as tformer reads it: {framing}; tformer's
  `<pad> <unk> <bos> <eos> <mask>` are `[PAD] [UNK] [CLS] [SEP] [MASK]` (ids 0..4);
- tformer's segment vector is every token-type row (tformer reads single texts).
""",
    )
