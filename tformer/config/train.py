"""``TrainConfig``: data, batching, optimiser, schedule, stopping and bookkeeping."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Literal

from tformer.config.checks import (
    _field,
    _require,
    check_numbers,
    flag,
    one_of,
    strict_from_dict,
)
from tformer.errors import ConfigError

Schedule = Literal["inverse-sqrt", "cosine", "linear", "constant"]
PrecisionName = Literal["auto", "fp32", "bf16", "fp16"]
BestMetric = Literal["val_loss", "bleu", "chrf"]
FinalEval = Literal["auto", "full", "none"]

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
    warmup_share: float | None = _field(
        None,
        "Cap the warm-up at this share of the run: of its steps, or under --time-budget of "
        "the steps the budget holds at the pace of its first steps; fixed once and kept on "
        "--resume (0.1 for an imported model).",
    )
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
    fit_budget: bool = _field(
        False,
        "Fit the model's size (an encoder-decoder, before the first step; under --time-budget "
        "from a few timed steps), dropout, attention dropout and --keep-last (under "
        "--time-budget at the pace of its first twentieth) to the run's length in epochs "
        "(docs/training.md); values given as flags, in --config or by --preset stay.",
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
        "--time-budget decode within the budget (5% of it is kept for this) and leave the "
        "rest of the split out; full: the whole split; none: skip it (the last validation "
        "loss is still reported).",
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
        _require(
            self.warmup_share is None or 0.0 < self.warmup_share <= 1.0,
            f"--warmup-share {self.warmup_share} must be in (0, 1]",
        )
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
        return strict_from_dict(cls, data, source, "train")




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
