"""``tformer export CKPT OUT --to huggingface``: the transformers model of each family, chosen
from one table (``TARGETS``), and the Marian export of the paper's encoder-decoder.

- decoder-only -> ``GPT2LMHeadModel`` (:mod:`tformer.export.hf_gpt2`);
- encoder-only -> ``BertForMaskedLM`` (:mod:`tformer.export.hf_bert`);
- an encoder-decoder with T5's relative positions -> ``T5ForConditionalGeneration``
  (:mod:`tformer.export.hf_t5`); any other -> ``MarianMTModel`` (below).

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

from collections.abc import Callable
from dataclasses import dataclass
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
from tformer.export.hf_bert import WHY as BERT_WHY
from tformer.export.hf_bert import export_bert
from tformer.export.hf_bert import problems as bert_problems
from tformer.export.hf_common import (
    README,
    flatten,
    float_state,
    load_exact,
    refuse,
    save_tokenizer,
    set_generation,
)
from tformer.export.hf_gpt2 import WHY as GPT2_WHY
from tformer.export.hf_gpt2 import export_gpt2
from tformer.export.hf_gpt2 import problems as gpt2_problems
from tformer.export.hf_t5 import WHY as T5_WHY
from tformer.export.hf_t5 import export_t5
from tformer.export.hf_t5 import problems as t5_problems
from tformer.marian_layout import TARGET_TOKENIZER, marian_feature_order
from tformer.model import Transformer

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
    ours = float_state(model)

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
    flat = flatten(tree)
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


def to_marian(model: Transformer) -> Any:
    """A ``MarianMTModel`` (eval mode) computing the same function as ``model``.

    Raises:
        ConfigError: the architecture has no Marian equivalent (see ``check_marian``).
    """
    from transformers import MarianMTModel

    check_marian(model.config)
    # Marian's fixed position tables are not weights: it computes them from the config.
    marian = load_exact(
        MarianMTModel(marian_config(model.config)),
        marian_state_dict(model),
        computed=("embed_positions.weight",),
    )
    set_generation(
        marian,
        max_new_tokens=model.config.max_len,
        decoder_start_token_id=BOS_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        forced_eos_token_id=None,
    )
    return marian


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
    save_tokenizer(fast_tokenizer(tokenizer, max_len, source_eos=source_eos), folder)


def export_marian(checkpoint: Checkpoint, folder: Path) -> None:
    """The whole Marian export of ``checkpoint`` into the (new, empty) ``folder``."""
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
- `generation_config.json`: greedy (`num_beams` 1), ends at `{EOS}`, at most max_len new
  tokens (`max_new_tokens`, which a call may change).

The weights are tformer's, renamed, with every d_model axis permuted to Marian's
[sin..., cos...] position layout: the model computes the same function as the checkpoint.
"""


@dataclass(frozen=True)
class Target:
    """One transformers model a family exports to: its class, the options of a checkpoint
    it cannot express (as flags; None: the Marian checks of ``tformer.export.api``), what it
    has, and the writer."""

    model: str
    problems: Callable[[ModelConfig], list[str]] | None
    why: str
    write: Callable[[Checkpoint, Path], None]


MARIAN = Target("MarianMTModel", None, "", export_marian)
GPT2 = Target("GPT2LMHeadModel", gpt2_problems, GPT2_WHY, export_gpt2)
BERT = Target("BertForMaskedLM", bert_problems, BERT_WHY, export_bert)
T5 = Target("T5ForConditionalGeneration", t5_problems, T5_WHY, export_t5)
# family -> its target; an encoder-decoder goes to T5 with T5's relative positions.
EXPORTS = {"decoder-only": GPT2, "encoder-only": BERT, "encoder-decoder": MARIAN}


def target(config: ModelConfig) -> Target:
    """The transformers model ``config``'s checkpoint exports to."""
    if config.arch == "encoder-decoder" and config.positions == "relative":
        return T5
    return EXPORTS[config.arch]


def check_target(config: ModelConfig) -> None:
    """Refuse, naming each one in one line, the options the target model cannot express.

    Raises:
        ConfigError: when there are any.
    """
    chosen = target(config)
    if chosen.problems is not None:
        refuse(chosen.model, chosen.problems(config), chosen.why)


def export_huggingface(checkpoint: Checkpoint, folder: Path) -> None:
    """The whole Hugging Face export of ``checkpoint`` into the (new, empty) ``folder``."""
    target(checkpoint.model_config).write(checkpoint, folder)
