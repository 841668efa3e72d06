"""Id pairs -> token-budget batches: bucketing by length, padding, teacher-forcing shift.

Shape legend: B pairs in a batch, S longest source, T longest target + 1 (for BOS/EOS).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.config import BOS_ID, EOS_ID, PAD_ID

IdPair = tuple[list[int], list[int]]


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
    """Right-pad id lists into a (B, L) long tensor."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


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
    lengths: Sequence[tuple[int, int]], max_tokens: int, seed: int
) -> list[list[int]]:
    """Group example indices into batches of similar length under a padded-token budget.

    Examples are sorted by length (ties broken at random, so each seed groups them differently)
    and cut into consecutive runs while ``rows * longest <= max_tokens``, where ``longest``
    counts the source or the target + 1, whichever is longer. The batch order is shuffled.
    An example longer than the whole budget gets a batch of its own.
    """
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


class BatchPlan:
    """The batches of every epoch, as a pure function of (data, max_tokens, seed, epoch).

    Resuming therefore needs only the epoch and the position inside it.
    """

    def __init__(self, pairs: Sequence[IdPair], max_tokens: int, seed: int) -> None:
        self.pairs = pairs
        self.max_tokens = max_tokens
        self.seed = seed
        self.lengths = [(len(s), len(t)) for s, t in pairs]

    def epoch(self, epoch: int) -> list[list[int]]:
        return bucket_batches(self.lengths, self.max_tokens, self.seed * 100_003 + epoch)

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        for indices in self.epoch(epoch)[start:]:
            yield collate([self.pairs[i] for i in indices])

    def padding_share(self) -> float:
        """The share of padded positions across one epoch's batches (source + target)."""
        real = padded = 0
        for indices in self.epoch(0):
            src = [self.lengths[i][0] for i in indices]
            tgt = [self.lengths[i][1] + 1 for i in indices]
            real += sum(src) + sum(tgt)
            padded += len(indices) * (max(src) + max(tgt))
        return 1.0 - real / padded if padded else 0.0
