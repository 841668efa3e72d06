"""Token ids of many pairs in flat arrays: memory that grows by 4 bytes a token.

A pair's ids as two Python lists cost about 36 bytes a token (a pointer and an int object
each), which made a million-pair corpus take gigabytes before the first step. Here each side
is one int32 array of every pair's ids back to back and an int64 array of where each pair
starts (``offsets``, one longer than the pairs), the layout of Arrow's list arrays. A pair is
read back as lists only when a batch is collated.
"""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

IdPair = tuple[list[int], list[int]]
CHUNK = 16_384  # rows converted at a time, so no whole-corpus list of lists is ever built


@dataclass(frozen=True)
class TokenIds:
    """One side's ids: ``values[offsets[i]:offsets[i + 1]]`` are row i's."""

    values: np.ndarray  # (tokens,) int32 (or uint16 memory-mapped from a prepared folder)
    offsets: np.ndarray  # (rows + 1,) int64, offsets[0] == 0
    # (rows,) int32 tokens per row when stored apart (a prepared folder), so that planning
    # batches reads this small array rather than every offset.
    stored_lengths: np.ndarray | None = None
    # The memory maps the arrays above are read through (a prepared folder), if any.
    maps: tuple[mmap.mmap, ...] = ()

    def release(self) -> None:
        """Unmap the pages of the ids and offsets read so far (see ``PairStore.release``)."""
        for mapped in self.maps:
            if hasattr(mapped, "madvise"):  # not on Windows, where nothing is done
                mapped.madvise(mmap.MADV_DONTNEED)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def row(self, i: int) -> list[int]:
        row: list[int] = self.values[self.offsets[i] : self.offsets[i + 1]].tolist()
        return row

    def lengths(self) -> np.ndarray:
        """Tokens per row, int32."""
        if self.stored_lengths is not None:
            return np.asarray(self.stored_lengths, dtype=np.int32)
        return np.diff(self.offsets).astype(np.int32)

    def select(self, rows: np.ndarray) -> TokenIds:
        """The ids of ``rows`` (indices, in order) as new compact arrays."""
        if len(rows) == len(self) and np.array_equal(rows, np.arange(len(self))):
            return self  # every row in order: nothing to copy
        lengths = self.lengths()[rows].astype(np.int64)
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # Each kept token's position in the old values: its row's old start plus its place
        # in the row.
        starts = np.repeat(self.offsets[:-1][rows] - offsets[:-1], lengths)
        positions = np.arange(offsets[-1], dtype=np.int64) + starts
        return TokenIds(self.values[positions], offsets)

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[int]]) -> TokenIds:
        """Pack rows of ids, converting :data:`CHUNK` rows at a time."""
        values: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        chunk: list[Sequence[int]] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) == CHUNK:
                cls._pack(chunk, values, lengths)
                chunk = []
        if chunk:
            cls._pack(chunk, values, lengths)
        return cls.concatenate(values, lengths)

    @staticmethod
    def _pack(
        chunk: list[Sequence[int]], values: list[np.ndarray], lengths: list[np.ndarray]
    ) -> None:
        lengths.append(np.fromiter((len(r) for r in chunk), dtype=np.int64, count=len(chunk)))
        total = int(lengths[-1].sum())
        values.append(np.fromiter(itertools.chain.from_iterable(chunk), np.int32, count=total))

    @staticmethod
    def concatenate(values: list[np.ndarray], lengths: list[np.ndarray]) -> TokenIds:
        """Pieces of values and their rows' lengths -> one :class:`TokenIds`."""
        counts = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        flat = np.concatenate(values) if values else np.zeros(0, dtype=np.int32)
        return TokenIds(flat.astype(np.int32, copy=False), offsets)


class PairStore(Sequence[IdPair]):
    """Id pairs (source, target) stored as two :class:`TokenIds`; indexing gives lists."""

    def __init__(self, source: TokenIds, target: TokenIds) -> None:
        if len(source) != len(target):
            raise ValueError(f"{len(source)} source rows but {len(target)} target rows")
        self.source, self.target = source, target

    @classmethod
    def from_pairs(cls, pairs: Iterable[IdPair]) -> PairStore:
        listed = pairs if isinstance(pairs, Sequence) else list(pairs)
        return cls(
            TokenIds.from_rows(s for s, _ in listed), TokenIds.from_rows(t for _, t in listed)
        )

    def __len__(self) -> int:
        return len(self.source)

    @overload
    def __getitem__(self, i: int) -> IdPair: ...

    @overload
    def __getitem__(self, i: slice) -> PairStore: ...

    def __getitem__(self, i: int | slice) -> IdPair | PairStore:
        if isinstance(i, slice):
            return self.select(np.arange(len(self), dtype=np.int64)[i])
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.source.row(i), self.target.row(i)

    def __iter__(self) -> Iterator[IdPair]:
        for i in range(len(self)):
            yield self.source.row(i), self.target.row(i)

    def select(self, rows: np.ndarray) -> PairStore:
        return PairStore(self.source.select(rows), self.target.select(rows))

    def release(self) -> None:
        """Let go of the memory-mapped pages read so far; they stay in the page cache.

        The kernel maps a block of neighbouring pages at each fault on a mapped file, so a few
        hundred pairs read at random put megabytes of a large corpus into the process's
        resident memory, and training would grow it step by step. Releasing them after each
        batch keeps it to one batch's pages; reading them again costs a minor fault.
        """
        self.source.release()
        self.target.release()

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """(source, target) tokens per pair, int32 arrays."""
        return self.source.lengths(), self.target.lengths()

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for t in (self.source, self.target) for a in (t.values, t.offsets))


def as_store(pairs: Sequence[IdPair]) -> PairStore:
    return pairs if isinstance(pairs, PairStore) else PairStore.from_pairs(pairs)
