"""Batch tokenisation through a cache of words: the same ids, several times faster.

Every tformer tokenizer splits text at spaces before its subword model runs (the ``Metaspace``
pre-tokenizer, see ``tformer.data.tokenizer``), and nothing it does crosses a space: NFKC folds
characters one by one, digits are split inside a word, and BPE, Unigram and WordPiece segment
each piece alone. So a sentence's ids are its space-separated words' ids, each word encoded on
its own, one after another. A corpus has far fewer distinct words than words, and looking a
word up in a dict costs a small fraction of running the Rust pipeline on it, which spends most
of its time on per-sentence bookkeeping (offsets, alignments) that training never reads.

Words where that reasoning does not hold are never cached and their sentences go through the
tokenizer whole: an empty word (a leading, trailing or doubled space), a word holding the "▁"
marker or a special token such as ``<eos>`` (matched before pre-tokenisation), and a word whose
first character NFKC turns into a space. A sample of every batch is also encoded whole and
compared; a difference (a tokenizer this reasoning does not cover) turns the cache off for good.
"""

from __future__ import annotations

import threading
import unicodedata
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from tformer.data.store import TokenIds

# Bounds the cache of a corpus with millions of distinct words to some tens of MB; when full it
# starts again empty, which costs speed, never a wrong id.
CAPACITY = 500_000
CHECK_EVERY = 512  # one sentence in this many is also encoded whole and compared

Packed = tuple[np.ndarray, np.ndarray]  # (values int32, lengths int64)


class WordCache:
    """Encodes sentences as the concatenation of their cached words' ids (see the module)."""

    def __init__(
        self,
        inner: Any,
        specials: Sequence[str],
        *,
        enabled: bool = True,
        capacity: int = CAPACITY,
    ) -> None:
        self.inner = inner  # a tokenizers.Tokenizer
        self.specials = tuple(specials)
        self.capacity = capacity
        self.words: dict[str, list[int] | None] = {}
        self.enabled = enabled
        # One encoding at a time: another thread's clearing a full cache between a batch's
        # learning its words and reading them back would lose them (a server tokenises in
        # threads).
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> Packed:
        """Ids of ``texts``: all values back to back and each text's number of ids."""
        texts = list(texts)
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        with self._lock:
            return self._encode(texts)

    def _encode(self, texts: list[str]) -> Packed:
        if self.enabled:
            packed = self._cached(texts)
            if self._agrees(texts, packed):
                return packed
            self.enabled = False
            self.words.clear()
        return self._whole(texts)

    def _whole(self, texts: list[str]) -> Packed:
        rows = [e.ids for e in self.inner.encode_batch_fast(texts, add_special_tokens=False)]
        lengths = np.fromiter(map(len, rows), np.int64, count=len(rows))
        values = np.fromiter(chain.from_iterable(rows), np.int32, count=int(lengths.sum()))
        return values, lengths

    def _cached(self, texts: list[str]) -> Packed:
        split = [text.split(" ") for text in texts]
        words = list(chain.from_iterable(split))
        self._learn(words)
        per_word = list(map(self.words.__getitem__, words))
        counts = np.fromiter(map(len, split), np.int64, count=len(split))
        starts = np.zeros(len(split) + 1, np.int64)
        np.cumsum(counts, out=starts[1:])
        word_lengths = np.fromiter(
            (0 if ids is None else len(ids) for ids in per_word), np.int64, count=len(per_word)
        )
        lengths = np.add.reduceat(word_lengths, starts[:-1])
        pieces: list[list[int] | None] = per_word
        if None in per_word:  # some sentences go through the tokenizer whole
            pieces, lengths = self._with_whole(texts, per_word, starts, lengths)
        values = np.fromiter(chain.from_iterable(pieces), np.int32, count=int(lengths.sum()))  # type: ignore[arg-type]
        return values, lengths

    def _with_whole(
        self,
        texts: list[str],
        per_word: list[list[int] | None],
        starts: np.ndarray,
        lengths: np.ndarray,
    ) -> tuple[list[list[int] | None], np.ndarray]:
        """``per_word`` with the words of each sentence holding an uncacheable word replaced
        by that sentence's ids from the tokenizer."""
        missing = np.fromiter((ids is None for ids in per_word), bool, count=len(per_word))
        owner = np.repeat(np.arange(len(texts)), np.diff(starts))
        bad = np.unique(owner[missing])
        whole = self.inner.encode_batch_fast([texts[i] for i in bad], add_special_tokens=False)
        pieces: list[list[int] | None] = []
        position = 0
        lengths = lengths.copy()
        for i, encoding in zip(bad.tolist(), whole, strict=True):
            pieces.extend(per_word[position : starts[i]])
            pieces.append(encoding.ids)
            lengths[i] = len(encoding.ids)
            position = int(starts[i + 1])
        pieces.extend(per_word[position:])
        return pieces, lengths

    def _learn(self, words: list[str]) -> None:
        """Encode the words not yet cached (those that can be), each on its own."""
        new = [w for w in set(words) if w not in self.words]
        if len(self.words) + len(new) > self.capacity:
            self.words.clear()
            new = list(set(words))
        good = [w for w in new if self._cacheable(w)]
        encoded = self.inner.encode_batch_fast(good, add_special_tokens=False)
        self.words.update(zip(good, (e.ids for e in encoded), strict=True))
        self.words.update((w, None) for w in new if w not in self.words)

    def _cacheable(self, word: str) -> bool:
        if not word or "▁" in word:
            return False
        if "<" in word and any(special in word for special in self.specials):
            return False
        return word.isascii() or not unicodedata.normalize("NFKC", word[0])[:1].isspace()

    def _agrees(self, texts: list[str], packed: Packed) -> bool:
        """Whether a sample of ``texts`` (the first, then one in :data:`CHECK_EVERY`) has the
        same ids encoded whole."""
        values, lengths = packed
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = TokenIds(values, offsets)
        sample = list(range(0, len(texts), CHECK_EVERY))
        whole = self.inner.encode_batch_fast([texts[i] for i in sample], add_special_tokens=False)
        return all(ids.row(i) == e.ids for i, e in zip(sample, whole, strict=True))
