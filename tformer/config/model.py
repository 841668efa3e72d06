"""``ModelConfig``: the architecture, the paper's names and defaults, and its variants."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from tformer.config.checks import (
    MAX_LEN_LIMIT,
    _field,
    _require,
    check_numbers,
    flag,
    one_of,
    strict_from_dict,
)
from tformer.config.families import FAMILY_RECORDS, Family, family_record

Arch = Literal["encoder-decoder", "decoder-only", "encoder-only"]
Norm = Literal["post", "pre"]
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh"]
GATED_ACTIVATIONS = ("swiglu", "geglu", "geglu_tanh")
Positions = Literal["sinusoidal", "learned", "rope", "relative"]
Normalization = Literal["layernorm", "rmsnorm"]

# ModelConfig keys added after checkpoints were first written: a config.json without them is
# a model of their defaults (the paper's), which is what such a checkpoint holds.
ADDED_MODEL_KEYS = (
    "kv_heads", "normalization", "positions", "arch", "output_bias", "source_eos",
    "embedding_scale", "norm_eps", "embedding_norm", "segment_embedding", "mlm_head",
    "bos_first", "document_bos", "relative_buckets", "relative_max_distance",
    "attention_scale", "linear_bias", "output_scale",
)




@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The encoder-decoder architecture of "Attention Is All You Need" (Vaswani et al., 2017).

    Defaults are the paper's base model (section 3, table 3 row "base"). Each field's ``help``
    is also the help of its ``tformer train`` option.
    """

    # The three families of the same blocks: the paper's encoder-decoder, a decoder-only
    # language model (GPT) and an encoder-only masked language model (BERT).
    arch: Arch = _field(
        "encoder-decoder",
        "encoder-decoder (paper: translation) | decoder-only (GPT: a language model on plain "
        "text, uses --n-decoder-layers) | encoder-only (BERT: masked language model on plain "
        "text, uses --n-encoder-layers).",
    )
    src_vocab_size: int = _field(8000, "Source vocabulary size (set from the tokenizer).")
    tgt_vocab_size: int = _field(8000, "Target vocabulary size (set from the tokenizer).")
    d_model: int = _field(512, "Width of the model (embeddings and every sub-layer's output).")
    n_heads: int = _field(8, "Attention heads; must divide --d-model.")
    # Grouped-query attention (Ainslie et al., 2023): K key/value heads, each shared by
    # n_heads / K query heads. K = 1 is multi-query attention (Shazeer, 2019).
    kv_heads: int | None = _field(
        None,
        "Key/value heads (grouped-query attention); must divide --n-heads. 1 = multi-query; "
        "default: --n-heads (the paper's multi-head attention).",
    )
    n_encoder_layers: int = _field(6, "Encoder layers.")
    n_decoder_layers: int = _field(6, "Decoder layers.")
    d_ff: int = _field(2048, "Inner width of the feed-forward sub-layers.")
    dropout: float = _field(0.1, "Dropout on sub-layer outputs and embeddings.")
    attention_dropout: float = _field(0.0, "Dropout on the attention weights.")
    norm: Norm = _field("post", "post (paper) | pre: layer norm after or before each sub-layer.")
    normalization: Normalization = _field(
        "layernorm", "layernorm (paper) | rmsnorm (Zhang & Sennrich, 2019)."
    )
    activation: Activation = _field(
        "relu",
        "relu (paper) | gelu | gelu_tanh (GELU's tanh approximation, GPT-2's 'gelu_new') | "
        "silu (Swish, Ramachandran et al. 2017: x * sigmoid(x), Marian's "
        "and OPUS-MT's 'swish') | swiglu | geglu (gated, Shazeer 2020: hidden width 2/3 of "
        "--d-ff rounded up to a multiple of 8, so the parameters stay about equal) | "
        "geglu_tanh (geglu with GELU's tanh approximation, T5 v1.1's 'gated-gelu').",
    )
    max_len: int = _field(256, "Longest sequence in tokens (longer pairs skipped).")
    positions: Positions = _field(
        "sinusoidal",
        "sinusoidal (paper) | learned (an embedding per position) | rope (rotary, Su et al. "
        "2021, on self-attention's queries and keys; needs an even head size) | relative "
        "(T5's bucketed relative position bias, Raffel et al. 2020: a learned scalar per head "
        "and bucket added to self-attention's scores, shared by every layer of a stack).",
    )
    # Section 3.4: the two embedding layers and the pre-softmax projection share one matrix.
    tie_embeddings: bool = _field(
        True, "Tie the decoder's input embedding to the output projection."
    )
    share_embeddings: bool = _field(
        True,
        "Also share the embedding with the source (needs one shared vocabulary; off with "
        "--separate-vocab).",
    )

    # Marian (Junczys-Dowmunt et al. 2018) and its Hugging Face port: a bias on the logits
    # (Marian's decoder_ff_logit_out_b, transformers' final_logits_bias), and an </s> closing
    # every source. Both off in the paper; `tformer import` turns them on for OPUS-MT models.
    output_bias: bool = _field(
        False,
        "Add a learned bias to the output projection's logits (Marian's "
        "decoder_ff_logit_out_b / final_logits_bias, BERT's cls.predictions.bias; the paper "
        "has none).",
    )
    source_eos: bool = _field(
        False,
        "The encoder reads every source with <eos> appended (Marian and OPUS-MT models; the "
        "paper's sources carry none).",
    )

    # GPT-2 (Radford et al. 2019) and BERT (Devlin et al. 2019) differ from the paper in a few
    # lines each; `tformer import` turns these on for their checkpoints, and each trains from
    # scratch too. All off (or None) is the paper's model, so older checkpoints load unchanged.
    embedding_scale: bool = _field(
        True,
        "Multiply token embeddings by sqrt(d_model) (paper, section 3.4); GPT-2 and BERT add "
        "them unscaled (--no-embedding-scale).",
    )
    norm_eps: float | None = _field(
        None,
        "Epsilon of every layer norm (GPT-2: 1e-5, BERT: 1e-12); default: torch's 1e-5 for "
        "LayerNorm, 1e-6 for RMSNorm.",
    )
    embedding_norm: bool = _field(
        False,
        "A layer norm on the embeddings (token + position) before the first layer (BERT's "
        "embeddings.LayerNorm; the paper has none).",
    )
    segment_embedding: bool = _field(
        False,
        "A learned vector added to every token embedding: BERT's token-type embedding of "
        "segment 0 (tformer reads single texts, never sentence pairs, so one vector is all "
        "of it that is used).",
    )
    mlm_head: bool = _field(
        False,
        "Encoder-only: BERT's masked-LM head before the output projection: dense d_model x "
        "d_model, the --activation, then a layer norm (cls.predictions.transform).",
    )
    document_bos: bool = _field(
        True,
        "Decoder-only: every document of a text starts with <bos>; --no-document-bos joins "
        "documents with <eos> alone, which starts the next one (GPT-2's <|endoftext|>; the "
        "text's first document keeps its <bos>).",
    )
    bos_first: bool = _field(
        False,
        "Encoder-only: the model reads <bos> before every text and gives logits for the "
        "text's own positions (BERT's [CLS] ... [SEP]: texts end with <eos> already); the "
        "position table holds --max-len + 1.",
    )

    # T5 (Raffel et al. 2020) differs from the paper in a few more lines; `tformer import`
    # turns these on for its checkpoints (with --positions relative, pre-norm RMSNorm and
    # unscaled embeddings), and each trains from scratch too.
    relative_buckets: int = _field(
        32, "With --positions relative: buckets of relative distance (T5's num_buckets)."
    )
    relative_max_distance: int = _field(
        128,
        "With --positions relative: distance beyond which offsets share the last bucket "
        "(T5's relative_attention_max_distance).",
    )
    attention_scale: bool = _field(
        True,
        "Divide attention scores by sqrt(d_k) (paper, section 3.2.1); T5 folds it into its "
        "initialisation and leaves scores unscaled (--no-attention-scale).",
    )
    linear_bias: bool = _field(
        True,
        "Biases on the attention and feed-forward linear layers (paper); T5 has none "
        "(--no-linear-bias).",
    )
    output_scale: bool = _field(
        False,
        "Multiply the decoder's output by d_model^-0.5 before the tied output projection "
        "(T5 v1.0's rescaling; the paper has none).",
    )

    def __post_init__(self) -> None:
        check_numbers(self)
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value > 0, f"{flag(name)} {value} must be > 0")
        for name in ("n_encoder_layers", "n_decoder_layers"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value >= 1, f"{flag(name)} {value} must be >= 1")
        _require(
            self.max_len <= MAX_LEN_LIMIT,
            f"--max-len {self.max_len} is over {MAX_LEN_LIMIT:,} tokens, more than attention "
            "over one sequence can hold; lower --max-len",
        )
        _require(
            self.d_model % self.n_heads == 0,
            f"--n-heads {self.n_heads} must divide --d-model {self.d_model} "
            f"(each head has d_model / n_heads dimensions)",
        )
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            _require(0.0 <= value < 1.0, f"{flag(name)} {value} must be in [0, 1)")
        _require(self.norm in ("post", "pre"), f"--norm {self.norm!r} must be 'post' or 'pre'")
        one_of("--activation", self.activation, Activation)
        one_of("--normalization", self.normalization, Normalization)
        one_of("--positions", self.positions, Positions)
        one_of("--arch", self.arch, Arch)
        self._check_variants()
        self._check_family_fields()
        _require(
            self.norm_eps is None or 0.0 < self.norm_eps < 1.0,
            f"--norm-eps {self.norm_eps} must be in (0, 1)",
        )
        _require(
            not self.share_embeddings or self.src_vocab_size == self.tgt_vocab_size,
            "shared source/target embeddings need one vocabulary: source has "
            f"{self.src_vocab_size} tokens, target {self.tgt_vocab_size}; "
            "train one shared tokenizer (leave out --separate-vocab) or give the config "
            "share_embeddings=False",
        )

    def _check_variants(self) -> None:
        """The combinations the variants need: K | H for GQA, an even head size for RoPE."""
        if self.kv_heads is not None:
            _require(
                isinstance(self.kv_heads, int) and self.kv_heads >= 1,
                f"--kv-heads {self.kv_heads} must be >= 1",
            )
            _require(
                self.n_heads % self.kv_heads == 0,
                f"--kv-heads {self.kv_heads} must divide --n-heads {self.n_heads} "
                "(each key/value head serves n_heads / kv_heads query heads)",
            )
        _require(
            self.relative_buckets >= 2 and self.relative_max_distance >= 1,
            f"--relative-buckets {self.relative_buckets} must be >= 2 and "
            f"--relative-max-distance {self.relative_max_distance} >= 1",
        )
        _require(
            self.positions != "rope" or self.d_head % 2 == 0,
            f"--positions rope needs an even head size, but --d-model {self.d_model} / "
            f"--n-heads {self.n_heads} = {self.d_head}; change --d-model or --n-heads",
        )

    @property
    def layer_norm_eps(self) -> float:
        """The epsilon of every layer norm: ``norm_eps``, or torch's LayerNorm default (1e-5)
        and LLaMA's RMSNorm one (1e-6)."""
        if self.norm_eps is not None:
            return self.norm_eps
        return 1e-6 if self.normalization == "rmsnorm" else 1e-5

    @property
    def positions_held(self) -> int:
        """Positions the model's table holds: ``max_len``, one more with ``bos_first``."""
        return self.max_len + int(self.bos_first)

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads: ``kv_heads``, or ``n_heads`` (multi-head attention) when unset."""
        return self.n_heads if self.kv_heads is None else self.kv_heads

    @property
    def gated(self) -> bool:
        """Whether the feed-forward is a gated linear unit (SwiGLU / GeGLU, Shazeer 2020)."""
        return self.activation in GATED_ACTIVATIONS

    @property
    def ffn_hidden(self) -> int:
        """The feed-forward's hidden width: ``d_ff``, or for a gated one 2/3 of it rounded up
        to a multiple of 8 (LLaMA's rule: three matrices hold about what two of d_ff did)."""
        if not self.gated:
            return self.d_ff
        return 8 * math.ceil(2 * self.d_ff / 3 / 8)

    @property
    def is_seq2seq(self) -> bool:
        """Whether this is the paper's encoder-decoder (a source and a target)."""
        return self.arch == "encoder-decoder"

    def _check_family_fields(self) -> None:
        """Refuse a field that only another family reads, set away from its default."""
        for family in FAMILY_RECORDS.values():
            if family.name == self.arch:
                continue
            for name in family.own_fields:
                default = _DEFAULTS[name]
                shown = f"--no-{flag(name)[2:]}" if default is True else flag(name)
                _require(
                    getattr(self, name) == default,
                    f"{shown} is for {family.name} models, not --arch {self.arch}",
                )

    @property
    def family(self) -> Family:
        """The record of this model's family (what it reads, how it trains, ...)."""
        return family_record(self.arch)

    @property
    def unused_fields(self) -> tuple[str, ...]:
        """Fields this model does not read: another family's own, the stack and vocabulary a
        one-stack family has not, and the relative bias's settings without relative
        positions."""
        family = self.family
        unused = [
            name
            for other in FAMILY_RECORDS.values()
            if other.name != self.arch
            for name in other.own_fields
        ]
        for stack in ("encoder", "decoder"):
            if stack not in family.stacks:
                unused.append(f"n_{stack}_layers")
        if family.stacks == ("decoder",):
            unused.append("src_vocab_size")
        if family.stacks == ("encoder",):
            unused.append("tgt_vocab_size")
        if family.shared_vocabulary:
            unused.append("share_embeddings")
        if self.positions != "relative":
            unused += ["relative_buckets", "relative_max_distance"]
        return tuple(unused)

    @property
    def layers(self) -> int:
        """Blocks of a one-stack family (decoder-only: decoder layers; encoder-only: encoder)."""
        return getattr(self, f"n_{self.family.stacks[-1]}_layers")

    def kv_cache_bytes_per_token(self, bytes_per_value: int = 4) -> int:
        """Bytes the decoder's key/value caches hold per token (float32 by default): keys and
        values of every decoder layer, kv_heads x d_head each. The self-attention cache grows
        by this per target token, the cross-attention cache holds this per source token."""
        return 2 * self.n_decoder_layers * self.n_kv_heads * self.d_head * bytes_per_value

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> ModelConfig:
        required = {f.name for f in dataclasses.fields(cls)} - set(ADDED_MODEL_KEYS)
        return strict_from_dict(cls, data, source, "model", required)


_DEFAULTS = {spec.name: spec.default for spec in dataclasses.fields(ModelConfig)}
