"""A Hugging Face ``GPT2LMHeadModel`` folder as a decoder-only tformer model and tokenizer.

GPT-2 (Radford et al. 2019) is tformer's decoder-only family with variants: pre-norm blocks and
a final layer norm (``norm: pre``), learned positions, the tanh GELU (``gelu_tanh``), token
embeddings added unscaled (``embedding_scale: false``) and its LayerNorm epsilon. Its linear
layers are ``Conv1D`` (weights stored input x output), so each is transposed; ``c_attn`` holds
W^Q, W^K and W^V side by side.

GPT-2's one special token ``<|endoftext|>`` ends every document and starts the next, so it is
tformer's ``<eos>`` and also its ``<bos>``: tformer reads ``<bos>`` before a prompt, which GPT-2
sees as the <|endoftext|> its training documents follow. ``<pad>`` and ``<unk>`` are new rows
(GPT-2's byte-level BPE has no unknown token). The logits bias keeps <pad>, <bos> and <unk>
from ever being predicted, so probabilities are GPT-2's over its own vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tformer.config import BOS_ID, PAD_ID, UNK_ID, ModelConfig
from tformer.data.hf_tokenizers import fast_tokenizer, reordered_tokenizer
from tformer.errors import CheckpointError
from tformer.imports.common import NEVER, Imported, Key, family_config, one_tokenizer_import
from tformer.imports.weights import Tensors, rows_in_order
from tformer.paths import excerpt

# transformers' ACT2FN names -> tformer's ("gelu_new" and "gelu_pytorch_tanh" are the tanh GELU).
ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


# What config.json's keys must hold, and the tformer setting each becomes.
KEYS: dict[str, Key] = {
    "n_embd": Key.width(),
    "n_head": Key.heads(),
    "n_layer": Key.layers("n_decoder_layers"),
    "n_inner": Key.ffn(null=True),
    "n_positions": Key.positions(),
    "vocab_size": Key.vocab(),
    "resid_pdrop": Key.fraction("dropout"),
    "attn_pdrop": Key.fraction("attention_dropout"),
    "layer_norm_epsilon": Key.epsilon(),
    "eos_token_id": Key.token_id(null=True),
    "activation_function": Key.text(),
    "scale_attn_by_inverse_layer_idx": Key.flag(),
    "scale_attn_weights": Key.flag(),
    "add_cross_attention": Key.flag(),
}


def _problems(config: Any) -> list[str]:
    problems = []
    if config.activation_function not in ACTIVATIONS:
        problems.append(f"activation_function {excerpt(config.activation_function)}")
    if config.scale_attn_by_inverse_layer_idx:
        problems.append("scale_attn_by_inverse_layer_idx")
    if not config.scale_attn_weights:
        problems.append("scale_attn_weights false (unscaled attention scores)")
    if config.add_cross_attention:
        problems.append("add_cross_attention")
    if config.n_embd % config.n_head:
        problems.append(f"n_embd {config.n_embd} not divisible by n_head {config.n_head}")
    return problems


def gpt2_order(size: int, eot: int) -> list[int | None]:
    """GPT-2's ids in tformer's order: <pad> new, <bos> and <eos> both <|endoftext|>, <unk>
    new, then every other id in its order."""
    return [None, eot, eot, None, *(i for i in range(size) if i != eot)]


def read_gpt2(folder: Path, *, source: str) -> Imported:
    """Read a ``save_pretrained`` GPT2LMHeadModel folder (with its GPT-2 tokenizer).

    Raises:
        CheckpointError: a setting tformer cannot express, missing tokenizer files, or weights
            that do not match their config.
        ConfigError: transformers is not installed.
    """
    checked = family_config(folder, "GPT2Config", "gpt2", KEYS, _problems)
    config = checked.config
    hf_tokenizer = fast_tokenizer(folder, "gpt2")
    eot = config.eos_token_id if config.eos_token_id is not None else hf_tokenizer.eos_token_id
    size = config.vocab_size
    if eot is None or not 0 <= eot < size or len(hf_tokenizer) != size:
        raise CheckpointError(
            f"{folder}: the tokenizer ({len(hf_tokenizer)} tokens, <|endoftext|> {eot}) does "
            f"not fit the model's vocab_size {size}"
        )
    order = gpt2_order(size, eot)
    tokenizer = reordered_tokenizer(
        hf_tokenizer.backend_tokenizer, order, mask=False, where=str(folder)
    )
    # The causal-mask buffers older versions saved are not weights; a tied lm_head is wte.
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    return one_tokenizer_import(
        checked,
        source,
        (tokenizer, type(hf_tokenizer).__name__),
        lambda: gpt2_model_config(config, len(order)),
        lambda weights: gpt2_state(weights, config, order),
        lambda name: name.endswith((".attn.bias", ".attn.masked_bias")) or name in tied,
        prefix="transformer.",
    )


def gpt2_model_config(config: Any, vocab_size: int) -> ModelConfig:
    """tformer's architecture of a (checked) ``GPT2Config`` with ``vocab_size`` rows."""
    return ModelConfig(
        arch="decoder-only",
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        d_model=config.n_embd,
        n_heads=config.n_head,
        n_decoder_layers=config.n_layer,
        d_ff=config.n_inner or 4 * config.n_embd,
        dropout=config.resid_pdrop,
        attention_dropout=config.attn_pdrop,
        norm="pre",
        activation=ACTIVATIONS[config.activation_function],  # type: ignore[arg-type]
        max_len=config.n_positions,
        positions="learned",
        tie_embeddings=bool(config.tie_word_embeddings),
        output_bias=True,
        embedding_scale=False,
        norm_eps=config.layer_norm_epsilon,
        document_bos=False,  # documents joined by <|endoftext|> alone, as GPT-2 read them
    )


def gpt2_state(weights: Tensors, config: Any, order: list[int | None]) -> dict[str, torch.Tensor]:
    """tformer's state dict of GPT-2's tensors (Conv1D weights transposed; their names without
    ``transformer.``: ``open_weights(folder, "transformer.")``)."""
    d, f = config.n_embd, config.n_inner or 4 * config.n_embd
    size = config.vocab_size
    wte = weights.take("wte.weight", (size, d))
    state = {
        "decoder.embedding.embedding.weight": rows_in_order(wte, order),
        "decoder.positions.table.weight": weights.take("wpe.weight", (config.n_positions, d)),
        "decoder.final_norm.weight": weights.take("ln_f.weight", (d,)),
        "decoder.final_norm.bias": weights.take("ln_f.bias", (d,)),
    }
    if not config.tie_word_embeddings:
        head = weights.take("lm_head.weight", (size, d))
        state["output_projection.weight"] = rows_in_order(head, order)
    bias = torch.zeros(len(order))
    bias[[PAD_ID, BOS_ID, UNK_ID]] = NEVER  # new rows, and <bos> (a copy of <eos>)
    state["logits_bias"] = bias
    for i in range(config.n_layer):
        theirs, ours = f"h.{i}", f"decoder.layers.{i}"
        qkv = weights.take(f"{theirs}.attn.c_attn.weight", (d, 3 * d)).t()
        qkv_b = weights.take(f"{theirs}.attn.c_attn.bias", (3 * d,))
        state.update({
            f"{ours}.self_attn.q_proj.weight": qkv[:d], f"{ours}.self_attn.q_proj.bias": qkv_b[:d],
            f"{ours}.self_attn.kv_proj.weight": qkv[d:],
            f"{ours}.self_attn.kv_proj.bias": qkv_b[d:],
            f"{ours}.self_attn.out_proj.weight": weights.take(
                f"{theirs}.attn.c_proj.weight", (d, d)).t(),
            f"{ours}.self_attn.out_proj.bias": weights.take(f"{theirs}.attn.c_proj.bias", (d,)),
            f"{ours}.feed_forward.w1.weight": weights.take(
                f"{theirs}.mlp.c_fc.weight", (d, f)).t(),
            f"{ours}.feed_forward.w1.bias": weights.take(f"{theirs}.mlp.c_fc.bias", (f,)),
            f"{ours}.feed_forward.w2.weight": weights.take(
                f"{theirs}.mlp.c_proj.weight", (f, d)).t(),
            f"{ours}.feed_forward.w2.bias": weights.take(f"{theirs}.mlp.c_proj.bias", (d,)),
        })  # fmt: skip
        for name, mine in (("ln_1", "norm1"), ("ln_2", "norm3")):
            state[f"{ours}.{mine}.weight"] = weights.take(f"{theirs}.{name}.weight", (d,))
            state[f"{ours}.{mine}.bias"] = weights.take(f"{theirs}.{name}.bias", (d,))
    return {k: v.contiguous() for k, v in state.items()}
