"""Pharaoh alignment files and the alignment error rate (Och & Ney, 2003).

A Pharaoh line lists the links of one sentence pair as ``source-target`` index pairs, 0-based:
``0-0 1-2 2-1``. Gold files also mark *possible* links (links annotators were unsure of):
``i?j`` is a possible link, ``i-j`` a sure one; the suffixed spelling of some corpora,
``i-j-S`` / ``i-j-P`` (or ``i-jS`` / ``i-jP``, either case), is read too. Sure links are
possible as well (S ⊆ P); with no possible links marked, P = S.

With A the predicted links, summed over the corpus before dividing:

    precision = |A ∩ P| / |A|      recall = |A ∩ S| / |S|
    AER = 1 - (|A ∩ S| + |A ∩ P|) / (|A| + |S|)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tformer.errors import DataError
from tformer.paths import excerpt, first_line

Link = tuple[int, int]  # (source index, target index), 0-based

_LINK = re.compile(r"(\d+)([-?])(\d+)(?:-?([SsPp]))?")


@dataclass(frozen=True)
class GoldAlignment:
    """The gold links of one sentence pair: ``possible`` holds the sure links too."""

    sure: frozenset[Link]
    possible: frozenset[Link]


@dataclass(frozen=True)
class AlignmentScores:
    """Corpus-level AER, precision and recall, and the link counts they come from."""

    aer: float
    precision: float
    recall: float
    pairs: int
    predicted: int  # |A|
    sure: int  # |S|
    possible: int  # |P|
    predicted_sure: int  # |A ∩ S|
    predicted_possible: int  # |A ∩ P|

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_pharaoh(line: str, where: str = "alignment") -> GoldAlignment:
    """The links of one Pharaoh line (``0-0 1?2 2-1-P``).

    Raises:
        DataError: a field is not a link, naming ``where`` (a file and line) and the field.
    """
    sure: set[Link] = set()
    possible: set[Link] = set()
    for field in line.split():
        match = _LINK.fullmatch(field)
        if match is None:
            raise DataError(
                f"{where}: {excerpt(field)} is not an alignment link; write source-target "
                "word indices such as 0-0 (sure) or 1?2 (possible)"
            )
        link = (int(match[1]), int(match[3]))
        possible.add(link)
        if match[2] == "-" and match[4] not in ("P", "p"):
            sure.add(link)
    return GoldAlignment(frozenset(sure), frozenset(possible))


def read_lines(path: Path, option: str) -> list[str]:
    r"""The lines of a UTF-8 text file, ended by "\n" or "\r\n" only (a "\u2028" inside a
    sentence must not split it in two).

    Raises:
        DataError: the file cannot be read or is not UTF-8, naming ``option`` and ``path``.
    """
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise DataError(f"{option} {path}: cannot be read ({first_line(error)})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise DataError(f"{option} {path}: line {line}: not UTF-8 text") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def read_pharaoh(path: Path, option: str = "--gold") -> list[GoldAlignment]:
    """Every line of a Pharaoh file, one ``GoldAlignment`` a line (an empty line: no links).

    Raises:
        DataError: unreadable file or a malformed line, naming the file and the line number.
    """
    return [
        parse_pharaoh(line, f"{option} {path} line {number}")
        for number, line in enumerate(read_lines(path, option), start=1)
    ]


def check_gold_fits(
    gold: Sequence[GoldAlignment], sizes: Sequence[tuple[int, int]], where: str
) -> None:
    """Refuse gold links past the end of their pair: the file belongs to other text.

    Args:
        sizes: (source units, target units) of each pair, in the gold file's order.

    Raises:
        DataError: naming ``where``, the line, the link and the pair's sizes.
    """
    for number, (links, (n_src, n_tgt)) in enumerate(zip(gold, sizes, strict=True), start=1):
        for i, j in sorted(links.possible):
            if i >= n_src or j >= n_tgt:
                raise DataError(
                    f"{where} line {number}: link {i}-{j} is outside the pair's {n_src} source "
                    f"and {n_tgt} target words; the gold file must follow the input pairs "
                    "line by line"
                )


def score_alignments(
    predicted: Sequence[Iterable[Link]], gold: Sequence[GoldAlignment]
) -> AlignmentScores:
    """AER, precision and recall of ``predicted`` against ``gold``, over the whole corpus.

    Precision is 0 when nothing is predicted.

    Raises:
        DataError: the two lengths differ, or the gold has no sure link at all (recall and
            AER would divide by zero).
    """
    if len(predicted) != len(gold):
        raise DataError(
            f"{len(predicted)} predicted alignments for {len(gold)} gold ones; give one gold "
            "line per pair"
        )
    a = s = p = a_s = a_p = 0
    for links, truth in zip(predicted, gold, strict=True):
        found = set(links)
        a, s, p = a + len(found), s + len(truth.sure), p + len(truth.possible)
        a_s += len(found & truth.sure)
        a_p += len(found & truth.possible)
    if s == 0:
        raise DataError("the gold alignments have no sure link, so recall and AER are undefined")
    return AlignmentScores(
        aer=1.0 - (a_s + a_p) / (a + s),
        precision=a_p / a if a else 0.0,
        recall=a_s / s,
        pairs=len(gold),
        predicted=a,
        sure=s,
        possible=p,
        predicted_sure=a_s,
        predicted_possible=a_p,
    )
