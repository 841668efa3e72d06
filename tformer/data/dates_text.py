"""The bundled language-model demo text: one date a line, written out and in ISO 8601.

    6 March 2025 = 2025-03-06

A decoder-only model learns to complete a line after its "=" (read the month name, reorder,
pad the day); an encoder-only model learns to fill a masked month name or digit from the other
half of the line. Deterministic like the translation date set (``tformer.data.dates``): the
same seed writes the same files, and no date appears in two splits.

Command line: ``python -m tformer.data.dates_text [--out data/text] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Mapping, Sequence
from datetime import date
from pathlib import Path
from types import MappingProxyType

from tformer.data.dates import format_date, random_date

SIZES: Mapping[str, int] = MappingProxyType({"train": 10000, "validation": 500, "test": 500})
SEPARATOR = " = "


def date_line(day: date) -> str:
    """``6 March 2025 = 2025-03-06``."""
    return f"{format_date(day, 'eu_long')}{SEPARATOR}{day.isoformat()}"


def generate_text_splits(seed: int = 0, sizes: Mapping[str, int] = SIZES) -> dict[str, list[str]]:
    """Lines of distinct dates per split, no date in two splits."""
    rng = random.Random(seed)
    seen: set[date] = set()
    splits: dict[str, list[str]] = {}
    for split, size in sizes.items():
        lines: list[str] = []
        while len(lines) < size:
            day = random_date(rng)
            if day not in seen:
                seen.add(day)
                lines.append(date_line(day))
        splits[split] = lines
    return splits


def write_text_splits(out_dir: str | Path, seed: int = 0) -> dict[str, Path]:
    """Write ``<out_dir>/<split>.txt`` (UTF-8, LF, final newline); returns split -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, lines in generate_text_splits(seed).items():
        paths[split] = out / f"{split}.txt"
        paths[split].write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tformer.data.dates_text",
        description="Write the language-model demo text (dates written out = ISO 8601).",
    )
    parser.add_argument("--out", default="data/text", help="output folder (default: data/text)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    args = parser.parse_args(argv)
    for split, path in write_text_splits(args.out, args.seed).items():
        print(f"{split}: {SIZES[split]} lines -> {path}")


if __name__ == "__main__":
    main()
