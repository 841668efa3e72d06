"""The import base: what every reader of a published model (``marian``, ``gpt2``, ``bert``,
``t5``) goes through, so that each rule about a source folder lives here once.

- Files: config.json through :func:`read_config` (which also names a tformer checkpoint
  given as SOURCE); every other file through :mod:`tformer.source_files` (regular files only,
  bounded in size before a byte is read).
- config.json's values: one declarative table per family (:class:`Key`: the JSON type, the
  bounds, the tformer setting the key feeds), checked by :func:`family_config` before
  transformers reads the file or anything is built; :func:`build_arch` words a ``ModelConfig``
  refusal with the config.json key instead of a command-line flag nobody gave.
- Weights: :mod:`tformer.imports.weights` (one file or shards, every name, shape and dtype
  checked against the headers before a tensor is read or a model is built).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tformer.checkpoint.files import FORMAT, MANIFEST
from tformer.checkpoint.store import Tokenizers
from tformer.config import INT_LIMIT, ModelConfig
from tformer.data.tokenizer import Tokenizer
from tformer.errors import CheckpointError, ConfigError
from tformer.imports.weights import (
    SAVED,
    Tensors,
    open_weights,
    read_state,
)
from tformer.model import TransformerBase, build_model
from tformer.paths import excerpt, first_line
from tformer.source_files import CONFIG_BYTES, read_json

INSTALL = 'pip install "tformer[import]"'
CONFIG = "config.json"
FAST_TOKENIZER = "tokenizer.json"
# The logit bias of a row that must never win: exp(-1e4) is 0 in float32, bf16 and fp16 alike,
# yet it stays finite, so label smoothing's sum over the vocabulary stays finite too.
NEVER = -1e4
# The dtypes weights are read in (as float32); integer or boolean tensors are no weights.

# Bounds on config.json's sizes, far above every published model of these families (widest
# d_model 18,432, feed-forward 73,728, deepest 126 layers, largest vocabulary 262,144), so a
# typo or a hostile file is refused in one line before anything is allocated.
MAX_WIDTH = 2**16
MAX_FFN = 2**18
MAX_HEADS = 2**10
MAX_LAYERS = 2**9
MAX_VOCAB = 2**21
# A position table is built whole (Marian's sinusoids are computed, not read): 16,384 rows is
# 16 times GPT-2's and 32 times OPUS-MT's and BERT's.
MAX_POSITIONS = 2**14
MAX_LABELS = 2**10  # transformers builds a label table of num_labels entries, slowly


@dataclass
class Imported:
    """What an import produces: the model (eval mode), its tokenizers, and where it came from."""

    model: TransformerBase
    tokenizers: Tokenizers
    origin: dict[str, Any]


# -- config.json ----------------------------------------------------------------------------


def read_config(folder: Path) -> dict[str, Any]:
    """The folder's config.json as written (a JSON object of at most 1 MiB).

    Raises:
        CheckpointError: config.json is missing or unreadable, or the folder is a tformer
            checkpoint (which needs no import).
    """
    manifest = os.path.lexists(folder / MANIFEST)
    if manifest and not os.path.lexists(folder / CONFIG):
        _tformer_checkpoint(folder)
    raw = read_json(folder / CONFIG, CONFIG_BYTES, SAVED)
    if raw.get("format") == FORMAT or (manifest and "model_type" not in raw):
        _tformer_checkpoint(folder)
    return raw


def _tformer_checkpoint(folder: Path) -> None:
    raise CheckpointError(
        f"SOURCE {folder}: is a tformer checkpoint already; use it directly (generate, "
        "evaluate, train --init-from ...), there is nothing to import"
    )


@dataclass(frozen=True)
class Key:
    """What one config.json key must hold: its JSON type, its bounds, whether null stands for
    transformers' default, and the ``ModelConfig`` field it becomes (to word that field's
    refusals with the key)."""

    kind: str  # "whole", "number", "flag" or "text"
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself excluded: (0, 1)
    high_open: bool = False
    null: bool = False
    field: str | None = None

    def problem(self, value: Any) -> str | None:
        """Why ``value`` does not fit, in words after "KEY VALUE", or None."""
        expected = {
            "whole": "a whole number",
            "number": "a number",
            "flag": "true or false",
            "text": "a string",
        }[self.kind]
        if value is None:
            return None if self.null else f"must be {expected}"
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        fits = {
            "whole": number and isinstance(value, int),
            "number": number,
            "flag": isinstance(value, bool),
            "text": isinstance(value, str),
        }[self.kind]
        if not fits:
            return f"must be {expected}" + (" or null" if self.null else "")
        if self.kind == "number" and not math.isfinite(value):
            return "must be a finite number"
        if self.low is None or self.high is None:
            return None
        below = value < self.low or (self.low_open and value == self.low)
        above = value > self.high or (self.high_open and value == self.high)
        if not below and not above:
            return None
        if self.kind == "whole":
            return f"must be from {self.low:,.0f} to {self.high:,.0f}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"must be in {left}{self.low:g}, {self.high:g}{right}"


    # What a key of each meaning must hold; the bounds live here once.

    @classmethod
    def whole(
        cls, low: int, high: int = INT_LIMIT, field: str | None = None, *, null: bool = False
    ) -> Key:
        """A count or size from ``low`` to ``high``."""
        return cls("whole", low, high, null=null, field=field)

    @classmethod
    def width(cls, field: str | None = "d_model") -> Key:
        return cls.whole(1, MAX_WIDTH, field)

    @classmethod
    def heads(cls) -> Key:
        return cls.whole(1, MAX_HEADS, "n_heads")

    @classmethod
    def ffn(cls, *, null: bool = False) -> Key:
        return cls.whole(1, MAX_FFN, "d_ff", null=null)

    @classmethod
    def layers(cls, field: str, *, null: bool = False) -> Key:
        return cls.whole(1, MAX_LAYERS, field, null=null)

    @classmethod
    def positions(cls, field: str | None = "max_len", low: int = 1, more: int = 0) -> Key:
        """A count of positions; ``more`` beyond tformer's own (BERT's [CLS] has one)."""
        return cls.whole(low, MAX_POSITIONS + more, field)

    @classmethod
    def vocab(cls, *, null: bool = False) -> Key:
        return cls.whole(1, MAX_VOCAB, null=null)

    @classmethod
    def token_id(cls, *, null: bool = False) -> Key:
        """A token id (the tokenizer's check places it)."""
        return cls.whole(0, MAX_VOCAB, null=null)

    @classmethod
    def fraction(cls, field: str) -> Key:
        """A probability that leaves something: a dropout rate, in [0, 1)."""
        return cls("number", 0.0, 1.0, high_open=True, field=field)

    @classmethod
    def epsilon(cls) -> Key:
        """A normalisation's epsilon, in (0, 1)."""
        return cls("number", 0.0, 1.0, low_open=True, high_open=True, field="norm_eps")

    @classmethod
    def flag(cls, *, null: bool = False) -> Key:
        return cls("flag", null=null)

    @classmethod
    def text(cls) -> Key:
        return cls("text")


# Keys every family reads (through transformers' PretrainedConfig; model_type is matched).
COMMON_KEYS = {
    "tie_word_embeddings": Key.flag(),
    "num_labels": Key.whole(1, MAX_LABELS),
}


def check_config(path: Path, raw: dict[str, Any], table: dict[str, Key]) -> None:
    """Refuse, naming each key and value, what config.json holds against ``table``.

    Raises:
        CheckpointError: every value of the wrong type or out of bounds, in one line.
    """
    problems = []
    for key, rule in {**COMMON_KEYS, **table}.items():
        if key in raw:
            problem = rule.problem(raw[key])
            if problem is not None:
                problems.append(f"{key} {excerpt(raw[key])} {problem}")
    if problems:
        raise CheckpointError(f"{path}: {'; '.join(problems)}")


def transformers_config(folder: Path, name: str, raw: dict[str, Any]) -> Any:
    """``transformers.<name>`` (e.g. "GPT2Config") of config.json's ``raw`` values.

    Raises:
        CheckpointError: transformers refuses the values.
        ConfigError: transformers is not installed.
    """
    try:
        import transformers
    except ImportError as error:
        raise ConfigError(f"tformer import needs transformers; {INSTALL}") from error
    try:
        return getattr(transformers, name).from_dict(raw)
    except Exception as error:  # its own validation errors, or a value its code trips on
        raise CheckpointError(
            f"{folder / CONFIG}: transformers cannot read it as a {name} ({first_line(error)})"
        ) from error


@dataclass
class Checked:
    """A folder's config.json, checked: transformers' config of it, the values as written,
    and the family's table (whose keys word the refusals of what is built from it)."""

    folder: Path
    config: Any
    raw: dict[str, Any]
    keys: dict[str, Key]


def family_config(
    folder: Path,
    name: str,
    model_type: str,
    keys: dict[str, Key],
    problems: Callable[[Any], list[str]],
) -> Checked:
    """config.json of a ``model_type`` model, its values checked against the family's table
    ``keys``, read by transformers as ``name`` (e.g. "GPT2Config"), and what ``problems``
    finds tformer cannot express refused.

    Raises:
        CheckpointError: another model type; a value of the wrong type or out of bounds, or
            one transformers refuses; the settings ``problems`` names (all in one line).
        ConfigError: transformers is not installed.
    """
    raw = read_config(folder)
    if raw.get("model_type") != model_type:
        raise CheckpointError(
            f"{folder / CONFIG}: model_type {excerpt(raw.get('model_type'))} is not "
            f"{model_type!r}; this reader takes {name.removesuffix('Config')} folders only"
        )
    check_config(folder / CONFIG, raw, keys)
    config = transformers_config(folder, name, raw)
    refuse_settings(folder, problems(config))
    return Checked(folder, config, raw, keys)


def refuse_settings(folder: Path, problems: list[str]) -> None:
    """Refuse, naming every one in one line, the settings tformer has no equivalent for.

    Raises:
        CheckpointError: when there are any.
    """
    if problems:
        raise CheckpointError(
            f"{folder / CONFIG}: {'; '.join(problems)}: tformer has no equivalent, so this "
            "model cannot be imported"
        )


_FLAG = re.compile(r"--([a-z][a-z0-9-]*)")


def build_arch(checked: Checked, make: Callable[[], ModelConfig]) -> ModelConfig:
    """``make()``'s architecture; a refusal names config.json's keys, not tformer's flags.

    Raises:
        CheckpointError: ``ModelConfig`` refuses the values, worded with the keys.
    """
    try:
        return make()
    except ConfigError as error:
        keys: dict[str, str] = {}
        for name, rule in checked.keys.items():
            if rule.field:
                keys.setdefault(rule.field, name)

        def key_of(match: re.Match[str]) -> str:
            field = match.group(1).replace("-", "_")
            return keys.get(field, field)

        where = checked.folder / CONFIG
        raise CheckpointError(f"{where}: {_FLAG.sub(key_of, str(error))}") from error


def origin_of(source: str, folder: Path, config: Any, tokenizer: str) -> dict[str, Any]:
    """What config.json records of where imported weights came from."""
    return {
        "source": source,
        "folder": str(folder.resolve()),
        "model_type": config.model_type,
        "transformers_version": getattr(config, "transformers_version", None),
        "tokenizer": tokenizer,
    }


def one_tokenizer_import(
    checked: Checked,
    source: str,
    tokenizer: tuple[Tokenizer, str],
    arch: Callable[[], ModelConfig],
    convert: Callable[[Tensors], dict[str, torch.Tensor]],
    unused: Callable[[str], bool],
    prefix: str = "",
) -> Imported:
    """The import of a family whose two sides read one tokenizer (GPT-2, BERT, T5), in the
    order each keeps: the architecture checked (``build_arch``), every tensor's name, shape
    and dtype checked against the headers (``read_state``), then the tensors read and the
    model built.

    Args:
        tokenizer: tformer's tokenizer, and the name of the folder's tokenizer class.
        prefix: what the weights' names lose (GPT2LMHeadModel saves its body as
            ``transformer.*``).
    """
    model_config = build_arch(checked, arch)
    with open_weights(checked.folder, prefix) as weights:
        state = read_state(weights, convert, unused)
    model = build_model(model_config)
    model.load_state_dict(state, strict=True)
    origin = origin_of(source, checked.folder, checked.config, tokenizer[1])
    return Imported(model.eval(), Tokenizers(tokenizer[0], tokenizer[0]), origin)
