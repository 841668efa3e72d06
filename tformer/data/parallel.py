"""Tokenising a corpus a slice at a time, in worker processes when asked.

A slice of pairs is read (Arrow columns become Python strings only here), tokenised into packed
ids and handed back in order. With ``num_proc`` workers, a few slices are in flight at once and
each worker keeps its own word cache (``tformer.data.wordcache``); the parent reads the next
slices and writes the finished ones meanwhile.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor

from tformer.data.columns import side
from tformer.data.store import TokenIds
from tformer.data.tokenizer import Tokenizer

SLICE = 65_536  # pairs read, tokenised and written at a time


Slice = tuple[int, list[list[str]], list[TokenIds]]  # (first row, texts per side, ids per side)
# A split: its pairs, or a stream of slices of them (a data set read without loading it whole).
Pairs = Sequence[tuple[str, str]] | Iterable[list[tuple[str, str]]]


def encoded_slices(
    texts: Pairs,
    tokenizers: tuple[Tokenizer, Tokenizer],
    num_proc: int | None = None,
) -> Iterator[Slice]:
    """The pairs a slice at a time with their ids, in order; ``num_proc`` worker processes
    tokenise slices side by side. ``texts`` is a sequence of pairs, or a stream of slices
    (lists of pairs, as ``tformer.data.streaming`` reads them)."""
    sliced = _slices(texts)
    if not num_proc or num_proc < 2 or (isinstance(texts, Sequence) and len(texts) <= SLICE):
        for start, sides in sliced:
            yield start, sides, [t.encode_packed(p) for t, p in zip(tokenizers, sides, strict=True)]
        return
    shared = tokenizers[0] is tokenizers[1]
    setup = (tokenizers[0].to_str(), None if shared else tokenizers[1].to_str())
    context = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
    with ProcessPoolExecutor(num_proc, mp_context=context, initializer=_start_worker,
                             initargs=setup) as pool:  # fmt: skip
        pending: deque[tuple[int, list[list[str]], Future[list[TokenIds]]]] = deque()
        for start, sides in sliced:
            pending.append((start, sides, pool.submit(_encode_in_worker, sides)))
            if len(pending) > num_proc:  # bounded: a few slices in flight, never the corpus
                first, texts_, future = pending.popleft()
                yield first, texts_, future.result()
        while pending:
            first, texts_, future = pending.popleft()
            yield first, texts_, future.result()


def _slices(texts: Pairs) -> Iterator[tuple[int, list[list[str]]]]:
    """(first row, [sources, targets]) a slice at a time."""
    if isinstance(texts, Sequence):
        for start in range(0, len(texts), SLICE):
            yield start, [list(side(texts, i)[start : start + SLICE]) for i in (0, 1)]
        return
    start = 0
    for chunk in texts:
        yield start, [[s for s, _ in chunk], [t for _, t in chunk]]
        start += len(chunk)


_WORKER: list[Tokenizer] = []


def _start_worker(source: str, target: str | None) -> None:
    tokenizer = Tokenizer.from_str(source)
    _WORKER[:] = [tokenizer, Tokenizer.from_str(target) if target is not None else tokenizer]


def _encode_in_worker(sides: list[list[str]]) -> list[TokenIds]:
    return [t.encode_packed(p) for t, p in zip(_WORKER, sides, strict=True)]
