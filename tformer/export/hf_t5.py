"""An encoder-decoder checkpoint with T5's variants as a Hugging Face
``T5ForConditionalGeneration`` (the inverse of ``tformer.imports.t5``).

T5 is pre-norm RMSNorm layers with a final norm per stack, the bucketed relative position bias
(one table per stack), no biases, one embedding shared by both sides and the output (transformers
5 always ties it), and with v1.0 the output rescaled by d_model^-0.5 (``scale_decoder_outputs``,
tformer's ``--output-scale``). tformer's scaled attention scores are folded into W^Q (×
d_k^-0.5), its √d_model embedding scale into the shared embedding (and out of the decoder's
final norm). Feed-forward layers: relu, gelu, gelu_tanh, silu, and gated swiglu / geglu_tanh
(``gated-silu``, ``gated-gelu``).

The vocabulary: T5 has no <bos> and starts decoding from its <pad>, so tformer's <bos> is the
exported ``<pad>`` (id 0), <eos> ``</s>`` (1), <unk> ``<unk>`` (2), every other row in its
order; tformer's own <pad> row (never predicted, padding only) is left out. An imported T5 thus
gets its own ids back. With ``--source-eos`` the tokenizer closes every text with ``</s>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tformer.checkpoint.store import Checkpoint
from tformer.config import BOS_ID, EOS_ID, UNK_ID, ModelConfig
from tformer.export.hf_common import (
    README,
    Vocabulary,
    embedding_scale,
    exported_tokenizer,
    float_state,
    input_embedding,
    load_exact,
    readme,
    refuse,
    save_tokenizer,
    set_generation,
    unsupported,
)
from tformer.model import Transformer

MODEL = "T5ForConditionalGeneration"
# tformer's activation -> T5Config.feed_forward_proj.
FEED_FORWARDS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_tanh": "gelu_new",
    "silu": "silu",
    "swiglu": "gated-silu",
    "geglu_tanh": "gated-gelu",
}
WHY = (
    "T5 has pre-norm RMSNorm layers, relative positions, multi-head attention, no biases, one "
    "vocabulary and one embedding tied to the output, and no gated erf GELU"
)


def problems(config: ModelConfig) -> list[str]:
    """The options of a relative-position encoder-decoder ``config`` T5 cannot express."""
    return unsupported(
        config,
        allowed={
            "norm": ("pre",),
            "normalization": ("rmsnorm",),
            "kv_heads": (),
            "activation": tuple(FEED_FORWARDS),
            "linear_bias": (False,),
            "share_embeddings": (True,),
            "tie_embeddings": (True,),
            "embedding_norm": (False,),
            "segment_embedding": (False,),
        },
    )


def vocabulary(config: ModelConfig) -> Vocabulary:
    """T5's vocabulary of tformer's rows (see the module)."""
    names = {BOS_ID: "<pad>", EOS_ID: "</s>", UNK_ID: "<unk>"}
    roles = {"pad_token": BOS_ID, "eos_token": EOS_ID, "unk_token": UNK_ID}
    suffix = (EOS_ID,) if config.source_eos else ()
    return Vocabulary(list(range(1, config.src_vocab_size)), names, roles, suffix=suffix)


def t5_state(model: Transformer, vocab: Vocabulary) -> dict[str, torch.Tensor]:
    """T5ForConditionalGeneration's weights of ``model``."""
    c = model.config
    d = c.d_model
    ours = float_state(model)
    q_scale = c.d_head**-0.5 if c.attention_scale else 1.0
    state = {"shared.weight": vocab.take(input_embedding(model.encoder, c))}
    for side, count in (("encoder", c.n_encoder_layers), ("decoder", c.n_decoder_layers)):
        table = f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        state[table] = ours[f"{side}.relative.table.weight"]
        final = ours[f"{side}.final_norm.weight"]
        # The shared embedding carries tformer's scale; the output reads it unscaled.
        state[f"{side}.final_layer_norm.weight"] = (
            final / embedding_scale(c) if side == "decoder" else final
        )
        parts = [("SelfAttention", "self_attn", "norm1")]
        if side == "decoder":
            parts.append(("EncDecAttention", "cross_attn", "norm2"))
        ff_norm = "norm3" if side == "decoder" else "norm2"
        for i in range(count):
            theirs, ours_l = f"{side}.block.{i}.layer", f"{side}.layers.{i}"
            for j, (name, mine, norm) in enumerate(parts):
                at, kv = f"{theirs}.{j}.{name}", ours[f"{ours_l}.{mine}.kv_proj.weight"]
                state[f"{at}.q.weight"] = ours[f"{ours_l}.{mine}.q_proj.weight"] * q_scale
                state[f"{at}.k.weight"], state[f"{at}.v.weight"] = kv[:d], kv[d:]
                state[f"{at}.o.weight"] = ours[f"{ours_l}.{mine}.out_proj.weight"]
                state[f"{theirs}.{j}.layer_norm.weight"] = ours[f"{ours_l}.{norm}.weight"]
            dense, ff = f"{theirs}.{len(parts)}.DenseReluDense", f"{ours_l}.feed_forward"
            if c.gated:
                state[f"{dense}.wi_0.weight"] = ours[f"{ff}.w1.weight"]
                state[f"{dense}.wi_1.weight"] = ours[f"{ff}.v.weight"]
            else:
                state[f"{dense}.wi.weight"] = ours[f"{ff}.w1.weight"]
            state[f"{dense}.wo.weight"] = ours[f"{ff}.w2.weight"]
            state[f"{theirs}.{len(parts)}.layer_norm.weight"] = ours[f"{ours_l}.{ff_norm}.weight"]
    return {k: v.contiguous() for k, v in state.items()}


def to_t5(model: Transformer) -> Any:
    """A ``T5ForConditionalGeneration`` (eval mode) computing ``model``'s logits over the
    exported vocabulary (``vocabulary(model.config)``).

    Raises:
        ConfigError: the architecture has no T5 equivalent.
    """
    from transformers import T5Config, T5ForConditionalGeneration

    c = model.config
    refuse(MODEL, problems(c), WHY)
    vocab = vocabulary(c)
    start, eos = vocab.id(BOS_ID), vocab.id(EOS_ID)
    config = T5Config(
        vocab_size=len(vocab.rows),
        d_model=c.d_model,
        d_kv=c.d_head,
        d_ff=c.ffn_hidden,
        num_layers=c.n_encoder_layers,
        num_decoder_layers=c.n_decoder_layers,
        num_heads=c.n_heads,
        relative_attention_num_buckets=c.relative_buckets,
        relative_attention_max_distance=c.relative_max_distance,
        dropout_rate=c.dropout,
        layer_norm_epsilon=c.layer_norm_eps,
        feed_forward_proj=FEED_FORWARDS[c.activation],
        pad_token_id=start,
        eos_token_id=eos,
        decoder_start_token_id=start,
        # transformers 5 ties T5's output always; this key now says whether it is rescaled
        tie_word_embeddings=c.output_scale,
    )
    config.scale_decoder_outputs = c.output_scale
    t5 = T5ForConditionalGeneration(config)
    t5 = load_exact(t5, t5_state(model, vocab), ("embed_tokens.weight", "lm_head.weight"))
    t5.tie_weights()
    set_generation(
        t5,
        max_new_tokens=c.max_len,
        decoder_start_token_id=start,
        pad_token_id=start,
        eos_token_id=eos,
        suppress_tokens=[start],  # tformer never predicts <bos>
    )
    return t5


def export_t5(checkpoint: Checkpoint, folder: Path) -> None:
    """The whole T5 export of ``checkpoint`` into the (new, empty) ``folder``."""
    model = checkpoint.model
    assert isinstance(model, Transformer)
    to_t5(model).save_pretrained(str(folder))
    config = checkpoint.model_config
    fast = exported_tokenizer(
        checkpoint.tokenizers.source,
        vocabulary(config),
        config.max_len,
        input_names=("input_ids", "attention_mask"),
    )
    save_tokenizer(fast, folder)
    (folder / README).write_text(t5_readme(config), encoding="utf-8")


def t5_readme(config: ModelConfig) -> str:
    """How to load and call the exported T5."""
    sources = "closes every text with `</s>`" if config.source_eos else "adds nothing to a text"
    return readme(
        "Hugging Face T5 model",
        """
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

model = AutoModelForSeq2SeqLM.from_pretrained(".")  # a T5ForConditionalGeneration
tokenizer = AutoTokenizer.from_pretrained(".")  # a fast tokenizer
batch = tokenizer(["your input here"], return_tensors="pt", padding=True)
output = model.generate(**batch)  # greedy
print(tokenizer.batch_decode(output, skip_special_tokens=True))
""",
        f"""
- the tokenizer {sources}; decoding starts from `<pad>` (id 0, tformer's `<bos>`), which is
  never generated (`suppress_tokens`), and ends at `</s>` (id 1);
- `generation_config.json`: greedy, at most max_len new tokens (`max_new_tokens`, which a call
  may change).
""",
    )
