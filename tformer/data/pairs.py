"""Text pairs -> id pairs: tokenise a split, dropping (or, with --strict, refusing) pairs that
do not fit the model. Reading the pairs lives in ``sources``, batching them in ``batching``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tformer.data.columns import Rows, TextPair, side
from tformer.data.store import PairStore
from tformer.data.tokenizer import Tokenizer
from tformer.errors import DataError


class KeptTexts(Rows[TextPair]):
    """The texts of the pairs a split kept, in order, without copying them."""

    def __init__(self, texts: Sequence[TextPair], kept: np.ndarray) -> None:
        self.texts, self.kept = texts, kept

    def __len__(self) -> int:
        return len(self.kept)

    def _item(self, i: int) -> TextPair:
        return self.texts[int(self.kept[i])]


@dataclass(frozen=True)
class EncodedSplit:
    """A split as id pairs, with the text kept for evaluation and the count of dropped pairs."""

    pairs: PairStore
    texts: Sequence[TextPair]
    dropped: int
    dropped_empty: int = 0  # of ``dropped``, the pairs with an empty side (not too long)

    def length_percentiles(self, qs: Sequence[int] = (50, 90, 99, 100)) -> dict[str, list[int]]:
        """Token-length percentiles (nearest rank) per side: {"source": [...], "target": [...]}."""
        result: dict[str, list[int]] = {}
        for name, lengths in zip(("source", "target"), self.pairs.lengths(), strict=True):
            if not len(lengths):
                result[name] = [0 for _ in qs]
                continue
            ordered = np.sort(lengths)
            ranks = [max(0, math.ceil(q / 100 * len(ordered)) - 1) for q in qs]
            result[name] = [int(ordered[r]) for r in ranks]
        return result


def encode_pairs(
    texts: Sequence[TextPair],
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    max_len: int,
    *,
    strict: bool = False,
    where: str = "data",
    keep_texts: bool = True,
) -> EncodedSplit:
    """Tokenise pairs; drop those that do not fit ``max_len`` or have an empty side.

    Args:
        strict: refuse such a pair instead of dropping it.
        keep_texts: keep the kept pairs' texts (for BLEU and samples); without it the split
            holds no reference to ``texts``, so a training corpus's text can be freed.
        where: names the data in error messages (e.g. "--data pairs.jsonl, train split").

    Raises:
        DataError: with ``strict``, naming the first pair that would be dropped and why.
    """
    src_ids = src_tokenizer.encode_packed(side(texts, 0))
    tgt_ids = tgt_tokenizer.encode_packed(side(texts, 1))
    src_len, tgt_len = src_ids.lengths(), tgt_ids.lengths()
    empty = (src_len == 0) | (tgt_len == 0)
    fits = ~empty & (src_len <= max_len) & (tgt_len + 1 <= max_len)
    if strict and not fits.all():
        row = int(np.argmin(fits))
        problem = unfit(int(src_len[row]), int(tgt_len[row]), max_len)
        fix = "fix the pair" if empty[row] else "raise --max-len, fix the pair"
        raise DataError(
            f"{where}: pair {row + 1}: {problem} (--strict); {fix}, "
            "or drop --strict to skip and count such pairs"
        )
    kept = np.flatnonzero(fits)
    store = PairStore(src_ids.select(kept), tgt_ids.select(kept))
    kept_texts = KeptTexts(texts, kept) if keep_texts else KeptTexts((), kept[:0])
    return EncodedSplit(store, kept_texts, len(texts) - len(kept), int(empty.sum()))


def unfit(src: int, tgt: int, max_len: int) -> str | None:
    """Why a pair of these lengths cannot be trained on, or None. The decoder sees one extra
    position."""
    if not src or not tgt:
        return f"the {'source' if not src else 'target'} is empty (no tokens)"
    if src > max_len:
        return f"the source is {src} tokens, over --max-len {max_len}"
    if tgt + 1 > max_len:
        return f"the target is {tgt} tokens + <eos>, over --max-len {max_len}"
    return None


def no_training_pairs(where: str, dropped: int, dropped_empty: int, max_len: int) -> DataError:
    """The refusal of a training split of which every pair was dropped, saying why."""
    if dropped_empty == dropped:
        return DataError(
            f"{where}: every training pair ({dropped}) has an empty source or target; "
            "check --source-field / --target-field and the data"
        )
    return DataError(
        f"{where}: no training pair fits --max-len {max_len}: {dropped - dropped_empty} of "
        f"{dropped} are too long (the rest have an empty side); raise --max-len"
    )
