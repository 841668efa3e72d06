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
from tformer.imports.marian import (
    CONFIG,
    NEVER,
    Imported,
    _Tensors,
    one_tokenizer_import,
    open_weights,
    origin_of,
    rows_in_order,
    transformers_config,
)

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


def gpt2_config(folder: Path) -> Any:
    """The folder's checked ``GPT2Config``.

    Raises:
        CheckpointError: naming every setting tformer cannot express, in one line.
        ConfigError: transformers is not installed.
    """
    config = transformers_config(folder, "GPT2Config")
    problems = []
    if config.activation_function not in ACTIVATIONS:
        problems.append(f"activation_function {config.activation_function!r}")
    if config.scale_attn_by_inverse_layer_idx:
        problems.append("scale_attn_by_inverse_layer_idx")
    if not config.scale_attn_weights:
        problems.append("scale_attn_weights false (unscaled attention scores)")
    if config.add_cross_attention:
        problems.append("add_cross_attention")
    if config.n_embd % config.n_head:
        problems.append(f"n_embd {config.n_embd} not divisible by n_head {config.n_head}")
    if problems:
        raise CheckpointError(
            f"{folder / CONFIG}: {'; '.join(problems)}: tformer has no equivalent, so this "
            "model cannot be imported"
        )
    return config


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
    config = gpt2_config(folder)
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
    with open_weights(folder) as saved:
        weights = unprefixed(saved, "transformer.")
        state = gpt2_state(weights, config, order)
        # The causal-mask buffers older versions saved are not weights; a tied lm_head is wte.
        weights.done(
            {k for k in weights.left if k.endswith((".attn.bias", ".attn.masked_bias"))}
            | ({"lm_head.weight"} if config.tie_word_embeddings else set())
        )
    origin = origin_of(source, folder, config, type(hf_tokenizer).__name__)
    return one_tokenizer_import(gpt2_model_config(config, len(order)), state, tokenizer, origin)


class _Unprefixed:
    """A safetensors handle whose names lose ``prefix`` (GPT2LMHeadModel saves its body as
    ``transformer.*``, GPT2Model without it)."""

    def __init__(self, handle: Any, prefix: str) -> None:
        self.handle = handle
        self.names = {key.removeprefix(prefix): key for key in handle.keys()}

    def keys(self) -> list[str]:
        return list(self.names)

    def get_slice(self, key: str) -> Any:
        return self.handle.get_slice(self.names[key])

    def get_tensor(self, key: str) -> torch.Tensor:
        tensor: torch.Tensor = self.handle.get_tensor(self.names[key])
        return tensor


def unprefixed(weights: _Tensors, prefix: str) -> _Tensors:
    """``weights`` with ``prefix`` left out of their names."""
    return _Tensors(_Unprefixed(weights.handle, prefix), weights.path)


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


def gpt2_state(weights: _Tensors, config: Any, order: list[int | None]) -> dict[str, torch.Tensor]:
    """tformer's state dict of GPT-2's tensors (Conv1D weights transposed)."""
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
