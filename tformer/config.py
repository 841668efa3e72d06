"""Frozen configuration: one ``ModelConfig`` for the architecture, one ``TrainConfig`` for training.

Both are built once (by the CLI or by user code), validated in ``__post_init__`` with messages
that name the CLI flag, and written into every checkpoint's ``config.json``. The model only ever
sees ``ModelConfig``; values derived at run time (vocabulary sizes from the tokenizer) go in with
``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from tformer.errors import ConfigError

Norm = Literal["post", "pre"]
Activation = Literal["relu", "gelu"]
Schedule = Literal["inverse-sqrt", "cosine", "linear", "constant"]
PrecisionName = Literal["auto", "fp32", "bf16", "fp16"]
BestMetric = Literal["val_loss", "bleu", "chrf"]


def flag(name: str) -> str:
    """The CLI flag for a config field: ``n_heads`` -> ``--n-heads``."""
    return "--" + name.replace("_", "-")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _one_of(option: str, value: object, choices: Any) -> None:
    """Refuse ``value`` unless it is one of the ``Literal`` type ``choices``."""
    allowed = get_args(choices)
    _require(value in allowed, f"{option} {value!r} must be one of {', '.join(allowed)}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The encoder-decoder architecture of "Attention Is All You Need" (Vaswani et al., 2017).

    Defaults are the paper's base model (section 3, table 3 row "base").
    """

    src_vocab_size: int = 8000
    tgt_vocab_size: int = 8000
    d_model: int = 512
    n_heads: int = 8
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    norm: Norm = "post"
    activation: Activation = "relu"
    max_len: int = 256
    # Section 3.4: the two embedding layers and the pre-softmax projection share one matrix.
    # tie_embeddings ties the decoder's input embedding to the output projection;
    # share_embeddings also reuses it for the source (needs one shared vocabulary).
    tie_embeddings: bool = True
    share_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value > 0, f"{flag(name)} {value} must be > 0")
        for name in ("n_encoder_layers", "n_decoder_layers"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value >= 1, f"{flag(name)} {value} must be >= 1")
        _require(
            self.d_model % self.n_heads == 0,
            f"--n-heads {self.n_heads} must divide --d-model {self.d_model} "
            f"(each head has d_model / n_heads dimensions)",
        )
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            _require(0.0 <= value < 1.0, f"{flag(name)} {value} must be in [0, 1)")
        _require(self.norm in ("post", "pre"), f"--norm {self.norm!r} must be 'post' or 'pre'")
        _require(
            self.activation in ("relu", "gelu"),
            f"--activation {self.activation!r} must be 'relu' or 'gelu'",
        )
        _require(
            not self.share_embeddings or self.src_vocab_size == self.tgt_vocab_size,
            "shared source/target embeddings need one vocabulary: source has "
            f"{self.src_vocab_size} tokens, target {self.tgt_vocab_size}; "
            "use a shared tokenizer or --no-share-embeddings",
        )

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

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


# Recipes: an architecture plus training settings that work well together for one data set.
# The CLI applies a recipe's values in place of the defaults; flags given still win.
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    # The bundled date-normalisation task: >= 95% exact match in under 3 minutes on 2 CPU cores.
    # Small batches: the task is limited by updates, not by data, so a 512-token batch learns
    # about as much per step as a 4096-token one at an eighth of the cost. On a 2-core AMD
    # EPYC, 50 s (~790 steps) already reached 96.6% exact match and 75 s 97.8%, where 4096-token
    # batches reached 74.8% in 75 s; the 150 s budget leaves room for a machine 3x slower.
    "dates": {
        "model": dict(PRESETS["tiny"], d_model=128, d_ff=512),
        "train": dict(
            lr=2e-3,
            warmup_steps=200,
            max_tokens=512,
            time_budget=150.0,
            eval_every=500,
            save_every=1000,
            log_every=100,
        ),
    },
    # Multi30k (29k caption pairs): a small model with strong regularisation; a 2-core Xeon
    # with bf16 (auto precision) trains it for about 44 epochs in the hour, to 37 sacreBLEU
    # en->de on test2016 (benchmarks/multi30k.py). The
    # learning rate falls linearly to 0 at the end of the time budget: with inverse-sqrt it was
    # still at 80% of its peak after the hour, and the model still improving fast. The last 4
    # checkpoints are kept for averaging (tformer average); validation BLEU picks the best.
    "multi30k": {
        "model": dict(PRESETS["small"], dropout=0.3, max_len=128),
        "train": dict(
            lr=1e-3,
            warmup_steps=200,
            schedule="linear",
            max_tokens=6144,
            label_smoothing=0.1,
            time_budget=3600.0,
            eval_every=400,
            save_every=200,
            keep_last=4,
            log_every=50,
            val_bleu=300,
            best_metric="bleu",
        ),
    },
}


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train: data, batching, optimiser, schedule, stopping and bookkeeping."""

    # Data: None means the bundled date-normalisation set in data/.
    data: str | None = None
    source_field: str = "source"
    target_field: str = "target"
    # Batching: a batch holds as many pairs as fit in max_tokens padded tokens (source or
    # target side, whichever is longer), from pairs of similar length.
    max_tokens: int = 4096
    accumulate: int = 1
    # Optimiser: Adam with the paper's beta2 = 0.98 and eps = 1e-9 (section 5.3).
    lr: float | None = None
    warmup_steps: int = 4000
    schedule: Schedule = "inverse-sqrt"
    min_lr: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    # Stopping: whichever limit comes first; with none set, training runs for `epochs`.
    max_steps: int | None = None
    epochs: float | None = None
    time_budget: float | None = None
    # Speed: mixed precision ("auto" picks per device, see tformer.training.precision) and torch.compile.
    precision: PrecisionName = "auto"
    compile: bool = False
    # Validation: loss always; BLEU / chrF of greedy translations of the first `val_bleu`
    # validation pairs when > 0. The best checkpoint and early stopping follow `best_metric`;
    # `patience` evaluations without improvement stop the run.
    val_bleu: int = 0
    best_metric: BestMetric = "val_loss"
    patience: int | None = None
    # An exponential moving average of the weights (0 = off); when on, checkpoints, validation
    # and the final result use the averaged weights.
    ema_decay: float = 0.0
    # Bookkeeping
    eval_every: int = 500
    save_every: int = 1000
    log_every: int = 50
    keep_last: int = 2
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        for name in ("max_tokens", "accumulate", "eval_every", "save_every", "log_every"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value >= 1, f"{flag(name)} {value} must be >= 1")
        _require(self.warmup_steps >= 0, f"--warmup-steps {self.warmup_steps} must be >= 0")
        _require(self.keep_last >= 1, f"--keep-last {self.keep_last} must be >= 1")
        _require(self.lr is None or self.lr > 0, f"--lr {self.lr} must be > 0")
        _require(self.min_lr >= 0, f"--min-lr {self.min_lr} must be >= 0")
        _one_of("--schedule", self.schedule, Schedule)
        for name in ("beta1", "beta2", "label_smoothing"):
            value = getattr(self, name)
            _require(0.0 <= value < 1.0, f"{flag(name)} {value} must be in [0, 1)")
        _require(self.eps > 0, f"--eps {self.eps} must be > 0")
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
        _one_of("--precision", self.precision, PrecisionName)
        _require(self.val_bleu >= 0, f"--val-bleu {self.val_bleu} must be >= 0 (0 = off)")
        _one_of("--best-metric", self.best_metric, BestMetric)
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


def _from_dict(cls: type, data: dict[str, Any], source: str) -> Any:
    """Strict construction: unknown or missing keys are an error, not silently dropped."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{source}: unknown {cls.__name__} keys {unknown}")
    required = {f.name for f in fields(cls)} - set(data)
    if required and cls is ModelConfig:
        raise ConfigError(f"{source}: missing {cls.__name__} keys {sorted(required)}")
    return cls(**data)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr|d)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}


def parse_duration(text: str, *, option: str = "--time-budget") -> float:
    """``"90"``, ``"90s"``, ``"3m"``, ``"1.5h"`` -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ConfigError(f"{option} {text!r} is not a duration; write e.g. 90s, 3m or 1h")
    unit = (match.group(2) or "s").lower()
    seconds = float(match.group(1)) * _UNIT_SECONDS[unit]
    if seconds <= 0:
        raise ConfigError(f"{option} {text!r} must be longer than zero")
    return seconds


# The special tokens every tformer vocabulary starts with, at these ids: the tokenizer
# reserves them and the model masks padding by them.
PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
