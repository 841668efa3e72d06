"""A checkpoint as a Hugging Face Marian model: ``tformer export CKPT --to huggingface OUT``.

``MarianMTModel`` is tformer's post-norm architecture with embeddings scaled by √d_model and
a sinusoidal position table, so every post-norm checkpoint maps onto it: shared or separate
vocabularies (``share_encoder_decoder_embeddings``), tied or untied output projection
(``tie_word_embeddings``), ReLU, GELU or SiLU ("swish"), the logits bias
(``final_logits_bias``) and the source's closing <eos> (Marian's own). Pre-norm has no
Marian equivalent and is refused.

Marian lays its sinusoidal table out as [sin..., cos...] where tformer interleaves sin / cos
(the paper's layout), so every d_model axis of the weights is permuted to match; LayerNorm is
indifferent to the order of features, so the two models then compute the same function.
tformer never predicts <pad> or <bos>: ``final_logits_bias`` is -inf at their ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer as RustTokenizer
from tokenizers.processors import TemplateProcessing

from tformer.checkpoint.store import Checkpoint, Tokenizers
from tformer.config import BOS, BOS_ID, EOS, EOS_ID, PAD, PAD_ID, UNK, ModelConfig
from tformer.data.tokenizer import Tokenizer
from tformer.errors import ConfigError
from tformer.export.ctranslate2 import output_bias
from tformer.marian_layout import TARGET_TOKENIZER, marian_feature_order
from tformer.model import Transformer
from tformer.paths import json_loads

README = "README.md"
# tformer's activation -> Marian's name for it (the ungated ones Marian has).
MARIAN_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "swish"}


def check_marian(config: ModelConfig) -> None:
    """Refuse what Marian cannot express, naming the feature.

    Raises:
        ConfigError: the checkpoint is pre-norm.
    """
    if config.norm == "pre":
        raise ConfigError(
            "--to huggingface: the checkpoint is pre-norm (norm: pre), and Marian has only "
            "post-norm layers; export it --to ctranslate2 instead"
        )


def marian_config(config: ModelConfig) -> Any:
    """The ``MarianConfig`` of a tformer architecture."""
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=config.src_vocab_size,
        decoder_vocab_size=config.tgt_vocab_size,
        share_encoder_decoder_embeddings=config.share_embeddings,
        tie_word_embeddings=config.tie_embeddings,
        d_model=config.d_model,
        encoder_layers=config.n_encoder_layers,
        decoder_layers=config.n_decoder_layers,
        encoder_attention_heads=config.n_heads,
        decoder_attention_heads=config.n_heads,
        encoder_ffn_dim=config.d_ff,
        decoder_ffn_dim=config.d_ff,
        # "gelu" is the exact (erf) GELU, as torch's; Marian calls SiLU "swish"
        activation_function=MARIAN_ACTIVATIONS[config.activation],
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=0.0,
        max_position_embeddings=config.max_len,
        scale_embedding=True,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,
    )


def marian_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """tformer's weights under Marian's names, every d_model axis permuted to Marian's
    [sin..., cos...] order (``perm``), and ``final_logits_bias`` masking <pad> and <bos>."""
    c = model.config
    d = c.d_model
    perm = marian_feature_order(d)
    ours = {name: t.detach().float() for name, t in model.state_dict().items()}

    def reads(prefix: str) -> dict[str, torch.Tensor]:  # a linear reading the residual stream
        return {"weight": ours[f"{prefix}.weight"][:, perm], "bias": ours[f"{prefix}.bias"]}

    def writes(prefix: str) -> dict[str, torch.Tensor]:  # a linear or norm writing it
        return {"weight": ours[f"{prefix}.weight"][perm], "bias": ours[f"{prefix}.bias"][perm]}

    def attention(prefix: str) -> dict[str, dict[str, torch.Tensor]]:
        kv_w, kv_b = ours[f"{prefix}.kv_proj.weight"], ours[f"{prefix}.kv_proj.bias"]
        return {
            "q_proj": reads(f"{prefix}.q_proj"),
            "k_proj": {"weight": kv_w[:d][:, perm], "bias": kv_b[:d]},
            "v_proj": {"weight": kv_w[d:][:, perm], "bias": kv_b[d:]},
            "out_proj": writes(f"{prefix}.out_proj"),
        }

    tree: dict[str, Any] = {}
    for i in range(c.n_encoder_layers):
        ours_l = f"encoder.layers.{i}"
        tree[f"model.encoder.layers.{i}"] = {
            "self_attn": attention(f"{ours_l}.self_attn"),
            "self_attn_layer_norm": writes(f"{ours_l}.norm1"),
            "fc1": reads(f"{ours_l}.feed_forward.w1"),
            "fc2": writes(f"{ours_l}.feed_forward.w2"),
            "final_layer_norm": writes(f"{ours_l}.norm2"),
        }
    for i in range(c.n_decoder_layers):
        ours_l = f"decoder.layers.{i}"
        tree[f"model.decoder.layers.{i}"] = {
            "self_attn": attention(f"{ours_l}.self_attn"),
            "self_attn_layer_norm": writes(f"{ours_l}.norm1"),
            "encoder_attn": attention(f"{ours_l}.cross_attn"),
            "encoder_attn_layer_norm": writes(f"{ours_l}.norm2"),
            "fc1": reads(f"{ours_l}.feed_forward.w1"),
            "fc2": writes(f"{ours_l}.feed_forward.w2"),
            "final_layer_norm": writes(f"{ours_l}.norm3"),
        }
    flat = _flatten(tree)
    source = ours["encoder.embedding.embedding.weight"][:, perm]
    target = ours["decoder.embedding.embedding.weight"][:, perm]
    # All three, always: with tie_word_embeddings off, transformers ties none of them (not even
    # a shared vocabulary's encoder and decoder embeddings to model.shared).
    if c.share_embeddings:
        flat["model.shared.weight"] = source
    flat["model.encoder.embed_tokens.weight"] = source
    flat["model.decoder.embed_tokens.weight"] = target
    flat["lm_head.weight"] = model.output_weight().detach().float()[:, perm]
    flat["final_logits_bias"] = output_bias(model)[None, :]
    return flat


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, torch.Tensor]:
    flat: dict[str, torch.Tensor] = {}
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{key}."))
        else:
            flat[key] = value
    return flat


def to_marian(model: Transformer) -> Any:
    """A ``MarianMTModel`` (eval mode) computing the same function as ``model``.

    Raises:
        ConfigError: the architecture has no Marian equivalent (see ``check_marian``).
    """
    from transformers import MarianMTModel

    check_marian(model.config)
    marian = MarianMTModel(marian_config(model.config)).eval()
    state = marian_state_dict(model)
    missing, unexpected = marian.load_state_dict(state, strict=False)
    # Marian's fixed position tables are not weights: it computes them from the config.
    leftover = [name for name in missing if not name.endswith("embed_positions.weight")]
    assert not unexpected and not leftover, (unexpected, leftover)
    _set_generation_config(marian, model.config)
    return marian


def _set_generation_config(marian: Any, config: ModelConfig) -> None:
    generation = marian.generation_config
    generation.decoder_start_token_id = BOS_ID
    generation.bos_token_id = BOS_ID
    generation.eos_token_id = EOS_ID
    generation.pad_token_id = PAD_ID
    generation.forced_eos_token_id = None
    generation.max_length = config.max_len + 1  # the decoder start token counts in it
    generation.num_beams = 1
    generation.do_sample = False


def fast_tokenizer(tokenizer: Tokenizer, max_len: int, *, source_eos: bool = False) -> Any:
    """A ``PreTrainedTokenizerFast`` over the checkpoint's tokenizer, special tokens set;
    ``truncation=True`` cuts a source to ``max_len`` tokens, as tformer reads it. With
    ``source_eos`` it closes each text with <eos>, as the model reads its sources."""
    from transformers import PreTrainedTokenizerFast

    inner = RustTokenizer.from_str(tokenizer.to_str())
    if source_eos:
        inner.post_processor = TemplateProcessing(
            single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, EOS_ID)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=inner,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_input_names=["input_ids", "attention_mask"],  # Marian takes no token_type_ids
        clean_up_tokenization_spaces=False,  # decode as tformer does, spaces as they come
        model_max_length=max_len,
    )


def _save_tokenizer(
    tokenizer: Tokenizer, folder: Path, max_len: int, *, source_eos: bool = False
) -> None:
    fast_tokenizer(tokenizer, max_len, source_eos=source_eos).save_pretrained(str(folder))
    # Named explicitly, so that AutoTokenizer loads this file and not Marian's SentencePiece
    # tokenizer, which the folder does not have.
    path = folder / "tokenizer_config.json"
    settings = json_loads(path.read_text(encoding="utf-8"))
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def export_huggingface(checkpoint: Checkpoint, folder: Path) -> None:
    """The whole Hugging Face export of ``checkpoint`` into the (new, empty) ``folder``."""
    model = checkpoint.model
    assert isinstance(model, Transformer)  # the export refused the one-stack families
    marian = to_marian(model)
    marian.save_pretrained(str(folder))
    tokenizers = checkpoint.tokenizers
    max_len = checkpoint.model_config.max_len
    _save_tokenizer(
        tokenizers.source, folder, max_len, source_eos=checkpoint.model_config.source_eos
    )
    if not tokenizers.shared:
        _save_tokenizer(tokenizers.target, folder / TARGET_TOKENIZER, max_len)
    source_eos = checkpoint.model_config.source_eos
    (folder / README).write_text(readme(tokenizers, source_eos), encoding="utf-8")


def readme(tokenizers: Tokenizers, source_eos: bool = False) -> str:
    """How to load and call the exported model."""
    sources = (
        f"sources end with `{EOS}` (the tokenizer appends it, as Marian's does)"
        if source_eos
        else f"sources carry no `{BOS}` / `{EOS}` (the tokenizer adds none)"
    )
    if tokenizers.shared:
        target = "tokenizer  # one vocabulary for both sides"
        separate = ""
    else:
        target = f'AutoTokenizer.from_pretrained(here / "{TARGET_TOKENIZER}")'
        separate = (
            "\nThe vocabularies are separate: `AutoTokenizer.from_pretrained(here)` is the source\n"
            f"tokenizer, `{TARGET_TOKENIZER}/` the target one (Marian's own tokenizer class\n"
            "carries two SentencePiece models, not two fast tokenizers, so `text_target=` is not\n"
            "available; decode outputs with the target tokenizer as below).\n"
        )
    return f"""# Hugging Face Marian model exported by tformer

Load and call it with only this folder:

```python
from pathlib import Path

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

here = Path(".")  # this folder
model = AutoModelForSeq2SeqLM.from_pretrained(here)  # a MarianMTModel
tokenizer = AutoTokenizer.from_pretrained(here)  # a fast tokenizer
target = {target}

batch = tokenizer(["your input here"], return_tensors="pt", padding=True, truncation=True)
output = model.generate(**batch)  # greedy, at most max_len tokens; num_beams=4 for beam search
print(target.batch_decode(output, skip_special_tokens=True))
```
{separate}
What tformer does, baked in (no extra option needed):

- {sources}; the decoder starts from
  `{BOS}` (`decoder_start_token_id` {BOS_ID}); `truncation=True` reads at most max_len source
  tokens, as tformer does; tformer reads an empty source as a lone `{EOS}` (id {EOS_ID}): give
  that id for an empty text;
- `{PAD}` and `{BOS}` are never predicted: `final_logits_bias` is -inf at their ids (and
  holds the model's own logits bias, if it has one);
- `generation_config.json`: greedy (`num_beams` 1), ends at `{EOS}`, at most max_len tokens.

The weights are tformer's, renamed, with every d_model axis permuted to Marian's
[sin..., cos...] position layout: the model computes the same function as the checkpoint.
"""
