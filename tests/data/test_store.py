"""Packed id pairs and array batching: the same pairs and the very batches the earlier
list-based pipeline made (its code is kept here as the reference), at a fraction of the
memory."""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from tformer.data.batching import BatchPlan, bucket_batches
from tformer.data.pairs import encode_pairs
from tformer.data.sources import load_text_pairs
from tformer.data.store import CHUNK, PairStore, TokenIds
from tformer.data.tokenizer import train_tokenizer
from tformer.errors import DataError

MULTI30K = Path(__file__).resolve().parents[3] / "shared" / "data" / "multi30k"


def reference_batches(
    lengths: Sequence[tuple[int, int]], max_tokens: int, seed: int
) -> list[list[int]]:
    """The list-based bucketing every earlier version used, verbatim."""
    rng = random.Random(seed)
    keys = [rng.random() for _ in lengths]
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i][0], lengths[i][1], keys[i]))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        size = max(lengths[i][0], lengths[i][1] + 1)
        if current and (len(current) + 1) * max(longest, size) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def as_lists(batches: Sequence[np.ndarray]) -> list[list[int]]:
    return [b.tolist() for b in batches]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 7 * 100_003 + 2, 2**40 + 5])
def test_array_bucketing_makes_the_batches_of_the_list_version(seed: int) -> None:
    rng = random.Random(seed)
    # Many ties in length, so the random keys decide much of the order.
    lengths = [(rng.randint(1, 40), rng.randint(1, 40)) for _ in range(3 * CHUNK + 17)]
    for max_tokens in (30, 512, 4096):
        want = reference_batches(lengths, max_tokens, seed)
        assert as_lists(bucket_batches(lengths, max_tokens, seed)) == want
        arrays = (np.array([s for s, _ in lengths]), np.array([t for _, t in lengths]))
        assert as_lists(bucket_batches(arrays, max_tokens, seed)) == want
    assert bucket_batches([], 100, seed) == []


def test_the_python_generator_is_left_where_the_list_version_leaves_it() -> None:
    """After the bulk draw, ``random.Random`` goes on as after n single draws: the shuffle of
    the batch order depends on it."""
    lengths = [(i % 13 + 1, i % 5 + 1) for i in range(1000)]
    ours = as_lists(bucket_batches(lengths, 64, seed=11))
    want = reference_batches(lengths, 64, seed=11)
    assert ours == want and sorted(map(tuple, ours)) != want  # the order really is shuffled


def test_token_ids_pack_rows_and_select_them() -> None:
    rows = [[5, 6, 7], [], [8], list(range(100, 140))] * (CHUNK // 2 + 3)
    ids = TokenIds.from_rows(rows)
    assert ids.values.dtype == np.int32 and ids.offsets.dtype == np.int64
    assert len(ids) == len(rows) and ids.offsets[-1] == sum(map(len, rows))
    assert [ids.row(i) for i in range(len(rows))] == rows
    assert ids.lengths().tolist() == [len(r) for r in rows]
    keep = np.array([3, 0, 2, 2, len(rows) - 1])
    chosen = ids.select(keep)
    assert [chosen.row(i) for i in range(len(keep))] == [rows[i] for i in keep]


def test_a_pair_store_reads_back_what_went_in_at_4_bytes_a_token() -> None:
    pairs = [([i, i + 1, i + 2], [i * 2] * (i % 7 + 1)) for i in range(5000)]
    store = PairStore.from_pairs(pairs)
    assert list(store) == pairs and store[17] == pairs[17] and store[-1] == pairs[-1]
    assert list(store[10:20]) == pairs[10:20]
    tokens = sum(len(s) + len(t) for s, t in pairs)
    assert store.nbytes == 4 * tokens + 8 * 2 * (len(pairs) + 1)
    as_lists_bytes = sum(sys.getsizeof(s) + sys.getsizeof(t) for s, t in pairs)
    assert store.nbytes < as_lists_bytes / 3  # before counting the int objects themselves
    with pytest.raises(IndexError):
        store[5000]


@pytest.mark.slow
def test_encoded_bundled_data_batches_as_before() -> None:
    """The bundled data through the real tokenizer: the kept pairs and every epoch's batches
    equal those of the list pipeline (ids as lists, lengths as tuples)."""
    texts = load_text_pairs(None)["train"]
    tokenizer = train_tokenizer((t for pair in texts[:4000] for t in pair), vocab_size=400)
    split = encode_pairs(texts, tokenizer, tokenizer, max_len=12)
    src = tokenizer.encode_batch([s for s, _ in texts])
    tgt = tokenizer.encode_batch([t for _, t in texts])
    fits = [
        bool(s and t) and len(s) <= 12 and len(t) + 1 <= 12
        for s, t in zip(src, tgt, strict=True)
    ]
    kept = [(s, t) for s, t, ok in zip(src, tgt, fits, strict=True) if ok]
    assert split.dropped == len(texts) - len(kept) > 0
    assert list(split.pairs) == kept
    assert list(split.texts) == [pair for pair, ok in zip(texts, fits, strict=True) if ok]
    plan = BatchPlan(split.pairs, max_tokens=2048, seed=5)
    lengths = [(len(s), len(t)) for s, t in kept]
    for epoch in (0, 3):
        want = reference_batches(lengths, 2048, 5 * 100_003 + epoch)
        assert as_lists(plan.epoch(epoch)) == want
    indices = plan.epoch(0)[0]
    assert plan.target_tokens(indices) == sum(len(kept[i][1]) + 1 for i in indices)


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K.is_dir(), reason="Multi30k is not beside the checkout")
def test_multi30k_batches_as_before() -> None:
    texts = load_text_pairs(str(MULTI30K), source_field="en", target_field="de")["train"]
    tokenizer = train_tokenizer((t for pair in texts[:5000] for t in pair), vocab_size=2000)
    split = encode_pairs(texts, tokenizer, tokenizer, max_len=128)
    lengths = [(len(s), len(t)) for s, t in split.pairs]
    for epoch in (0, 1):
        want = reference_batches(lengths, 6144, 100_003 + epoch)
        assert as_lists(BatchPlan(split.pairs, 6144, seed=1).epoch(epoch)) == want


def test_strict_names_the_first_pair_that_does_not_fit() -> None:
    tokenizer = train_tokenizer(["a b c d e f g h"] * 50, vocab_size=60)
    texts = [("a b", "c d"), ("a b c d e f g h " * 4, "a"), ("", "b")]
    split = encode_pairs(texts, tokenizer, tokenizer, max_len=8)
    assert len(split.pairs) == 1 and split.dropped == 2 and split.dropped_empty == 1
    assert split.texts[0] == texts[0] and list(split.texts) == [texts[0]]
    with pytest.raises(DataError, match=r"pair 2: the source is \d+ tokens, over --max-len 8"):
        encode_pairs(texts, tokenizer, tokenizer, max_len=8, strict=True)
