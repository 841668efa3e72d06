"""The bundled data set: dates as people write them -> ISO 8601 (``YYYY-MM-DD``).

Each pair is ``{"source": "Thursday, 6 March 2025", "target": "2025-03-06"}``. The task is small
enough to train on a laptop, yet every format needs real alignment: reordering (US vs European),
lookups (month names, spelled-out ordinals), copying digits and padding them.

Every source string names exactly one date, so a model can reach 100% exact match:

* Slash numeric formats are US month-first: ``03/06/25``, ``3/6/2025`` = 6 March.
* Dot numeric formats are day-first (European): ``06.03.2025``, ``6.3.25`` = 6 March.
* Dash numeric formats put the 4-digit year first (``2025-3-6``); a day-first dash form only
  appears with a month name (``06-MAR-2025``), so it cannot be confused with them.
* Two-digit years follow the POSIX ``strptime`` ``%y`` pivot: 69-99 -> 1969-1999 and 00-68 ->
  2000-2068. Such formats are only used for dates in 1969..2068, so the rule always holds.
* Weekday names, where present, are the true weekday of the date.

Dates are drawn uniformly by day over 1900-01-01..2099-12-31, then a format is drawn uniformly
from those valid for that date. Month and weekday names are spelled out here (never taken from
the locale) and all randomness comes from one ``random.Random(seed)``, so a seed always gives
byte-identical files. ``python -m tformer.data.dates`` rewrites the committed ``data/`` files.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Mapping, Sequence
from datetime import date
from pathlib import Path
from types import MappingProxyType

MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
# Associated Press style: short months spelled out, the rest cut, "Sept." rather than "Sep.".
AP_MONTHS = (
    "Jan.", "Feb.", "March", "April", "May", "June",
    "July", "Aug.", "Sept.", "Oct.", "Nov.", "Dec.",
)  # fmt: skip
_UNITS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth")
ORDINAL_WORDS = (
    *_UNITS,
    "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth",
    "sixteenth", "seventeenth", "eighteenth", "nineteenth", "twentieth",
    *(f"twenty-{unit}" for unit in _UNITS),
    "thirtieth", "thirty-first",
)  # fmt: skip

# name -> (template, case). Templates use the fields of ``_fields``; the case ("", "lower",
# "upper", "title") is applied to the whole string afterwards.
_FORMATS: dict[str, tuple[str, str]] = {
    "iso_unpadded": ("{year}-{m}-{d}", ""),
    "iso_compact": ("{year}{mm}{dd}", ""),
    "us_slash": ("{mm}/{dd}/{year}", ""),
    "us_slash_short": ("{m}/{d}/{year}", ""),
    "us_slash_2y": ("{mm}/{dd}/{yy}", ""),
    "us_slash_weekday_2y": ("{wkd} {m}/{d}/{yy}", ""),
    "eu_dot": ("{dd}.{mm}.{year}", ""),
    "eu_dot_short_2y": ("{d}.{m}.{yy}", ""),
    "eu_long": ("{d} {month} {year}", ""),
    "eu_long_upper": ("{d} {month} {year}", "upper"),
    "eu_abbr_dot": ("{d} {mon_dot} {year}", ""),
    "eu_weekday": ("{weekday}, {d} {month} {year}", ""),
    "eu_weekday_abbr": ("{wkd} {d} {mon} {year}", ""),
    "eu_ordinal": ("{dth} {month} {year}", ""),
    "eu_ordinal_of": ("the {dth} of {month}, {year}", ""),
    "dash_abbr_upper": ("{dd}-{mon}-{year}", "upper"),
    "dash_abbr_2y": ("{d}-{mon}-{yy}", ""),
    "us_long": ("{month} {d}, {year}", ""),
    "us_long_lower": ("{month} {d} {year}", "lower"),
    "us_abbr": ("{mon} {d} {year}", ""),
    "us_ap": ("{ap} {d}, {year}", ""),
    "us_weekday": ("{weekday}, {month} {d}, {year}", ""),
    "us_weekday_abbr": ("{wkd}, {mon} {d}, {year}", ""),
    "us_ordinal": ("{month} {dth}, {year}", ""),
    "spelled": ("the {dword} of {month} {year}", ""),
    "spelled_title": ("the {dword} of {month} {year}", "title"),
    "spelled_weekday": ("{weekday} the {dword} of {month}, {year}", ""),
}
DATE_FORMATS: tuple[str, ...] = tuple(_FORMATS)
TWO_DIGIT_YEAR_FORMATS: frozenset[str] = frozenset(
    name for name, (template, _) in _FORMATS.items() if "{yy}" in template
)

FIRST_DAY = date(1900, 1, 1)
LAST_DAY = date(2099, 12, 31)
# The %y pivot: a two-digit year is only unambiguous for dates inside this window.
TWO_DIGIT_FIRST_YEAR, TWO_DIGIT_LAST_YEAR = 1969, 2068

SPLIT_NAMES = ("train", "validation", "test")
DEFAULT_SIZES: Mapping[str, int] = MappingProxyType(
    {"train": 20000, "validation": 1000, "test": 1000}
)

Pair = dict[str, str]

_SUFFIXES = {1: "st", 2: "nd", 3: "rd"}


def ordinal_suffix(day: int) -> str:
    """``1`` -> ``"1st"``, ``12`` -> ``"12th"``, ``22`` -> ``"22nd"``."""
    if 11 <= day % 100 <= 13:  # eleventh, twelfth, thirteenth take "th"
        return f"{day}th"
    return f"{day}{_SUFFIXES.get(day % 10, 'th')}"


def _fields(day: date) -> dict[str, str]:
    month = MONTHS[day.month - 1]
    mon = month[:3]
    return {
        "year": f"{day.year:04d}",
        "yy": f"{day.year % 100:02d}",
        "m": str(day.month),
        "mm": f"{day.month:02d}",
        "d": str(day.day),
        "dd": f"{day.day:02d}",
        "dth": ordinal_suffix(day.day),
        "dword": ORDINAL_WORDS[day.day - 1],
        "month": month,
        "mon": mon,
        # "May" is already whole, so "May." would be an abbreviation mark on nothing.
        "mon_dot": mon if mon == month else f"{mon}.",
        "ap": AP_MONTHS[day.month - 1],
        "weekday": WEEKDAYS[day.weekday()],
        "wkd": WEEKDAYS[day.weekday()][:3],
    }


def format_allowed(day: date, fmt_name: str) -> bool:
    """Whether ``fmt_name`` writes ``day`` unambiguously (two-digit years need the pivot)."""
    if fmt_name in TWO_DIGIT_YEAR_FORMATS:
        return TWO_DIGIT_FIRST_YEAR <= day.year <= TWO_DIGIT_LAST_YEAR
    return fmt_name in _FORMATS


def format_date(day: date, fmt_name: str) -> str:
    """Write ``day`` in the named format (one of ``DATE_FORMATS``).

    Raises:
        ValueError: for an unknown format, or a two-digit-year format outside 1969..2068.
    """
    if fmt_name not in _FORMATS:
        raise ValueError(f"unknown date format {fmt_name!r}; choose from {DATE_FORMATS}")
    if not format_allowed(day, fmt_name):
        raise ValueError(
            f"{fmt_name} has a two-digit year, which only names {TWO_DIGIT_FIRST_YEAR}.."
            f"{TWO_DIGIT_LAST_YEAR} unambiguously; got {day.isoformat()}"
        )
    template, case = _FORMATS[fmt_name]
    text = template.format(**_fields(day))
    if case == "lower":
        return text.lower()
    if case == "upper":
        return text.upper()
    # str.title() also capitalises after a hyphen: "The Twenty-First Of March 2025".
    return text.title() if case == "title" else text


def random_date(rng: random.Random) -> date:
    """A date drawn uniformly by day from 1900-01-01..2099-12-31."""
    return date.fromordinal(rng.randint(FIRST_DAY.toordinal(), LAST_DAY.toordinal()))


def random_pair(rng: random.Random) -> Pair:
    """One ``{"source", "target"}`` pair: a random date in a random format valid for it."""
    day = random_date(rng)
    fmt_name = rng.choice([name for name in DATE_FORMATS if format_allowed(day, name)])
    return {"source": format_date(day, fmt_name), "target": day.isoformat()}


def generate_pairs(n: int, rng: random.Random) -> list[Pair]:
    """``n`` random pairs (sources may repeat; ``generate_splits`` removes repeats)."""
    return [random_pair(rng) for _ in range(n)]


def generate_splits(
    seed: int = 0, sizes: Mapping[str, int] = DEFAULT_SIZES
) -> dict[str, list[Pair]]:
    """Splits of the given sizes, in the order of ``sizes``, with no source in two splits.

    Sources are unique across all splits (not just between them), so a held-out score never
    rewards memorising a string seen in training. Targets may repeat: that is the task.
    """
    rng = random.Random(seed)
    seen: set[str] = set()
    # Far more draws than any sensible request needs; stops a loop that can never fill up.
    budget = 20 * sum(sizes.values()) + 1000
    splits: dict[str, list[Pair]] = {}
    for split, size in sizes.items():
        rows: list[Pair] = []
        while len(rows) < size:
            if budget == 0:
                raise ValueError(f"cannot draw {sum(sizes.values())} distinct date strings")
            budget -= 1
            pair = random_pair(rng)
            if pair["source"] not in seen:
                seen.add(pair["source"])
                rows.append(pair)
        splits[split] = rows
    return splits


def write_jsonl(path: Path, rows: Sequence[Pair]) -> None:
    """One JSON object per line, UTF-8, LF endings on every platform, final newline."""
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    path.write_bytes(text.encode("utf-8"))


def write_splits(
    out_dir: str | Path, seed: int = 0, sizes: Mapping[str, int] = DEFAULT_SIZES
) -> dict[str, Path]:
    """Generate the splits and write ``<out_dir>/<split>.jsonl``; returns split -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for split, rows in generate_splits(seed, sizes).items():
        paths[split] = out / f"{split}.jsonl"
        write_jsonl(paths[split], rows)
    return paths


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tformer.data.dates",
        description="Write the date-normalisation data set (human dates -> ISO 8601) as JSONL.",
    )
    parser.add_argument("--out", default="data", help="output folder (default: data)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    for split in SPLIT_NAMES:
        parser.add_argument(
            f"--{split}",
            type=int,
            default=DEFAULT_SIZES[split],
            help=f"pairs in {split}.jsonl (default: {DEFAULT_SIZES[split]})",
        )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``python -m tformer.data.dates [--out data] [--seed 0] [--train N] ...``."""
    args = _parse_args(argv)
    sizes = {split: getattr(args, split) for split in SPLIT_NAMES}
    for split, path in write_splits(args.out, args.seed, sizes).items():
        print(f"{split}: {sizes[split]} pairs -> {path}")


if __name__ == "__main__":
    main()
