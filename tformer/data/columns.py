"""Text pairs kept as two Arrow string columns rather than a Python list of tuples.

A list of a million (source, target) tuples holds three million Python objects, about
400 MB for news-length sentences; the same text in Arrow string arrays is its UTF-8 bytes
plus 4 or 8 bytes of offset a text, and ``datasets`` memory-maps them from its cache, so
pages are read as they are used. Texts become Python strings only a slice at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar, overload

T = TypeVar("T")
TextPair = tuple[str, str]
SLICE = 16_384  # texts converted to Python strings at a time when iterating


class Rows(Sequence[T]):
    """A read-only sequence whose items are made on demand: a subclass gives its length, one
    item and a run of items; indexing, slicing and iteration (a run at a time) follow."""

    def __len__(self) -> int:
        raise NotImplementedError

    def _item(self, i: int) -> T:
        raise NotImplementedError

    def _run(self, start: int, stop: int) -> list[T]:
        return [self._item(k) for k in range(start, stop)]

    @overload
    def __getitem__(self, i: int) -> T: ...

    @overload
    def __getitem__(self, i: slice) -> list[T]: ...

    def __getitem__(self, i: int | slice) -> T | list[T]:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step == 1:
                return self._run(start, max(stop, start))
            return [self._item(k) for k in range(start, stop, step)]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._item(i)

    def __iter__(self) -> Iterator[T]:
        for start in range(0, len(self), SLICE):
            yield from self._run(start, min(start + SLICE, len(self)))


class TextColumn(Rows[str]):
    """One side's texts: an Arrow string (or large string) array, chunked or not."""

    def __init__(self, array: Any) -> None:
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def _item(self, i: int) -> str:
        text: str = self.array[i].as_py()
        return text

    def _run(self, start: int, stop: int) -> list[str]:
        texts: list[str] = self.array.slice(start, stop - start).to_pylist()
        return texts


class TextColumns(Rows[TextPair]):
    """(source, target) pairs over two :class:`TextColumn` of equal length."""

    def __init__(self, source: Any, target: Any) -> None:
        self.source, self.target = TextColumn(source), TextColumn(target)
        if len(self.source) != len(self.target):
            raise ValueError(f"{len(self.source)} sources but {len(self.target)} targets")

    def __len__(self) -> int:
        return len(self.source)

    def _item(self, i: int) -> TextPair:
        return self.source[i], self.target[i]

    def _run(self, start: int, stop: int) -> list[TextPair]:
        return list(zip(self.source[start:stop], self.target[start:stop], strict=True))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(
                a == b for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def side(texts: Sequence[TextPair], index: int) -> Sequence[str]:
    """Side ``index`` (0 source, 1 target) of ``texts`` as a sequence, without copying."""
    if isinstance(texts, TextColumns):
        return texts.source if index == 0 else texts.target
    return _Side(texts, index)


class _Side(Rows[str]):
    def __init__(self, texts: Sequence[TextPair], which: int) -> None:
        self.texts, self.which = texts, which

    def __len__(self) -> int:
        return len(self.texts)

    def _item(self, i: int) -> str:
        return self.texts[i][self.which]

    def _run(self, start: int, stop: int) -> list[str]:
        return [pair[self.which] for pair in self.texts[start:stop]]


def sample_rows(texts: Sequence[T], n: int, seed: int = 0) -> Sequence[T]:
    """``n`` rows of ``texts`` drawn at random without replacement (all of them when there are
    no more than ``n``), kept in their order; Arrow columns stay Arrow columns."""
    if n >= len(texts):
        return texts
    import numpy as np  # lazy: only sampling a large corpus needs it

    rows = np.sort(np.random.default_rng(seed).choice(len(texts), size=n, replace=False))
    if isinstance(texts, TextColumns):
        import pyarrow as pa  # lazy: comes with datasets, whose columns these are

        taken = pa.array(rows)
        sampled: Sequence[Any] = TextColumns(
            texts.source.array.take(taken), texts.target.array.take(taken)
        )
        return sampled
    return [texts[i] for i in rows.tolist()]
