"""A checkpoint as a CTranslate2 model: ``tformer export CKPT --to ctranslate2 OUT``.

The ``TransformerSpec`` is filled from tformer's weights directly, for every variant tformer
trains: post- or pre-norm, ReLU, GELU or SiLU, shared or separate vocabularies, tied or untied
output projection. The spec needs no permutation: it takes tformer's own (interleaved)
sinusoidal table, and its attention layers take fused projections laid out as tformer's
``q_proj`` / ``kv_proj``. Going through Hugging Face Marian and CTranslate2's Transformers
converter would not work: that loader starts the decoder from a zero vector (Marian starts
from <pad>; tformer from <bos>) and drops the embeddings' last row.

The vocabularies are the tokenizers' own token strings in id order, so the tokenizer files
copied beside the model turn text into what ``translate_batch`` reads and back. tformer never
predicts <pad> or <bos> (``tformer.decoding.logits.mask_special_tokens``): the output
projection gets a bias of -inf at those two ids, so the exported model behaves the same
without any decoding option.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from tformer.checkpoint.store import Checkpoint, Tokenizers
from tformer.config import BOS, BOS_ID, EOS, PAD_ID, UNK
from tformer.data.tokenizer import Tokenizer
from tformer.errors import CheckpointError
from tformer.model import Transformer
from tformer.model.layers import RMS_NORM_EPS

README = "README.md"


def vocabulary(tokenizer: Tokenizer, where: str) -> list[str]:
    """The tokenizer's token strings in id order (what CTranslate2 reads and writes).

    Raises:
        CheckpointError: an id has no token or two ids share one (CTranslate2 maps each
            string to one id).
    """
    tokens = [tokenizer.inner.id_to_token(i) for i in range(tokenizer.vocab_size)]
    missing = [i for i, token in enumerate(tokens) if token is None]
    if missing:
        raise CheckpointError(f"{where}: token id {missing[0]} has no token string")
    seen: dict[str, int] = {}
    for i, token in enumerate(tokens):
        assert token is not None  # checked above
        if token in seen:
            raise CheckpointError(
                f"{where}: ids {seen[token]} and {i} share the token {token!r}; CTranslate2 "
                "needs one string per id"
            )
        seen[token] = i
    return [t for t in tokens if t is not None]


def special_token_bias(vocab_size: int) -> torch.Tensor:
    """(V,) zeros with -inf at <pad> and <bos>: tformer never predicts either."""
    bias = torch.zeros(vocab_size)
    bias[[PAD_ID, BOS_ID]] = float("-inf")
    return bias


def output_bias(model: Transformer) -> torch.Tensor:
    """(V,) the bias an export puts on the logits: -inf at <pad> and <bos> (never predicted),
    plus the model's own logits bias where it has one (``output_bias``)."""
    bias = special_token_bias(model.config.tgt_vocab_size)
    if model.logits_bias is not None:
        bias = bias + model.logits_bias.detach().float().cpu()
    return bias


def transformer_spec(
    model: Transformer, source_vocabulary: list[str], target_vocabulary: list[str]
) -> Any:
    """The ``ctranslate2.specs.TransformerSpec`` of ``model`` (float32, not yet quantised)."""
    from ctranslate2.specs import common_spec
    from ctranslate2.specs import transformer_spec as specs

    c = model.config
    weights = {name: tensor.detach().float() for name, tensor in model.state_dict().items()}
    activations = {
        "relu": common_spec.Activation.RELU,
        "gelu": common_spec.Activation.GELU,  # the exact (erf) GELU, as torch's
        "silu": common_spec.Activation.SWISH,  # x * sigmoid(x), as F.silu
        "swiglu": common_spec.Activation.SWISH,  # gated: act(x W) * (x V), as GatedFeedForward
        "geglu": common_spec.Activation.GELU,
    }
    spec = specs.TransformerSpec.from_config(
        (c.n_encoder_layers, c.n_decoder_layers),
        c.n_heads,
        pre_norm=c.norm == "pre",  # post-norm: each layer norm follows its residual sum
        activation=activations[c.activation],
        ffn_glu=c.gated,
        rms_norm=c.normalization == "rmsnorm",
        # one key/value head for self- and cross-attention, as tformer's --kv-heads 1
        multi_query_attention=c.n_kv_heads == 1 and c.n_heads > 1,
    )
    for stack, name in ((spec.encoder, "encoder"), (spec.decoder, "decoder")):
        stack.scale_embeddings = True  # x sqrt(d_model), as tformer's TokenEmbedding
        # Added to the scaled embeddings: the sinusoids (not in the state dict: a function of
        # the config), or each stack's own learned table.
        stack.position_encodings.encodings = position_table(model, name)
        if c.norm == "pre":
            _norm(stack.layer_norm, weights, f"{name}.final_norm")
    spec.encoder.embeddings[0].weight = weights["encoder.embedding.embedding.weight"]
    spec.decoder.embeddings.weight = weights["decoder.embedding.embedding.weight"]
    spec.decoder.projection.weight = model.output_weight().detach().float()
    spec.decoder.projection.bias = output_bias(model)
    for i, layer in enumerate(spec.encoder.layer):
        _encoder_layer(layer, weights, f"encoder.layers.{i}")
    for i, layer in enumerate(spec.decoder.layer):
        _decoder_layer(layer, weights, f"decoder.layers.{i}")
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = UNK, BOS, EOS
    spec.config.decoder_start_token = BOS
    spec.config.add_source_eos = c.source_eos  # the <eos> closing each source, as Marian's
    # torch's LayerNorm default (not CTranslate2's), or tformer's RMSNorm epsilon
    spec.config.layer_norm_epsilon = RMS_NORM_EPS if c.normalization == "rmsnorm" else 1e-5
    spec.register_source_vocabulary(source_vocabulary)
    spec.register_target_vocabulary(target_vocabulary)
    spec.validate()
    return spec


def position_table(model: Transformer, stack: str) -> torch.Tensor:
    """The (max_len, D) table ``stack`` ("encoder" / "decoder") adds to its embeddings."""
    table = getattr(model, stack).positions.vectors()
    assert table is not None  # RoPE is refused before export
    return table.detach().float()


def _linear(layer: Any, weights: dict[str, torch.Tensor], prefix: str) -> None:
    layer.weight, layer.bias = weights[f"{prefix}.weight"], weights[f"{prefix}.bias"]


def _norm(layer: Any, weights: dict[str, torch.Tensor], prefix: str) -> None:
    layer.gamma = weights[f"{prefix}.weight"]
    if f"{prefix}.bias" in weights:  # LayerNorm; RMSNorm has no bias
        layer.beta = weights[f"{prefix}.bias"]


def _feed_forward(layer: Any, weights: dict[str, torch.Tensor], prefix: str) -> None:
    _linear(layer.linear_0, weights, f"{prefix}.w1")
    if hasattr(layer, "linear_0_noact"):  # gated: V, the linear half
        _linear(layer.linear_0_noact, weights, f"{prefix}.v")
    _linear(layer.linear_1, weights, f"{prefix}.w2")


def _attention(
    layer: Any, weights: dict[str, torch.Tensor], prefix: str, *, self_attention: bool
) -> None:
    # Self-attention: one fused [q; k; v] projection. Cross-attention: q, then [k; v].
    if self_attention:
        for part in ("weight", "bias"):
            q, kv = weights[f"{prefix}.q_proj.{part}"], weights[f"{prefix}.kv_proj.{part}"]
            setattr(layer.linear[0], part, torch.cat([q, kv]))
    else:
        _linear(layer.linear[0], weights, f"{prefix}.q_proj")
        _linear(layer.linear[1], weights, f"{prefix}.kv_proj")
    _linear(layer.linear[-1], weights, f"{prefix}.out_proj")


def _encoder_layer(layer: Any, weights: dict[str, torch.Tensor], prefix: str) -> None:
    _attention(layer.self_attention, weights, f"{prefix}.self_attn", self_attention=True)
    _norm(layer.self_attention.layer_norm, weights, f"{prefix}.norm1")
    _feed_forward(layer.ffn, weights, f"{prefix}.feed_forward")
    _norm(layer.ffn.layer_norm, weights, f"{prefix}.norm2")


def _decoder_layer(layer: Any, weights: dict[str, torch.Tensor], prefix: str) -> None:
    _attention(layer.self_attention, weights, f"{prefix}.self_attn", self_attention=True)
    _norm(layer.self_attention.layer_norm, weights, f"{prefix}.norm1")
    _attention(layer.attention, weights, f"{prefix}.cross_attn", self_attention=False)
    _norm(layer.attention.layer_norm, weights, f"{prefix}.norm2")
    _feed_forward(layer.ffn, weights, f"{prefix}.feed_forward")
    _norm(layer.ffn.layer_norm, weights, f"{prefix}.norm3")


def save_model(
    model: Transformer,
    folder: Path,
    source_vocabulary: list[str],
    target_vocabulary: list[str],
    quantization: str | None = None,
) -> None:
    """Write ``model`` into ``folder`` as CTranslate2's model.bin, config and vocabularies.

    ``quantization`` (int8, int8_float32, float16 ...) is CTranslate2's own: the weights are
    stored that way; None keeps float32 (a translator can still quantise when it loads).
    """
    spec = transformer_spec(model, source_vocabulary, target_vocabulary)
    spec.optimize(quantization=quantization)
    spec.save(str(folder))


def export_ctranslate2(checkpoint: Checkpoint, folder: Path, quantization: str | None) -> None:
    """The whole CTranslate2 export of ``checkpoint`` into the (new, empty) ``folder``:
    the model, the tokenizer file(s) as the checkpoint has them, and a README."""
    tokenizers = checkpoint.tokenizers
    files = tokenizers.files()
    source = vocabulary(tokenizers.source, str(checkpoint.path / files["source"]))
    target = vocabulary(tokenizers.target, str(checkpoint.path / files["target"]))
    model = checkpoint.model
    assert isinstance(model, Transformer)  # the export refused the one-stack families
    save_model(model, folder, source, target, quantization)
    for name in sorted(set(files.values())):
        shutil.copyfile(checkpoint.path / name, folder / name)
    (folder / README).write_text(
        readme(tokenizers, checkpoint.model_config.max_len, quantization), encoding="utf-8"
    )


def decoding_options(
    max_len: int,
    beam_size: int = 1,
    length_penalty: float = 1.0,
    max_new_tokens: int = 128,
    *,
    min_new_tokens: int = 0,
    n_best: int = 1,
) -> dict[str, Any]:
    """``translate_batch`` options that decode as tformer does with the same settings.

    tformer ranks beam hypotheses by sum log p / length ** length_penalty with the <eos>
    counted in the length; CTranslate2 counts it only with ``return_end_token=True`` (the
    <eos> is then in the output and is dropped by the caller). tformer reads at most
    ``max_len`` source tokens and decodes at most ``min(max_new_tokens, max_len)`` steps.
    Both forbid <eos> before ``min_new_tokens`` tokens; ``n_best`` hypotheses per input.
    """
    return {
        "beam_size": beam_size,  # always set: translate_batch defaults to 2
        "length_penalty": length_penalty,
        "return_end_token": True,
        "max_input_length": max_len,
        "max_decoding_length": min(max_new_tokens, max_len),
        "min_decoding_length": min_new_tokens,
        "num_hypotheses": n_best,
    }


def readme(tokenizers: Tokenizers, max_len: int, quantization: str | None) -> str:
    """How to load and call the exported model, with this checkpoint's file names."""
    files = tokenizers.files()
    weights = quantization or "float32"
    return f"""# CTranslate2 model exported by tformer

Weights stored as {weights}. Load and call it with only this folder:

```python
from pathlib import Path

import ctranslate2
import tokenizers

here = Path(".")  # this folder
translator = ctranslate2.Translator(str(here), device="cpu")
source = tokenizers.Tokenizer.from_file(str(here / "{files["source"]}"))
target = tokenizers.Tokenizer.from_file(str(here / "{files["target"]}"))


def translate(texts, beam_size=1, length_penalty=1.0, max_new_tokens=128):
    batch = [source.encode(text).tokens for text in texts]  # no <bos> / <eos> added
    results = translator.translate_batch(
        batch,
        beam_size=beam_size,  # translate_batch defaults to 2: set it
        length_penalty=length_penalty,
        return_end_token=True,  # the length of a hypothesis counts its <eos>, as in tformer
        max_input_length={max_len},  # tformer reads at most max_len source tokens
        max_decoding_length=min(max_new_tokens, {max_len}),
    )
    outputs = []
    for result in results:
        tokens = [t for t in result.hypotheses[0] if t != "{EOS}"]
        outputs.append(target.decode([target.token_to_id(t) for t in tokens]))
    return outputs


print(translate(["your input here"]))
```

What tformer does, baked in (no extra option needed):

- the decoder starts from `{BOS}`; sources carry no `{BOS}` / `{EOS}`;
- one difference: CTranslate2 answers an empty source with an empty output without running
  the model, where tformer decodes an empty source as a lone `{EOS}`;
- `<pad>` and `{BOS}` are never predicted: the output projection has a bias of -inf at
  their ids ({PAD_ID} and {BOS_ID}).

`beam_size` 1 is greedy. With `return_end_token=True` CTranslate2 ranks beam hypotheses by
sum log p / length ** length_penalty, the `{EOS}` counted in the length, as tformer does.
CTranslate2 ends a beam search once `beam_size` hypotheses have finished; tformer goes on
while a live beam could still beat the worst of them, so on rare inputs the two can differ
at length_penalty > 0 (at length_penalty 0 they cannot). A float32 export can still be
quantised when it loads: `ctranslate2.Translator(..., compute_type="int8")`.
"""
