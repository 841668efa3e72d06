"""Id pairs -> token-budget batches: bucketing by length, padding, teacher-forcing shift.

Shape legend: B pairs in a batch, S longest source, T longest target + 1 (for BOS/EOS).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from tformer.config import BOS_ID, EOS_ID, PAD_ID
from tformer.data.store import CHUNK, IdPair, as_store


@dataclass
class Batch:
    """Teacher forcing: the decoder reads BOS + target and predicts target + EOS (section 3)."""

    src: Tensor  # (B, S) source ids, right-padded with PAD_ID
    tgt_in: Tensor  # (B, T) BOS + target: the labels shifted right by one
    tgt_out: Tensor  # (B, T) target + EOS; PAD_ID where there is nothing to predict

    @property
    def n_target_tokens(self) -> int:
        return int((self.tgt_out != PAD_ID).sum())

    def to(self, device: torch.device) -> Batch:
        non_blocking = device.type == "cuda"
        return Batch(
            self.src.to(device, non_blocking=non_blocking),
            self.tgt_in.to(device, non_blocking=non_blocking),
            self.tgt_out.to(device, non_blocking=non_blocking),
        )


def pad(rows: Sequence[Sequence[int]], value: int = PAD_ID) -> Tensor:
    """Right-pad id lists (or arrays) into a (B, L) long tensor.

    All rows go in at once through one mask: a tensor per row cost 1.2 ms for a batch of 90
    short rows, three times a step, against 0.05 ms this way.
    """
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    out = np.full((len(rows), int(lengths.max())), value, dtype=np.int64)
    if all(isinstance(r, np.ndarray) for r in rows):
        ids = np.concatenate(rows)
    else:
        ids = np.fromiter(itertools.chain.from_iterable(rows), np.int64, int(lengths.sum()))
    out[np.arange(out.shape[1]) < lengths[:, None]] = ids  # row by row: the mask's order
    return torch.from_numpy(out)


def shift_right(tgt: Sequence[int]) -> tuple[list[int], list[int]]:
    """target -> (decoder input BOS + target, labels target + EOS)."""
    return [BOS_ID, *tgt], [*tgt, EOS_ID]


def collate(pairs: Sequence[IdPair]) -> Batch:
    shifted = [shift_right(tgt) for _, tgt in pairs]
    return Batch(
        src=pad([src for src, _ in pairs]),
        tgt_in=pad([i for i, _ in shifted]),
        tgt_out=pad([o for _, o in shifted]),
    )


def bucket_batches(
    lengths: tuple[np.ndarray, np.ndarray] | Sequence[tuple[int, int]], max_tokens: int, seed: int
) -> list[np.ndarray]:
    """Group example indices into batches of similar length under a padded-token budget.

    Examples are sorted by length (ties broken at random, so each seed groups them differently)
    and cut into consecutive runs while ``rows * longest <= max_tokens``, where ``longest``
    counts the source or the target + 1, whichever is longer. The batch order is shuffled.
    An example longer than the whole budget gets a batch of its own.

    ``lengths`` is (source lengths, target lengths) as arrays, or (source, target) per pair.
    The random numbers are Python's ``random.Random(seed)``, drawn in bulk through NumPy's
    Mersenne Twister set to the same state, so the batches are the ones every earlier version
    made, at the memory of a few arrays rather than a tuple per example.
    """
    src, tgt = _length_arrays(lengths)
    rng = random.Random(seed)
    keys = _python_randoms(rng, len(src))
    order = np.lexsort((keys, tgt, src))  # by source, then target length, then key
    del keys
    sizes = np.maximum(src, tgt + 1)[order]
    batches = np.split(order, _cuts(sizes, max_tokens)) if len(order) else []
    shuffled = list(range(len(batches)))
    rng.shuffle(shuffled)  # the permutation random.shuffle gives any list of this length
    return [batches[i] for i in shuffled]


def _length_arrays(
    lengths: tuple[np.ndarray, np.ndarray] | Sequence[tuple[int, int]],
) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(lengths, tuple) and len(lengths) == 2 and isinstance(lengths[0], np.ndarray):
        return lengths[0].astype(np.int64), np.asarray(lengths[1]).astype(np.int64)
    pairs = np.asarray(list(lengths), dtype=np.int64).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def _python_randoms(rng: random.Random, n: int) -> np.ndarray:
    """``[rng.random() for _ in range(n)]`` as an array, leaving ``rng`` where that would.

    Both are MT19937 with the same 53-bit doubles, so NumPy's generator set to ``rng``'s
    state draws the same numbers, and its state afterwards is handed back to ``rng``.
    """
    version, internal, gauss = rng.getstate()
    mt = np.random.RandomState()
    words = np.array(internal[:624], dtype=np.uint32)
    mt.set_state(("MT19937", words, internal[624], 0, 0.0))  # no cached Gaussian
    keys = mt.random_sample(n)
    after = mt.get_state(legacy=False)["state"]
    rng.setstate((version, (*map(int, after["key"]), int(after["pos"])), gauss))
    return keys


def _cuts(sizes: np.ndarray, max_tokens: int) -> list[int]:
    """Where the sorted examples of padded ``sizes`` are cut into batches (start positions)."""
    cuts: list[int] = []
    rows = longest = position = 0
    for start in range(0, len(sizes), CHUNK):
        for size in sizes[start : start + CHUNK].tolist():
            if rows and (rows + 1) * max(longest, size) > max_tokens:
                cuts.append(position)
                rows = longest = 0
            rows += 1
            longest = max(longest, size)
            position += 1
    return cuts


class Objective(Protocol):
    """How a language model's examples become batches (``tformer.data.lm``); translation
    pairs need none (teacher forcing, :func:`collate`)."""

    def collate(self, pairs: Sequence[IdPair], keys: Sequence[int]) -> Batch: ...

    def predicted(self, pair: IdPair, key: int) -> int: ...


def example_key(epoch: int, index: int) -> int:
    """The random-stream key of example ``index`` in ``epoch`` (masked LM's masking)."""
    return epoch * 1_000_000_007 + int(index)


class BatchPlan:
    """The batches of every epoch, as a pure function of (data, max_tokens, seed, epoch).

    Resuming therefore needs only the epoch and the position inside it. The pairs are kept
    as a :class:`PairStore` and their lengths as two arrays. A language model's ``objective``
    makes its batches (keyed by epoch and example, so they too are a pure function).
    """

    def __init__(
        self,
        pairs: Sequence[IdPair],
        max_tokens: int,
        seed: int,
        objective: Objective | None = None,
    ) -> None:
        self.pairs = as_store(pairs)
        self.max_tokens = max_tokens
        self.seed = seed
        self.objective = objective
        self.src_lengths, self.tgt_lengths = self.pairs.lengths()
        self._epoch: tuple[int, list[np.ndarray]] | None = None

    def epoch(self, epoch: int) -> list[np.ndarray]:
        """The batches (arrays of example indices) of ``epoch``; the last one asked is kept."""
        if self._epoch is None or self._epoch[0] != epoch:
            seed = self.seed * 100_003 + epoch
            lengths = (self.src_lengths, self.tgt_lengths)
            self._epoch = (epoch, bucket_batches(lengths, self.max_tokens, seed))
        return self._epoch[1]

    def target_tokens(self, indices: np.ndarray | Sequence[int], epoch: int = 0) -> int:
        """Tokens the model predicts for these examples: each target and its <eos>."""
        if self.objective is not None:
            objective = self.objective
            return sum(objective.predicted(self.pairs[i], example_key(epoch, i)) for i in indices)
        return int(self.tgt_lengths[np.asarray(indices, dtype=np.int64)].sum()) + len(indices)

    def collate(self, indices: np.ndarray | Sequence[int], epoch: int = 0) -> Batch:
        """The batch of these examples; the pages of mapped ids it read are released."""
        pairs = [self.pairs[i] for i in indices]
        if self.objective is not None:
            batch = self.objective.collate(pairs, [example_key(epoch, i) for i in indices])
        else:
            batch = collate(pairs)
        self.pairs.release()
        return batch

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        for indices in self.epoch(epoch)[start:]:
            yield self.collate(indices, epoch)

    def padding_share(self) -> float:
        """The share of padded positions across one epoch's batches (source + target)."""
        real = padded = 0
        for indices in self.epoch(0):
            src = self.src_lengths[indices]
            tgt = self.tgt_lengths[indices] + 1
            real += int(src.sum()) + int(tgt.sum())
            padded += len(indices) * (int(src.max()) + int(tgt.max()))
        return 1.0 - real / padded if padded else 0.0
