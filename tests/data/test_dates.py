"""The bundled date-normalisation data set: conventions, determinism and the committed files.

The parse checks are deliberately independent of the generator: numeric formats are read back
with ``datetime.strptime`` under the documented conventions, and names and ordinals come from
tables written here rather than from ``tformer.data.dates``.
"""

from __future__ import annotations

import random
import re
from datetime import date, datetime
from pathlib import Path

import pytest

from tformer.data import dates

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
SMALL = {"train": 300, "validation": 50, "test": 50}

# strptime patterns for each format after ``_normalise``. %y uses the POSIX pivot (69-99 ->
# 19xx, 00-68 -> 20xx), which is the documented convention. Name matching in strptime is
# case-insensitive, and Python leaves LC_TIME at "C", so %B / %b / %A / %a are English.
PATTERNS: dict[str, tuple[str, ...]] = {
    "iso_unpadded": ("%Y-%m-%d",),
    "iso_compact": ("%Y%m%d",),
    "us_slash": ("%m/%d/%Y",),
    "us_slash_short": ("%m/%d/%Y",),
    "us_slash_2y": ("%m/%d/%y",),
    "us_slash_weekday_2y": ("%a %m/%d/%y",),
    "eu_dot": ("%d.%m.%Y",),
    "eu_dot_short_2y": ("%d.%m.%y",),
    "eu_long": ("%d %B %Y",),
    "eu_long_upper": ("%d %B %Y",),
    "eu_abbr_dot": ("%d %b %Y",),
    "eu_weekday": ("%A, %d %B %Y",),
    "eu_weekday_abbr": ("%a %d %b %Y",),
    "eu_ordinal": ("%d %B %Y",),
    "eu_ordinal_of": ("the %d of %B, %Y",),
    "dash_abbr_upper": ("%d-%b-%Y",),
    "dash_abbr_2y": ("%d-%b-%y",),
    "us_long": ("%B %d, %Y",),
    "us_long_lower": ("%B %d %Y",),
    "us_abbr": ("%b %d %Y",),
    "us_ap": ("%B %d, %Y", "%b %d, %Y"),  # "March 6, 2025" but "Sept. 6, 2025"
    "us_weekday": ("%A, %B %d, %Y",),
    "us_weekday_abbr": ("%a, %b %d, %Y",),
    "us_ordinal": ("%B %d, %Y",),
    "spelled": ("the %d of %B %Y",),
    "spelled_title": ("the %d of %B %Y",),
    "spelled_weekday": ("%A the %d of %B, %Y",),
}
WEEKDAY_NAMES = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
SPELLED = (
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth "
    "thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth "
    "twenty-first twenty-second twenty-third twenty-fourth twenty-fifth twenty-sixth "
    "twenty-seventh twenty-eighth twenty-ninth thirtieth thirty-first"
).split()


def _normalise(source: str) -> str:
    """Make a source strptime-readable: numeric ordinals, no abbreviation dots, "Sept" -> "Sep"."""
    text = source.lower()
    # Longest words first, so "twenty-first" is not read as "twenty-" + "first".
    for number, word in sorted(enumerate(SPELLED, 1), key=lambda item: -len(item[1])):
        text = re.sub(rf"\b{word}\b", str(number), text)
    text = re.sub(r"\b(\d{1,2})(st|nd|rd|th)\b", r"\1", text)
    text = re.sub(r"\bsept\b", "sep", text)
    return re.sub(r"(?<=[a-z])\.", "", text)


def _parse(source: str, fmt_name: str) -> date:
    """The one date ``source`` names under ``fmt_name``'s pattern(s); fails if none match."""
    text = _normalise(source)
    for pattern in PATTERNS[fmt_name]:
        try:
            return datetime.strptime(text, pattern).date()
        except ValueError:
            continue
    raise AssertionError(f"{fmt_name}: {source!r} ({text!r}) matches none of {PATTERNS[fmt_name]}")


def _sample_dates(n: int, seed: int, fmt_name: str) -> list[date]:
    rng = random.Random(seed)
    picked = [dates.random_date(rng) for _ in range(n * 4)]
    fixed = [date(2025, 3, 6), date(1999, 9, 21), date(2000, 2, 29), date(2068, 12, 31)]
    candidates = fixed + picked
    return [d for d in candidates if dates.format_allowed(d, fmt_name)][:n]


def test_enough_distinct_formats_and_every_one_has_a_parser() -> None:
    assert len(dates.DATE_FORMATS) >= 20
    assert len(set(dates.DATE_FORMATS)) == len(dates.DATE_FORMATS)
    assert set(PATTERNS) == set(dates.DATE_FORMATS)


def test_spec_examples() -> None:
    day = date(2025, 3, 6)
    examples = {dates.format_date(day, name) for name in dates.DATE_FORMATS}
    for text in ("Thursday, 6 March 2025", "03/06/25", "the sixth of March 2025", "6 Mar. 2025"):
        assert text in examples
    assert dates.format_date(date(2025, 9, 1), "us_ap") == "Sept. 1, 2025"
    assert dates.format_date(date(2025, 3, 21), "spelled") == "the twenty-first of March 2025"


@pytest.mark.parametrize(
    "day,expected",
    [
        (1, "1st"),
        (2, "2nd"),
        (3, "3rd"),
        (4, "4th"),
        (11, "11th"),
        (12, "12th"),
        (13, "13th"),
        (21, "21st"),
        (22, "22nd"),
        (23, "23rd"),
        (31, "31st"),
    ],
)
def test_ordinal_suffix(day: int, expected: str) -> None:
    assert dates.ordinal_suffix(day) == expected


@pytest.mark.parametrize("fmt_name", dates.DATE_FORMATS)
def test_each_format_parses_back_to_its_date(fmt_name: str) -> None:
    seed = dates.DATE_FORMATS.index(fmt_name)
    for day in _sample_dates(40, seed=seed, fmt_name=fmt_name):
        source = dates.format_date(day, fmt_name)
        assert 0 < len(source) < 60
        assert _parse(source, fmt_name) == day, (fmt_name, source)
        # strptime reads weekday names but never checks them, so compare with the date here.
        named = [
            i for i, name in enumerate(WEEKDAY_NAMES) if re.search(rf"\b{name[:3]}", source.lower())
        ]
        assert named == ([day.weekday()] if "weekday" in fmt_name else []), (fmt_name, source)


def test_two_digit_years_only_inside_the_pivot_window() -> None:
    for fmt_name in dates.TWO_DIGIT_YEAR_FORMATS:
        dates.format_date(date(1969, 1, 1), fmt_name)
        dates.format_date(date(2068, 12, 31), fmt_name)
        with pytest.raises(ValueError):
            dates.format_date(date(1968, 12, 31), fmt_name)
        with pytest.raises(ValueError):
            dates.format_date(date(2069, 1, 1), fmt_name)
    with pytest.raises(ValueError):
        dates.format_date(date(2025, 3, 6), "no_such_format")


def test_generate_pairs_targets_are_iso_and_round_trip() -> None:
    pairs = dates.generate_pairs(2000, random.Random(1))
    assert len(pairs) == 2000
    for pair in pairs:
        assert set(pair) == {"source", "target"}
        day = date.fromisoformat(pair["target"])
        assert day.isoformat() == pair["target"]
        assert dates.FIRST_DAY <= day <= dates.LAST_DAY
        assert len(pair["source"]) < 60
    assert len({pair["source"] for pair in pairs}) > 1900


def test_generation_is_deterministic_per_seed() -> None:
    first = dates.generate_splits(seed=3, sizes=SMALL)
    assert first == dates.generate_splits(seed=3, sizes=SMALL)
    assert first != dates.generate_splits(seed=4, sizes=SMALL)
    assert {split: len(rows) for split, rows in first.items()} == SMALL


def test_no_source_is_in_two_splits() -> None:
    splits = dates.generate_splits(seed=0, sizes=SMALL)
    sources = [pair["source"] for rows in splits.values() for pair in rows]
    assert len(sources) == len(set(sources))


def test_write_splits_is_byte_identical(tmp_path: Path) -> None:
    first = dates.write_splits(tmp_path / "a", seed=5, sizes=SMALL)
    second = dates.write_splits(tmp_path / "b", seed=5, sizes=SMALL)
    for split in SMALL:
        data = first[split].read_bytes()
        assert data == second[split].read_bytes()
        assert data.endswith(b"\n") and b"\r" not in data
        assert data.count(b"\n") == SMALL[split]


def test_committed_files_match_a_fresh_generation(tmp_path: Path) -> None:
    fresh = dates.write_splits(tmp_path)
    for split, path in fresh.items():
        committed = DATA_DIR / f"{split}.jsonl"
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed} is stale; regenerate with `python -m tformer.data.dates`"
        )


def test_committed_files_load_with_datasets(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    files = {split: str(DATA_DIR / f"{split}.jsonl") for split in dates.SPLIT_NAMES}
    loaded = datasets.load_dataset("json", data_files=files, cache_dir=str(tmp_path))
    for split, size in dates.DEFAULT_SIZES.items():
        assert loaded[split].column_names == ["source", "target"]
        assert loaded[split].num_rows == size
