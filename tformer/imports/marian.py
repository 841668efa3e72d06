"""A Hugging Face ``MarianMTModel`` folder (OPUS-MT) as a tformer model and tokenizers.

The reverse of ``tformer.export.huggingface``: Marian is tformer's post-norm Transformer with
embeddings scaled by √d_model and sinusoidal positions laid out [sin..., cos...], so every
d_model axis is permuted back to tformer's interleaved layout (``marian_feature_order``), and
every vocabulary axis (embedding rows, output rows, ``final_logits_bias``) is put in tformer's
id order: ``<pad> <bos> <eos> <unk>`` first (``tformer.data.spm``). Marian starts
decoding from its ``<pad>``, which becomes tformer's ``<bos>``; tformer's ``<pad>`` is then a
new row (zeros). What Marian has and the paper does not are variants: SiLU ("swish"), the
logits bias (``output_bias``) and the ``</s>`` closing every source (``source_eos``).

Marian configurations tformer cannot express (pre-norm, unscaled embeddings, a layer norm on
the embeddings, different encoder and decoder widths) are refused before anything is written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tformer.checkpoint.store import Tokenizers
from tformer.config import BOS_ID, EOS, EOS_ID, PAD_ID, ModelConfig
from tformer.data.hf_tokenizers import read_tokenizer_json
from tformer.data.tokenizer import Tokenizer
from tformer.errors import CheckpointError
from tformer.imports.common import (
    CONFIG,
    FAST_TOKENIZER,
    NEVER,
    Checked,
    Imported,
    Key,
    build_arch,
    family_config,
    origin_of,
)
from tformer.imports.weights import (
    Tensors,
    fill_rows_in_order,
    never_rows,
    open_weights,
    read_state,
    rows_in_order,
)
from tformer.marian_layout import TARGET_TOKENIZER, marian_feature_order
from tformer.model import Transformer
from tformer.paths import excerpt

MARIAN_TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")
# Marian's activation names -> tformer's (transformers' ACT2FN: "swish" and "silu" are SiLU).
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "silu", "silu": "silu"}
# What config.json's keys must hold, and the tformer setting each becomes.
KEYS: dict[str, Key] = {
    "d_model": Key.width(),
    "encoder_layers": Key.layers("n_encoder_layers"),
    "decoder_layers": Key.layers("n_decoder_layers"),
    "encoder_attention_heads": Key.heads(),
    "decoder_attention_heads": Key.heads(),
    "encoder_ffn_dim": Key.ffn(),
    "decoder_ffn_dim": Key.ffn(),
    "dropout": Key.fraction("dropout"),
    "attention_dropout": Key.fraction("attention_dropout"),
    "max_position_embeddings": Key.positions(),
    "vocab_size": Key.vocab(),
    "decoder_vocab_size": Key.vocab(null=True),
    "pad_token_id": Key.token_id(),
    "eos_token_id": Key.token_id(),
    "decoder_start_token_id": Key.token_id(),
    "activation_function": Key.text(),
    "share_encoder_decoder_embeddings": Key.flag(),
    "scale_embedding": Key.flag(),
    "normalize_before": Key.flag(),
    "normalize_embedding": Key.flag(),
    "layernorm_embedding": Key.flag(),
    "add_final_layer_norm": Key.flag(),
}


def _problems(config: Any) -> list[str]:
    """The Marian settings tformer's model cannot express."""
    problems = []
    if getattr(config, "normalize_before", False):
        problems.append("normalize_before (pre-norm layers)")
    if not getattr(config, "scale_embedding", False):
        problems.append("scale_embedding false (tformer scales embeddings by sqrt(d_model))")
    for name in ("normalize_embedding", "layernorm_embedding", "add_final_layer_norm"):
        if getattr(config, name, False):
            problems.append(f"{name} (a layer norm tformer's post-norm model has not)")
    if config.activation_function not in ACTIVATIONS:
        problems.append(f"activation_function {excerpt(config.activation_function)}")
    for mine, theirs in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if getattr(config, mine) != getattr(config, theirs):
            problems.append(f"{mine} != {theirs}")
    if config.d_model % 2 or config.d_model % config.encoder_attention_heads:
        problems.append(f"d_model {config.d_model} (must be even and divide into the heads)")
    return problems


def _layer_state(
    weights: Tensors, config: Any, inverse: torch.Tensor, side: str, i: int
) -> dict[str, torch.Tensor]:
    """tformer's weights of one encoder or decoder layer, d_model axes back in its order."""
    d, f = config.d_model, config.encoder_ffn_dim
    theirs, ours = f"model.{side}.layers.{i}", f"{side}.layers.{i}"
    state: dict[str, torch.Tensor] = {}

    def reads(name: str, out: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = weights.take(f"{theirs}.{name}.weight", (out, width))
        bias = weights.take(f"{theirs}.{name}.bias", (out,))
        return (weight[:, inverse] if width == d else weight), bias

    def writes(name: str, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = weights.take(f"{theirs}.{name}.weight", (d, width) if width else (d,))
        bias = weights.take(f"{theirs}.{name}.bias", (d,))
        return weight[inverse], bias[inverse]

    attentions = [("self_attn", "self_attn")]
    if side == "decoder":
        attentions.append(("encoder_attn", "cross_attn"))
    for name, mine in attentions:
        q, q_b = reads(f"{name}.q_proj", d, d)
        k, k_b = reads(f"{name}.k_proj", d, d)
        v, v_b = reads(f"{name}.v_proj", d, d)
        o, o_b = writes(f"{name}.out_proj", d)
        state.update({
            f"{ours}.{mine}.q_proj.weight": q, f"{ours}.{mine}.q_proj.bias": q_b,
            f"{ours}.{mine}.kv_proj.weight": torch.cat([k, v]),
            f"{ours}.{mine}.kv_proj.bias": torch.cat([k_b, v_b]),
            f"{ours}.{mine}.out_proj.weight": o, f"{ours}.{mine}.out_proj.bias": o_b,
        })  # fmt: skip
    norms = {"self_attn_layer_norm": "norm1", "final_layer_norm": "norm2"}
    if side == "decoder":
        norms = {**norms, "encoder_attn_layer_norm": "norm2", "final_layer_norm": "norm3"}
    for name, mine in norms.items():
        state[f"{ours}.{mine}.weight"], state[f"{ours}.{mine}.bias"] = writes(name, 0)
    w1, b1 = reads("fc1", f, d)
    w2, b2 = writes("fc2", f)
    state.update({
        f"{ours}.feed_forward.w1.weight": w1, f"{ours}.feed_forward.w1.bias": b1,
        f"{ours}.feed_forward.w2.weight": w2, f"{ours}.feed_forward.w2.bias": b2,
    })  # fmt: skip
    return state


def logits_bias(bias: torch.Tensor, order: list[int | None]) -> torch.Tensor | None:
    """tformer's logits bias from Marian's ``final_logits_bias`` (its vocabulary order), or
    None when it would hold nothing: <pad> and <bos> (never predicted; an export writes -inf
    there) and rows that stand for no Marian token get :data:`NEVER`."""
    ours = rows_in_order(bias[:, None], order)[:, 0]
    never = never_rows(order)
    ours[never] = NEVER
    ours[[PAD_ID, BOS_ID]] = NEVER
    ours[torch.isinf(ours)] = NEVER
    if not never and not ours[BOS_ID + 1 :].any():
        return None
    return ours


def model_config(
    config: Any, src_size: int, tgt_size: int, *, share: bool, output_bias: bool, source_eos: bool
) -> ModelConfig:
    """tformer's architecture of a (checked) Marian config."""
    return ModelConfig(
        src_vocab_size=src_size,
        tgt_vocab_size=tgt_size,
        d_model=config.d_model,
        n_heads=config.encoder_attention_heads,
        n_encoder_layers=config.encoder_layers,
        n_decoder_layers=config.decoder_layers,
        d_ff=config.encoder_ffn_dim,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        norm="post",
        activation=ACTIVATIONS[config.activation_function],  # type: ignore[arg-type]
        max_len=config.max_position_embeddings,
        tie_embeddings=bool(config.tie_word_embeddings),
        share_embeddings=share,
        output_bias=output_bias,
        source_eos=source_eos,
    )


@dataclass
class FolderTokenizers:
    """A folder's tokenizers, the id orders onto the Marian vocabularies, and whether the
    model reads its sources closed by </s>."""

    tokenizers: Tokenizers
    source_order: list[int | None]
    target_order: list[int | None]
    source_eos: bool
    kind: str  # "MarianTokenizer" or "PreTrainedTokenizerFast" (a tformer export)


def folder_tokenizers(folder: Path, config: Any) -> FolderTokenizers:
    """The tokenizers of a ``save_pretrained`` folder: Marian's SentencePiece files, or the
    fast tokenizer(s) ``tformer export --to huggingface`` writes.

    Raises:
        CheckpointError: tokenizer files are missing or do not fit the model's special ids.
    """
    if os.path.lexists(folder / FAST_TOKENIZER) and not os.path.lexists(folder / "source.spm"):
        return _exported_tokenizers(folder, config)
    missing = [name for name in MARIAN_TOKENIZER_FILES if not os.path.lexists(folder / name)]
    if missing:
        raise CheckpointError(
            f"{folder}: tokenizer files {', '.join(missing)} are missing; save the "
            "MarianTokenizer into the folder too (tokenizer.save_pretrained)"
        )
    from tformer.data.marian_spm import marian_tokenizers

    found = marian_tokenizers(
        folder,
        pad_id=config.pad_token_id,
        eos_id=config.eos_token_id,
        decoder_start_id=config.decoder_start_token_id,
    )
    source, target = found.source, found.target
    if found.joint and source.to_str() == target.to_str():
        target = source  # one SentencePiece model for both sides: one tokenizer file
    return FolderTokenizers(
        Tokenizers(source, target),
        found.source_order,
        found.target_order,
        source_eos=True,  # MarianTokenizer closes every source with </s>
        kind="MarianTokenizer",
    )


def _exported_tokenizers(folder: Path, config: Any) -> FolderTokenizers:
    """The fast tokenizer(s) of a folder tformer exported: special ids 0..3 already, so the
    orders are the identity, and </s> closes sources where its post-processor appends it."""
    from tformer.data.spm import special_first_order

    def load(path: Path) -> tuple[Tokenizer, bool]:
        text, data = read_tokenizer_json(path)
        processor = data.get("post_processor")
        single = processor.get("single", []) if isinstance(processor, dict) else []
        appends = EOS in json.dumps(single)
        return Tokenizer.from_str(text, source=str(path)), appends

    source, source_eos = load(folder / FAST_TOKENIZER)
    target_file = folder / TARGET_TOKENIZER / FAST_TOKENIZER
    target = load(target_file)[0] if os.path.lexists(target_file) else source
    if config.decoder_start_token_id != BOS_ID or config.eos_token_id != EOS_ID:
        raise CheckpointError(
            f"{folder / CONFIG}: decoder_start_token_id {config.decoder_start_token_id} / "
            f"eos_token_id {config.eos_token_id} do not fit its tokenizer ({BOS_ID} / {EOS_ID})"
        )

    def order(tokenizer: Tokenizer) -> list[int | None]:
        return special_first_order(tokenizer.vocab_size, pad=0, bos=1, eos=2, unk=3)

    return FolderTokenizers(
        Tokenizers(source, target),
        order(source),
        order(target),
        source_eos=source_eos,
        kind="PreTrainedTokenizerFast",
    )


def read_marian(folder: Path, *, source: str) -> Imported:
    """Read a ``save_pretrained`` MarianMTModel folder as a tformer model and tokenizers.

    Args:
        folder: the local folder (config.json, model.safetensors, tokenizer files).
        source: what the user named (a hub id or the folder), recorded as the origin.

    Raises:
        CheckpointError: another model type, a Marian variant tformer cannot express, missing
            tokenizer files, or weights that do not match their config.
        ConfigError: the optional packages are not installed.
    """
    checked = family_config(folder, "MarianConfig", "marian", KEYS, _problems)
    config = checked.config
    found = folder_tokenizers(folder, config)
    names = _tied_names(config)
    with open_weights(folder) as weights:
        model = read_state(
            weights,
            lambda w: _read_model(w, checked, found),
            # Marian's sinusoid tables are a function of the config, not weights.
            lambda name: name in names or name.endswith("embed_positions.weight"),
        )
    assert model is not None  # read from the tensors, not their headers
    return Imported(model, found.tokenizers, origin_of(source, folder, config, found.kind))


def _read_model(weights: Tensors, checked: Checked, found: FolderTokenizers) -> Transformer | None:
    """The model of the Marian tensors (eval mode); from their headers (``read_state``'s
    first pass), only the checks."""
    config = checked.config
    layout = _layout(weights, config, found)
    converted = _converted(weights, config, found, layout)
    if weights.headers_only:
        for _ in converted:
            pass
        return None
    tokenizers = found.tokenizers
    arch = build_arch(
        checked,
        lambda: model_config(
            config,
            tokenizers.source.vocab_size,
            tokenizers.target.vocab_size,
            share=layout.share,
            output_bias=layout.bias is not None,
            source_eos=found.source_eos,
        ),
    )
    model = Transformer(arch)
    # Each converted tensor goes straight into the model, so at most one is held beside it.
    target = model.state_dict()
    filled = set()
    for name, tensor in converted:
        if callable(tensor):
            tensor(target[name])
        else:
            target[name].copy_(tensor)
        filled.add(name)
    assert filled == set(target), set(target) ^ filled
    return model.eval()


def _tied_names(config: Any) -> set[str]:
    """The names a tied matrix may also be saved under, read once through another."""
    names = {"model.decoder.embed_tokens.weight"}
    if config.share_encoder_decoder_embeddings:
        names |= {"model.shared.weight", "model.encoder.embed_tokens.weight"}
    if config.tie_word_embeddings:
        names.add("lm_head.weight")
    return names


@dataclass
class _Layout:
    """What the conversion needs to know before the model is built."""

    src_size: int  # Marian's source and target vocabulary sizes
    tgt_size: int
    share: bool  # one embedding matrix for both sides
    bias: torch.Tensor | None  # tformer's logits bias, None when it would hold nothing
    inverse: torch.Tensor  # tformer's d_model order from Marian's


def _layout(weights: Tensors, config: Any, found: FolderTokenizers) -> _Layout:
    """Sizes checked against the tokenizers, whether the embeddings are one, the bias."""
    share = bool(config.share_encoder_decoder_embeddings)
    src_size = config.vocab_size
    tgt_size = src_size if share else (config.decoder_vocab_size or src_size)
    for name, order, size in (
        ("source", found.source_order, src_size),
        ("target", found.target_order, tgt_size),
    ):
        rows = {i for i in order if i is not None}
        if rows and (max(rows) >= size or len(rows) != size):
            raise CheckpointError(
                f"{weights.path}: the {name} vocabulary has {len(rows)} tokens but the "
                f"embeddings {size} rows; the tokenizer does not belong to this model"
            )
    if share and found.source_order != found.target_order:
        raise CheckpointError(
            f"{weights.path.parent / CONFIG}: share_encoder_decoder_embeddings needs one "
            "vocabulary, but the tokenizer has separate ones"
        )
    layout = _Layout(
        src_size, tgt_size, share, None, torch.argsort(marian_feature_order(config.d_model))
    )
    if share:  # untied, transformers shares nothing: a fine-tuned copy may hold two embeddings
        encoder, decoder = _embeddings(weights, config, layout)
        layout.share = weights.headers_only or torch.equal(encoder, decoder)
    if "final_logits_bias" in weights.left:  # -inf where an export masks <pad> and <bos>
        final = weights.take("final_logits_bias", (1, tgt_size), infinite=True)[0]
    else:
        final = torch.zeros(tgt_size)
    if not weights.headers_only:
        layout.bias = logits_bias(final, found.target_order)
    return layout


def _embeddings(
    weights: Tensors, config: Any, layout: _Layout
) -> tuple[torch.Tensor, torch.Tensor]:
    """Marian's source and target embeddings (transformers saves a tied matrix once, under
    one of its names)."""
    return _embedding(weights, config, layout, "encoder"), _embedding(
        weights, config, layout, "decoder"
    )


def _embedding(weights: Tensors, config: Any, layout: _Layout, side: str) -> torch.Tensor:
    """Marian's ``side`` ("encoder" or "decoder") embedding, under whichever name it is saved."""
    share = bool(config.share_encoder_decoder_embeddings)
    shared = ("model.shared.weight",) if share else ()
    head = (
        ("lm_head.weight",) if config.tie_word_embeddings and (share or side == "decoder") else ()
    )
    rows = layout.src_size if side == "encoder" else layout.tgt_size
    return weights.take(f"model.{side}.embed_tokens.weight", (rows, config.d_model), *shared, *head)


Fill = Callable[[torch.Tensor], None]  # writes a converted tensor into the model's


def _converted(
    weights: Tensors, config: Any, found: FolderTokenizers, layout: _Layout
) -> Iterator[tuple[str, torch.Tensor | Fill]]:
    """tformer's state dict, one tensor at a time, from the Marian tensors."""
    inverse = layout.inverse

    def vocab(matrix: torch.Tensor, order: list[int | None]) -> Fill:
        # The vocabulary matrices are the largest tensors: written into the model a block of
        # rows at a time, with no converted copy beside the one read.
        return lambda dest: fill_rows_in_order(dest, matrix, order, inverse)

    names = ("encoder.embedding.embedding.weight", "decoder.embedding.embedding.weight")
    if layout.share:  # one matrix, read once
        shared = vocab(_embedding(weights, config, layout, "encoder"), found.source_order)
        for name in names:
            yield name, shared
        del shared
    else:
        for name, side, order in zip(
            names, ("encoder", "decoder"), (found.source_order, found.target_order), strict=True
        ):
            yield name, vocab(_embedding(weights, config, layout, side), order)
    if not config.tie_word_embeddings:
        head = weights.take("lm_head.weight", (layout.tgt_size, config.d_model))
        yield "output_projection.weight", vocab(head, found.target_order)
    if layout.bias is not None:
        yield "logits_bias", layout.bias
    for side, count in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(count):
            yield from _layer_state(weights, config, inverse, side, i).items()
