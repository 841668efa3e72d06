"""Frozen configuration: one ``ModelConfig`` for the architecture, one ``TrainConfig`` for training.

Both are built once (by the CLI or by user code), validated in ``__post_init__`` with messages
that name the CLI flag, and written into every checkpoint's ``config.json``. The model only ever
sees ``ModelConfig``; values derived at run time (vocabulary sizes from the tokenizer) go in with
``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from importlib import resources
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from tformer import safe_yaml
from tformer.errors import ConfigError, DataError, TformerError

Arch = Literal["encoder-decoder", "decoder-only", "encoder-only"]
Norm = Literal["post", "pre"]
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh"]
GATED_ACTIVATIONS = ("swiglu", "geglu", "geglu_tanh")
Positions = Literal["sinusoidal", "learned", "rope", "relative"]
Normalization = Literal["layernorm", "rmsnorm"]
Schedule = Literal["inverse-sqrt", "cosine", "linear", "constant"]
PrecisionName = Literal["auto", "fp32", "bf16", "fp16"]
BestMetric = Literal["val_loss", "bleu", "chrf"]
FinalEval = Literal["auto", "full", "none"]


def flag(name: str) -> str:
    """The CLI flag for a config field: ``n_heads`` -> ``--n-heads``."""
    return "--" + name.replace("_", "-")


def _field(default: Any, help: str) -> Any:
    """A dataclass field with its one help text (the CLI option shows it)."""
    return field(default=default, metadata={"help": help})


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


# Bounds on what an option can ask for, so a typo (--seed 1e30, --d-model 10**9) is refused in
# one line before anything is allocated. Counts and sizes fit a C int (what torch and the
# tokenizers library index with); seeds fit the 64-bit generators they seed.
INT_LIMIT = 2**31 - 1
SEED_LIMIT = 2**63 - 1
# The longest sequence: the position table is built whole, and attention over one sequence
# this long is past any memory (its weights alone are MAX_LEN_LIMIT**2 numbers per head).
MAX_LEN_LIMIT = 2**20


# What a value of each field type must be, as messages name it.
_EXPECTED = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}


def kind_of(value: object) -> str:
    """What ``value`` is, in a message's words ("a boolean", "a list" ...)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "a number"
        return "a floating-point number" if value.is_integer() else "a fractional number"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, bytes):
        return "binary data"
    if isinstance(value, (list, tuple, set)):
        return "a list"
    return f"a {type(value).__name__}"


def _shown(value: object) -> str:
    """``value`` as the file wrote it (``true``, ``null``), cut short like any quoted value."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    shown = repr(value)
    return shown if len(shown) <= 60 else f"{shown[:60]}... ({len(shown):,} characters)"


def _accepts(hint: Any, value: object) -> tuple[bool, Any]:
    """Whether ``value`` is of type ``hint`` (an int counts as a float, bool as neither),
    and the value to keep (the int made a float); a hint this does not know accepts all."""
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value  # type: ignore[arg-type]
    if hint is str:
        return isinstance(value, str), value
    if get_origin(hint) is Literal:  # which member it is, one_of checks with its own message
        return isinstance(value, str), value
    if get_origin(hint) in (Union, UnionType):
        for option in get_args(hint):
            ok, kept = (value is None, value) if option is type(None) else _accepts(option, value)
            if ok:
                return True, kept
        return False, value
    return True, value


def _expected(hint: Any) -> str:
    if get_origin(hint) is Literal:
        return "one of " + ", ".join(map(str, get_args(hint)))
    if get_origin(hint) in (Union, UnionType):
        options = [a for a in get_args(hint) if a is not type(None)]
        return " or ".join(_expected(a) for a in options) + " or null"
    return _EXPECTED.get(hint, str(hint))


def check_types(
    cls: type, values: Mapping[str, Any], name: Callable[[str], str] = flag
) -> dict[str, Any]:
    """``values`` for fields of dataclass ``cls``, each checked against its field's type.

    A boolean is not a number, a fractional number is not a count, a string is not a number,
    a list is not a scalar. Whole numbers given for a float field become floats. Keys that
    are not fields are left for the caller to refuse.

    Raises:
        ConfigError: a value of the wrong type, naming it by ``name(field)``.
    """
    hints = _type_hints(cls)
    checked = dict(values)
    for key, value in values.items():
        if key not in hints:
            continue
        ok, checked[key] = _accepts(hints[key], value)
        if not ok:
            raise ConfigError(
                f"{name(key)}: {_shown(value)} is {kind_of(value)}, not {_expected(hints[key])}"
            )
        _check_value(name(key), checked[key], seed=key == "seed")
    return checked


def _check_value(option: str, value: object, *, seed: bool) -> None:
    """Refuse a non-finite float, an int out of range or a string no file or path can hold."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, float):
        _require(math.isfinite(value), f"{option} {value} must be a finite number")
    elif isinstance(value, int):
        check_int(option, value, seed=seed)
    elif isinstance(value, str):
        check_text(value, option, ConfigError)
        _require(value != "", f"{option}: an empty string; give a value or leave it out")
        _require("\0" not in value, f"{option}: {_shown(value)} holds a NUL character")


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return {f.name: hint for f in fields(cls) if (hint := get_type_hints(cls).get(f.name))}


def check_text(text: str, where: str, error: type[TformerError] = DataError) -> str:
    """``text``, refused when it is not valid Unicode text.

    A lone surrogate (U+D800..U+DFFF) is what Python makes of bytes that are not UTF-8 in a
    command-line argument, and what a JSON ``"\\udc80"`` escape reads as; no tokenizer, file
    or terminal can take it.

    Raises:
        DataError (or ``error``): naming ``where`` and the character's position.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as bad:
        raise error(
            f"{where}: not valid Unicode text (a lone surrogate U+{ord(text[bad.start]):04X} "
            f"at character {bad.start}: bytes that are not UTF-8, or a JSON \\u escape of "
            "half a pair); give UTF-8 text"
        ) from None
    return text


def check_numbers(config: object) -> None:
    """Refuse a value of the wrong type, a non-finite float (inf, nan) or an out-of-range int
    in any field of ``config`` (ints given for float fields become floats).

    Runs before the per-field range checks, whose comparisons a nan would slip through.
    """
    values = {spec.name: getattr(config, spec.name) for spec in fields(config)}  # type: ignore[arg-type]
    for key, value in check_types(type(config), values).items():
        if value is not values[key]:
            object.__setattr__(config, key, value)  # frozen: set once, while it is built


def check_int(option: str, value: int, *, seed: bool = False) -> None:
    """Refuse an int outside what ``option`` can hold (a seed: 0 .. 2**63 - 1)."""
    if seed:
        _require(
            0 <= value <= SEED_LIMIT,
            f"{option} {value} is out of range; use a seed from 0 to {SEED_LIMIT} (2**63 - 1)",
        )
    else:
        _require(
            -INT_LIMIT <= value <= INT_LIMIT,
            f"{option} {value} is out of range; the largest accepted is {INT_LIMIT:,}",
        )


def one_of(option: str, value: object, choices: Any) -> None:
    """Refuse ``value`` unless it is one of the ``Literal`` type ``choices``."""
    allowed = get_args(choices)
    _require(value in allowed, f"{option} {value!r} must be one of {', '.join(allowed)}")


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
        _require(
            not self.source_eos or self.is_seq2seq,
            f"--source-eos is for encoder-decoder models, not --arch {self.arch}",
        )
        _require(
            self.document_bos or self.arch == "decoder-only",
            f"--no-document-bos is for decoder-only models, not --arch {self.arch}",
        )
        for name in ("mlm_head", "bos_first"):
            _require(
                not getattr(self, name) or self.arch == "encoder-only",
                f"{flag(name)} is for encoder-only models, not --arch {self.arch}",
            )
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

    @property
    def unused_fields(self) -> tuple[str, ...]:
        """Fields the family does not read (a one-stack model has one stack and one vocabulary)."""
        if self.arch == "decoder-only":
            return ("src_vocab_size", "n_encoder_layers", "share_embeddings")
        if self.arch == "encoder-only":
            return ("tgt_vocab_size", "n_decoder_layers", "share_embeddings")
        return ()

    @property
    def layers(self) -> int:
        """Blocks of a one-stack family (decoder-only: decoder layers; encoder-only: encoder)."""
        return self.n_encoder_layers if self.arch == "encoder-only" else self.n_decoder_layers

    def kv_cache_bytes_per_token(self, bytes_per_value: int = 4) -> int:
        """Bytes the decoder's key/value caches hold per token (float32 by default): keys and
        values of every decoder layer, kv_heads x d_head each. The self-attention cache grows
        by this per target token, the cross-attention cache holds this per source token."""
        return 2 * self.n_decoder_layers * self.n_kv_heads * self.d_head * bytes_per_value

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> ModelConfig:
        return _from_dict(cls, data, source)


# Named architectures. "base" is the paper's base model; the smaller ones keep its proportions
# (d_ff = 4 * d_model) and are sized for a CPU.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=256),
    "small": dict(d_model=256, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, d_ff=1024),
    "base": dict(d_model=512, n_heads=8, n_encoder_layers=6, n_decoder_layers=6, d_ff=2048),
}
DEFAULT_PRESET = "small"


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A ``ModelConfig`` from a named preset, with ``None`` overrides ignored."""
    if name not in PRESETS:
        raise ConfigError(f"--preset {name!r} is unknown; choose one of {', '.join(PRESETS)}")
    values = dict(PRESETS[name])
    values.update({k: v for k, v in overrides.items() if v is not None})
    return ModelConfig(**values)


# Recipes: an architecture plus training settings that work well together for one data set,
# one YAML file each in tformer/recipes/ (with the reasons for their values). `tformer train`
# applies a recipe's values in place of the defaults; a --config file and flags given still win.
RECIPE_SECTIONS = ("model", "train")


def _load_recipes() -> dict[str, dict[str, dict[str, Any]]]:
    recipes = {}
    for entry in sorted(resources.files("tformer.recipes").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            text = entry.read_text(encoding="utf-8")
            data = safe_yaml.load(text, f"recipe {entry.name}") or {}
            recipes[entry.name.removesuffix(".yaml")] = {
                k: dict(data.get(k) or {}) for k in RECIPE_SECTIONS
            }
    return recipes


RECIPES: dict[str, dict[str, dict[str, Any]]] = _load_recipes()


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train: data, batching, optimiser, schedule, stopping and bookkeeping.

    Each field's ``help`` is also the help of its ``tformer train`` option.
    """

    data: str | None = _field(
        None,
        "A folder with train/validation/test .jsonl (or .csv, .tsv, .parquet), one such file, "
        "a folder `tformer prepare` wrote, or a Hugging Face dataset name. Default: the "
        "bundled date set in data/.",
    )
    source_field: str = _field(
        "source",
        "Source column; for paired text files (train.en + train.de) or translation records, "
        "the source language.",
    )
    target_field: str = _field("target", "Target column, or the target language.")
    text_field: str = _field(
        "text", "Text column of a language model's data (--arch decoder-only / encoder-only)."
    )
    pack: bool = _field(
        True,
        "Language models: join the documents with <eos> and cut them into blocks of "
        "--max-len tokens (--no-pack: one document a row, padded, longer ones cut).",
    )
    block_size: int | None = _field(
        None, "Language models: tokens per packed block (default and at most --max-len)."
    )
    # BERT's masking (Devlin et al. 2019, section 3.1): of the tokens chosen, 80% become
    # <mask>, 10% a random token and 10% stay, so the model cannot rely on seeing <mask>.
    mlm_probability: float = _field(
        0.15, "Masked language model: share of the tokens chosen for prediction."
    )
    mlm_mask: float = _field(0.8, "Of the chosen tokens, the share replaced by <mask>.")
    mlm_random: float = _field(
        0.1, "Of the chosen tokens, the share replaced by a random token (the rest stay)."
    )
    streaming: bool = _field(
        False,
        "Read --data as a stream (a hub data set too large to download whole, or large local "
        "files) and tokenise it into the id cache as it comes.",
    )
    # A batch holds as many pairs of similar length as fit in max_tokens padded tokens.
    max_tokens: int = _field(
        4096, "Padded tokens per batch; lower it after an out-of-memory error."
    )
    accumulate: int = _field(1, "Batches per optimiser step.")
    # Adam with the paper's beta2 = 0.98 and eps = 1e-9 (section 5.3).
    lr: float | None = _field(
        None, "Peak learning rate (default: the paper's d_model^-0.5 * warmup^-0.5)."
    )
    warmup_steps: int = _field(4000, "Steps of linear learning-rate warm-up.")
    schedule: Schedule = _field(
        "inverse-sqrt",
        "inverse-sqrt (paper) | cosine | linear | constant. cosine and linear decay to "
        "--min-lr by the end of --max-steps / --epochs / --time-budget.",
    )
    min_lr: float = _field(0.0, "Where cosine and linear schedules end.")
    beta1: float = _field(0.9, "Adam beta1.")
    beta2: float = _field(0.98, "Adam beta2.")
    eps: float = _field(1e-9, "Adam epsilon.")
    weight_decay: float = _field(0.0, "Decoupled weight decay (AdamW) when > 0.")
    label_smoothing: float = _field(0.1, "Label smoothing of the training loss.")
    clip_norm: float = _field(1.0, "Clip the gradient norm to this (0 = off).")
    # Stopping: whichever limit comes first; with none set, training runs for 10 epochs.
    max_steps: int | None = _field(None, "Stop after this many optimizer steps.")
    epochs: float | None = _field(None, "Stop after this many epochs (10 when no limit is set).")
    time_budget: float | None = _field(
        None,
        "Stop after this long, e.g. 90s, 4m30s, 1h (the final validation included: see "
        "--final-eval).",
    )
    precision: PrecisionName = _field(
        "auto",
        "auto | fp32 | bf16 | fp16. auto: bf16 autocast on GPUs that have it (else fp16 with a "
        "grad scaler) and on CPUs with AMX / AVX-512-BF16 for models with d_model >= 256; fp32 "
        "otherwise.",
    )
    compile: bool = _field(
        False,
        "torch.compile the model for training (compiles once, then runs faster; checkpoints "
        "are unaffected).",
    )
    val_bleu: int = _field(
        0,
        "At each evaluation, translate this many validation pairs (greedy) and report "
        "sacreBLEU and chrF (0 = off).",
    )
    best_metric: BestMetric = _field(
        "val_loss",
        "What best/ keeps and --patience watches: val_loss | bleu | chrf (needs --val-bleu).",
    )
    final_eval: FinalEval = _field(
        "auto",
        "After the last step, translate the validation split (greedy) and report BLEU and "
        "chrF, and exact match where the targets are a few words (dates, codes). auto: under "
        "--time-budget stop decoding 5% of the budget after training; full: the whole split; "
        "none: skip it (the last validation loss is still reported).",
    )
    patience: int | None = _field(
        None, "Stop after this many evaluations without a better --best-metric."
    )
    ema_decay: float = _field(
        0.0,
        "Keep an exponential moving average of the weights (e.g. 0.999; 0 = off); checkpoints "
        "and validation then use the average.",
    )
    eval_every: int = _field(500, "Evaluate on the validation split every N steps.")
    save_every: int = _field(1000, "Save a checkpoint every N steps.")
    log_every: int = _field(50, "Log the training loss every N steps.")
    keep_last: int = _field(2, "Step checkpoints to keep (the best one is kept apart in best/).")
    seed: int = _field(0, "Random seed: the same seed gives the same run.")
    device: str = _field("auto", "auto, cpu, cuda[:N], mps.")

    def __post_init__(self) -> None:
        check_numbers(self)
        for name in ("max_tokens", "accumulate", "eval_every", "save_every", "log_every"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value >= 1, f"{flag(name)} {value} must be >= 1")
        _require(self.warmup_steps >= 0, f"--warmup-steps {self.warmup_steps} must be >= 0")
        _require(self.keep_last >= 1, f"--keep-last {self.keep_last} must be >= 1")
        _require(self.lr is None or self.lr > 0, f"--lr {self.lr} must be > 0")
        _require(self.min_lr >= 0, f"--min-lr {self.min_lr} must be >= 0")
        one_of("--schedule", self.schedule, Schedule)
        for name in ("beta1", "beta2", "label_smoothing"):
            value = getattr(self, name)
            _require(0.0 <= value < 1.0, f"{flag(name)} {value} must be in [0, 1)")
        _require(self.eps > 0, f"--eps {self.eps} must be > 0")
        _require(
            self.block_size is None or self.block_size >= 2,
            f"--block-size {self.block_size} must be >= 2",
        )
        _require(
            0.0 < self.mlm_probability < 1.0,
            f"--mlm-probability {self.mlm_probability} must be in (0, 1)",
        )
        for name in ("mlm_mask", "mlm_random"):
            value = getattr(self, name)
            _require(0.0 <= value <= 1.0, f"{flag(name)} {value} must be in [0, 1]")
        _require(
            self.mlm_mask + self.mlm_random <= 1.0,
            f"--mlm-mask {self.mlm_mask} + --mlm-random {self.mlm_random} must not exceed 1 "
            "(the rest of the chosen tokens stay as they are)",
        )
        _require(self.weight_decay >= 0, f"--weight-decay {self.weight_decay} must be >= 0")
        _require(self.clip_norm >= 0, f"--clip-norm {self.clip_norm} must be >= 0 (0 = off)")
        _require(
            self.max_steps is None or self.max_steps >= 1,
            f"--max-steps {self.max_steps} must be >= 1",
        )
        _require(self.epochs is None or self.epochs > 0, f"--epochs {self.epochs} must be > 0")
        _require(
            self.time_budget is None or self.time_budget > 0,
            f"--time-budget {self.time_budget} must be > 0",
        )
        one_of("--precision", self.precision, PrecisionName)
        _require(self.val_bleu >= 0, f"--val-bleu {self.val_bleu} must be >= 0 (0 = off)")
        one_of("--best-metric", self.best_metric, BestMetric)
        one_of("--final-eval", self.final_eval, FinalEval)
        _require(
            self.best_metric == "val_loss" or self.val_bleu > 0,
            f"--best-metric {self.best_metric} needs --val-bleu N (validation pairs to translate)",
        )
        _require(
            self.patience is None or self.patience >= 1,
            f"--patience {self.patience} must be >= 1",
        )
        _require(
            0.0 <= self.ema_decay < 1.0, f"--ema-decay {self.ema_decay} must be in [0, 1) (0 = off)"
        )
        _require(
            self.device in ("auto", "cpu", "cuda", "mps") or self.device.startswith("cuda:"),
            f"--device {self.device!r} must be auto, cpu, cuda, cuda:N or mps",
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> TrainConfig:
        return _from_dict(cls, data, source)


# ModelConfig keys added after checkpoints were first written: a config.json without them is
# a model of their defaults (the paper's), which is what such a checkpoint holds.
ADDED_MODEL_KEYS = (
    "kv_heads", "normalization", "positions", "arch", "output_bias", "source_eos",
    "embedding_scale", "norm_eps", "embedding_norm", "segment_embedding", "mlm_head",
    "bos_first", "document_bos", "relative_buckets", "relative_max_distance",
    "attention_scale", "linear_bias", "output_scale",
)


def _from_dict(cls: type, data: dict[str, Any], source: str) -> Any:
    """Strict construction: unknown or missing keys are an error, not silently dropped
    (a ModelConfig's ``ADDED_MODEL_KEYS`` may be missing: they take their defaults)."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{source}: unknown {cls.__name__} keys {unknown}")
    required = {f.name for f in fields(cls)} - set(data)
    if cls is ModelConfig:
        required -= set(ADDED_MODEL_KEYS)
    if required and cls is ModelConfig:
        raise ConfigError(f"{source}: missing {cls.__name__} keys {sorted(required)}")
    section = "model" if cls is ModelConfig else "train"
    return cls(**check_types(cls, data, lambda key: f"{section}.{key}"))


_NUMBER = r"\d+(?:\.\d+)?"
_UNITS = r"d|hr|h|min|m|sec|s"
_DURATION_PART = re.compile(rf"({_NUMBER})\s*({_UNITS})(?![a-z])", re.IGNORECASE)
_DURATION = re.compile(
    rf"\s*(?:{_NUMBER}|(?:{_NUMBER}\s*(?:{_UNITS})(?![a-z])\s*)+)\s*", re.IGNORECASE
)
_UNIT_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}


def parse_duration(text: str, *, option: str = "--time-budget") -> float:
    """``"90"``, ``"90s"``, ``"3m"``, ``"1.5h"``, ``"4m30s"``, ``"1h 30m"`` -> seconds."""
    if not _DURATION.fullmatch(text):
        raise ConfigError(f"{option} {text!r} is not a duration; write e.g. 90s, 4m30s or 1h")
    parts = _DURATION_PART.findall(text) or [(text.strip(), "s")]
    units = [_UNIT_SECONDS[unit.lower()] for _, unit in parts]
    if len(set(units)) != len(units):
        raise ConfigError(f"{option} {text!r} gives one unit twice; write e.g. 4m30s")
    seconds = sum(float(number) * unit for (number, _), unit in zip(parts, units, strict=True))
    if seconds <= 0:
        raise ConfigError(f"{option} {text!r} must be longer than zero")
    return seconds


# The special tokens every tformer vocabulary starts with, at these ids: the tokenizer
# reserves them and the model masks padding by them.
PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
# A masked language model's tokenizer has one more special token, right after those four.
MASK, MASK_ID = "<mask>", 4


def article(word: str) -> str:
    """ "a" or "an" before ``word`` (by its first letter), for messages naming a family."""
    return "an" if word[:1].lower() in "aeiou" else "a"
