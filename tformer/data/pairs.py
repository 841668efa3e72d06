"""Text pairs -> id pairs: tokenise a split, dropping (or, with --strict, refusing) pairs that
do not fit the model. Reading the pairs lives in ``sources``, batching them in ``batching``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tformer.data.batching import IdPair
from tformer.data.sources import TextPair
from tformer.data.tokenized import encode_texts
from tformer.data.tokenizer import Tokenizer
from tformer.errors import DataError


@dataclass(frozen=True)
class EncodedSplit:
    """A split as id pairs, with the text kept for evaluation and the count of dropped pairs."""

    pairs: list[IdPair]
    texts: list[TextPair]
    dropped: int
    dropped_empty: int = 0  # of ``dropped``, the pairs with an empty side (not too long)

    def length_percentiles(self, qs: Sequence[int] = (50, 90, 99, 100)) -> dict[str, list[int]]:
        """Token-length percentiles (nearest rank) per side: {"source": [...], "target": [...]}."""
        result: dict[str, list[int]] = {}
        for side, index in (("source", 0), ("target", 1)):
            lengths = sorted(len(pair[index]) for pair in self.pairs)
            if not lengths:
                result[side] = [0 for _ in qs]
                continue
            result[side] = [lengths[max(0, math.ceil(q / 100 * len(lengths)) - 1)] for q in qs]
        return result


def encode_pairs(
    texts: Sequence[TextPair],
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    max_len: int,
    *,
    strict: bool = False,
    where: str = "data",
    cache_dir: Path | None = None,
    num_proc: int | None = None,
) -> EncodedSplit:
    """Tokenise pairs; drop those that do not fit ``max_len`` or have an empty side.

    Args:
        strict: refuse such a pair instead of dropping it.
        where: names the data in error messages (e.g. "--data pairs.jsonl, train split").
        cache_dir: tokenise through ``datasets.map`` with the ids cached there
            (``tformer.data.tokenized``); ``num_proc`` worker processes for a large corpus.

    Raises:
        DataError: with ``strict``, naming the first pair that would be dropped and why.
    """
    options: dict[str, Any] = {"cache_dir": cache_dir, "num_proc": num_proc}
    src_ids = encode_texts([s for s, _ in texts], src_tokenizer, **options)
    tgt_ids = encode_texts([t for _, t in texts], tgt_tokenizer, **options)
    kept: list[IdPair] = []
    kept_text: list[TextPair] = []
    empty = 0
    for row, (text, src, tgt) in enumerate(zip(texts, src_ids, tgt_ids, strict=True), start=1):
        problem = _unfit(src, tgt, max_len)
        if problem is None:
            kept.append((src, tgt))
            kept_text.append(text)
            continue
        empty += not src or not tgt
        if strict:
            fix = "fix the pair" if not src or not tgt else "raise --max-len, fix the pair"
            raise DataError(
                f"{where}: pair {row}: {problem} (--strict); {fix}, "
                "or drop --strict to skip and count such pairs"
            )
    return EncodedSplit(kept, kept_text, len(texts) - len(kept), empty)


def _unfit(src: list[int], tgt: list[int], max_len: int) -> str | None:
    """Why a pair cannot be trained on, or None. The decoder sees one extra position."""
    if not src or not tgt:
        return f"the {'source' if not src else 'target'} is empty (no tokens)"
    if len(src) > max_len:
        return f"the source is {len(src)} tokens, over --max-len {max_len}"
    if len(tgt) + 1 > max_len:
        return f"the target is {len(tgt)} tokens + <eos>, over --max-len {max_len}"
    return None
