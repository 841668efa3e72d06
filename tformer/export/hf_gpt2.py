"""A decoder-only checkpoint as a Hugging Face ``GPT2LMHeadModel`` (the inverse of
``tformer.imports.gpt2``).

GPT-2 is pre-norm LayerNorm blocks with a final norm, a position table, biases everywhere and
an ungated feed-forward; its linear layers are ``Conv1D`` (input x output), so each weight is
transposed, and ``c_attn`` holds W^Q, W^K, W^V side by side. What tformer adds and GPT-2 has
not is folded into its weights exactly: the √d_model embedding scale (into ``wte``, and out of
``ln_f`` when the output is tied), the paper's sinusoids (as ``wpe``), a segment vector (into
``wpe``), the output rescaling (into ``ln_f``), and a logits bias (GPT-2 has none: into an own
``lm_head`` and ``ln_f``'s bias, through LayerNorm's zero-mean output, below).

The vocabulary: a checkpoint imported from GPT-2 (its logits bias -10,000 at <pad>, <bos> and
<unk>: rows GPT-2 has not, <bos> a copy of <eos>) exports GPT-2's own, those three rows left out
and <eos> as <|endoftext|>, the last id as in GPT-2's; any other keeps tformer's rows and
tokenizer, the tokenizer putting <bos> before every text as tformer reads a prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tformer.checkpoint.store import Checkpoint
from tformer.config import BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, UNK, UNK_ID, ModelConfig
from tformer.errors import ConfigError
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
    set_generation,
    unsupported,
)
from tformer.imports.common import NEVER
from tformer.model.families import DecoderOnlyTransformer

MODEL = "GPT2LMHeadModel"
EOT = "<|endoftext|>"
# tformer's activation -> transformers' name for it (gelu_new is the tanh approximation).
ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}
WHY = (
    "GPT-2 has pre-norm LayerNorm blocks, a position table, multi-head attention scaled by "
    "1/sqrt(d_k), ungated relu/gelu/gelu_tanh/silu feed-forward layers and biases"
)


def problems(config: ModelConfig) -> list[str]:
    """The options of a decoder-only ``config`` GPT-2 has no equivalent for, as flags."""
    return unsupported(
        config,
        allowed={
            "norm": ("pre",),
            "normalization": ("layernorm",),
            "positions": ("learned", "sinusoidal"),
            "kv_heads": (),
            "activation": tuple(ACTIVATIONS),
            "attention_scale": (True,),
            "linear_bias": (True,),
            "embedding_norm": (False,),
        },
    )


def vocabulary(model: DecoderOnlyTransformer) -> Vocabulary:
    """GPT-2's vocabulary where the model is GPT-2's (see the module), else tformer's."""
    size = model.config.tgt_vocab_size
    bias = model.logits_bias
    if bias is not None and bool((bias.detach()[[PAD_ID, BOS_ID, UNK_ID]] <= NEVER / 2).all()):
        rows = [*range(4, size), EOS_ID]
        roles = {"bos_token": EOS_ID, "eos_token": EOS_ID, "unk_token": EOS_ID}
        return Vocabulary(rows, {EOS_ID: EOT}, roles)
    roles = {"pad_token": PAD_ID, "bos_token": BOS_ID, "eos_token": EOS_ID, "unk_token": UNK_ID}
    return Vocabulary(list(range(size)), roles=roles, prefix=(BOS_ID,))


def fold_bias(
    weight: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """An output projection W' and final-norm bias β' with W'(γ⊙n + β') = W(γ⊙n + β) + b for
    every n of mean 0 (what LayerNorm normalises to): W'_v = W_v + c_v / γ, β' = β + tγ, with
    t chosen so that Σ β'/γ = d and c_v = (b_v - t W_v·γ) / d.

    Raises:
        ConfigError: a feature of the final norm has a zero gain (no such W' exists).
    """
    if float(gamma.abs().min()) < 1e-6:
        raise ConfigError(
            "--to huggingface: the final layer norm has a zero gain, so the logits bias "
            "(--output-bias) cannot be folded into GPT-2's weights (GPT-2 has no logits bias)"
        )
    w, g, b0, b = (x.double() for x in (weight, gamma, beta, bias))
    d = g.numel()
    t = (d - float((b0 / g).sum())) / d
    c = (b - t * (w @ g)) / d
    return (w + c[:, None] / g[None, :]).float(), (b0 + t * g).float()


def gpt2_state(model: DecoderOnlyTransformer, vocab: Vocabulary) -> tuple[dict[str, Any], bool]:
    """GPT2LMHeadModel's weights of ``model``, and whether its output is tied to ``wte``."""
    c = model.config
    ours = float_state(model)
    dec = model.decoder
    wte = vocab.take(input_embedding(dec, c))
    gamma, beta = ours["decoder.final_norm.weight"], ours["decoder.final_norm.bias"]
    out_scale = c.d_model**-0.5 if c.output_scale else 1.0
    bias = vocab.take(ours["logits_bias"]) if model.logits_bias is not None else None
    folds_bias = bias is not None and float(bias.max() - bias.min()) > 0.0
    tied = c.tie_embeddings and not folds_bias
    # What ln_f must output: tformer's final norm times its rescaling, over wte's scale when
    # tied (wte holds the embedding times √d_model, tformer's output reads it unscaled).
    factor = out_scale / (embedding_scale(c) if tied else 1.0)
    gamma, beta = gamma * factor, beta * factor
    state: dict[str, Any] = {
        "transformer.wte.weight": wte,
        "transformer.wpe.weight": position_table(dec, c) + segment(dec, c),
    }
    if not tied:
        head = vocab.take(model.output_weight().detach().float())
        if folds_bias:
            assert bias is not None
            head, beta = fold_bias(head, gamma, beta, bias)
        state["lm_head.weight"] = head
    state["transformer.ln_f.weight"], state["transformer.ln_f.bias"] = gamma, beta
    for i in range(c.n_decoder_layers):
        ours_l, theirs = f"decoder.layers.{i}", f"transformer.h.{i}"
        at = f"{ours_l}.self_attn"
        state.update({
            f"{theirs}.ln_1.weight": ours[f"{ours_l}.norm1.weight"],
            f"{theirs}.ln_1.bias": ours[f"{ours_l}.norm1.bias"],
            f"{theirs}.attn.c_attn.weight": torch.cat(
                [ours[f"{at}.q_proj.weight"], ours[f"{at}.kv_proj.weight"]]).t(),
            f"{theirs}.attn.c_attn.bias": torch.cat(
                [ours[f"{at}.q_proj.bias"], ours[f"{at}.kv_proj.bias"]]),
            f"{theirs}.attn.c_proj.weight": ours[f"{at}.out_proj.weight"].t(),
            f"{theirs}.attn.c_proj.bias": ours[f"{at}.out_proj.bias"],
            f"{theirs}.ln_2.weight": ours[f"{ours_l}.norm3.weight"],
            f"{theirs}.ln_2.bias": ours[f"{ours_l}.norm3.bias"],
            f"{theirs}.mlp.c_fc.weight": ours[f"{ours_l}.feed_forward.w1.weight"].t(),
            f"{theirs}.mlp.c_fc.bias": ours[f"{ours_l}.feed_forward.w1.bias"],
            f"{theirs}.mlp.c_proj.weight": ours[f"{ours_l}.feed_forward.w2.weight"].t(),
            f"{theirs}.mlp.c_proj.bias": ours[f"{ours_l}.feed_forward.w2.bias"],
        })  # fmt: skip
    return {k: v.contiguous() for k, v in state.items()}, tied


def to_gpt2(model: DecoderOnlyTransformer) -> Any:
    """A ``GPT2LMHeadModel`` (eval mode) computing ``model``'s logits over the exported
    vocabulary (``vocabulary(model)``).

    Raises:
        ConfigError: the architecture has no GPT-2 equivalent.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    c = model.config
    refuse(MODEL, problems(c), WHY)
    vocab = vocabulary(model)
    state, tied = gpt2_state(model, vocab)
    eos = vocab.id(EOS_ID)
    config = GPT2Config(
        vocab_size=len(vocab.rows),
        n_positions=c.positions_held,
        n_embd=c.d_model,
        n_layer=c.n_decoder_layers,
        n_head=c.n_heads,
        n_inner=c.d_ff,
        activation_function=ACTIVATIONS[c.activation],
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.attention_dropout,
        layer_norm_epsilon=c.layer_norm_eps,
        bos_token_id=vocab.id(vocab.roles["bos_token"]),
        eos_token_id=eos,
        tie_word_embeddings=tied,
    )
    computed = (".attn.bias", ".masked_bias", *(("lm_head.weight",) if tied else ()))
    gpt2 = load_exact(GPT2LMHeadModel(config), state, computed)
    if tied:
        gpt2.tie_weights()
    never = [vocab.id(i) for i in (PAD_ID, BOS_ID) if i in vocab.rows]
    set_generation(
        gpt2,
        bos_token_id=config.bos_token_id,
        eos_token_id=eos,
        pad_token_id=vocab.id(PAD_ID) if PAD_ID in vocab.rows else eos,
        suppress_tokens=never or None,
    )
    return gpt2


def export_gpt2(checkpoint: Checkpoint, folder: Path) -> None:
    """The whole GPT-2 export of ``checkpoint`` into the (new, empty) ``folder``."""
    model = checkpoint.model
    assert isinstance(model, DecoderOnlyTransformer)
    to_gpt2(model).save_pretrained(str(folder))
    vocab = vocabulary(model)
    fast = exported_tokenizer(
        checkpoint.tokenizers.target,
        vocab,
        checkpoint.model_config.max_len,
        input_names=("input_ids", "attention_mask"),
    )
    save_tokenizer(fast, folder)
    (folder / README).write_text(gpt2_readme(vocab), encoding="utf-8")


def gpt2_readme(vocab: Vocabulary) -> str:
    """How to load and call the exported GPT-2."""
    if vocab.prefix:
        framing = (
            f"- the tokenizer puts `{BOS}` before every text, as tformer reads a prompt; "
            f"`{PAD}` and `{BOS}` are never generated (`suppress_tokens`);"
        )
    else:
        framing = (
            f"- GPT-2's vocabulary: tformer's `{EOS}` is `{EOT}` (the last id), its `{PAD}`, "
            f"`{BOS}` and `{UNK}` rows (never predicted) are left out; the tokenizer adds "
            "nothing to a text, as GPT-2's;"
        )
    return readme(
        "Hugging Face GPT-2 model",
        """
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained(".")  # a GPT2LMHeadModel
tokenizer = AutoTokenizer.from_pretrained(".")  # a fast tokenizer
batch = tokenizer(["your text here"], return_tensors="pt")
output = model.generate(**batch, max_new_tokens=20)  # greedy
print(tokenizer.batch_decode(output, skip_special_tokens=True))
""",
        f"""
{framing}
- `generation_config.json`: greedy, ends at `{EOS}`; the length is the caller's
  (`max_new_tokens`).
""",
    )
