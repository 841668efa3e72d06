"""Text pairs kept as two Arrow string columns rather than a Python list of tuples.

A list of a million (source, target) tuples holds three million Python objects, about
400 MB for news-length sentences; the same text in Arrow string arrays is its UTF-8 bytes
plus 4 or 8 bytes of offset a text, and ``datasets`` memory-maps them from its cache, so
pages are read as they are used. Texts become Python strings only a slice at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

TextPair = tuple[str, str]
SLICE = 16_384  # texts converted to Python strings at a time when iterating


class TextColumn(Sequence[str]):
    """One side's texts: an Arrow string (or large string) array, chunked or not."""

    def __init__(self, array: Any) -> None:
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return [self[k] for k in range(start, stop, step)]
            texts: list[str] = self.array.slice(start, max(stop - start, 0)).to_pylist()
            return texts
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        text: str = self.array[i].as_py()
        return text

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self), SLICE):
            yield from self[start : start + SLICE]


class TextColumns(Sequence[TextPair]):
    """(source, target) pairs over two :class:`TextColumn` of equal length."""

    def __init__(self, source: Any, target: Any) -> None:
        self.source, self.target = TextColumn(source), TextColumn(target)
        if len(self.source) != len(self.target):
            raise ValueError(f"{len(self.source)} sources but {len(self.target)} targets")

    def __len__(self) -> int:
        return len(self.source)

    @overload
    def __getitem__(self, i: int) -> TextPair: ...

    @overload
    def __getitem__(self, i: slice) -> list[TextPair]: ...

    def __getitem__(self, i: int | slice) -> TextPair | list[TextPair]:
        if isinstance(i, slice):
            return list(zip(self.source[i], self.target[i], strict=True))
        return self.source[i], self.target[i]

    def __iter__(self) -> Iterator[TextPair]:
        for start in range(0, len(self), SLICE):
            yield from self[start : start + SLICE]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def side(texts: Sequence[TextPair], index: int) -> Sequence[str]:
    """Side ``index`` (0 source, 1 target) of ``texts`` as a sequence, without copying."""
    if isinstance(texts, TextColumns):
        return texts.source if index == 0 else texts.target
    return _Side(texts, index)


class _Side(Sequence[str]):
    def __init__(self, texts: Sequence[TextPair], which: int) -> None:
        self.texts, self.which = texts, which

    def __len__(self) -> int:
        return len(self.texts)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [pair[self.which] for pair in self.texts[i]]
        return self.texts[i][self.which]
