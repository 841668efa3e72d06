"""The checks every configuration value goes through: types (``check_types``, one checker
reading the dataclass field types), bounds on counts, sizes and seeds, valid Unicode text, the
CLI flag a field is named by in messages, and strict construction from ``config.json``."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import field, fields
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from tformer.errors import ConfigError, DataError, TformerError


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




def strict_from_dict(
    cls: type, data: dict[str, Any], source: str, section: str, required: set[str] | None = None
) -> Any:
    """Strict construction from a ``config.json`` section: unknown keys are an error, not
    silently dropped, and so is a missing one of ``required`` (None: every key may be left to
    its default)."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{source}: unknown {cls.__name__} keys {unknown}")
    missing = sorted((required or set()) - set(data))
    if missing:
        raise ConfigError(f"{source}: missing {cls.__name__} keys {missing}")
    return cls(**check_types(cls, data, lambda key: f"{section}.{key}"))


def article(word: str) -> str:
    """ "a" or "an" before ``word`` (by its first letter), for messages naming a family."""
    return "an" if word[:1].lower() in "aeiou" else "a"
