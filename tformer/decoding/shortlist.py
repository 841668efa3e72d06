"""A lexical shortlist: decode over the target tokens a batch's source can translate to.

Shape legend: B sources, S source length, V target vocabulary, C candidate tokens, k per word.

Half of a beam-search step at batch 32 is vocabulary-sized work (the output projection, the
log-softmax, the top-k over every token; docs/distill.md), the same for a small student as
for its teacher. Marian's remedy is a lexical shortlist: for each source token the ``k``
target tokens it most often translates to, plus the ``frequent`` most frequent target tokens;
a batch is decoded over the union of its source tokens' lists, so every step projects onto
``C`` of the ``V`` rows of the output embedding. The translation table is IBM Model 1's
p(target | source) (Brown et al., 1993), estimated by expectation-maximisation on the training
pairs' token ids.

Decoding over the candidates changes nothing else: the special tokens keep their ids (they are
always candidates and the smallest ids), a token outside the list is never produced, and the
softmax is over the candidates (as in Marian). Scoring a given output uses every token.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save
from torch import Tensor

from tformer.checkpoint.files import write_bytes_atomic
from tformer.config import SPECIAL_TOKENS
from tformer.data.tokenizer import Tokenizer
from tformer.errors import CheckpointError, ConfigError
from tformer.paths import json_loads
from tformer.source_files import MIB, read_bytes

FORMAT = "tformer-shortlist"
VERSION = 1
# The most a shortlist file may hold: V x k int32 ids for a 64k vocabulary and k = 1,000.
MAX_BYTES = 256 * MIB
MAX_PER_WORD = 1000
EM_ITERATIONS = 5  # IBM Model 1's likelihood changes little after the first few (Brown 1993)


def vocabulary_digest(tokenizer: Tokenizer) -> str:
    """A hash of ``tokenizer``'s token -> id map: what a shortlist's ids mean."""
    items = sorted(tokenizer.inner.get_vocab(with_added_tokens=True).items())
    return hashlib.sha256(json.dumps(items).encode("utf-8")).hexdigest()


@dataclass(frozen=True, eq=False)
class Shortlist:
    """The candidates of each source token and the frequent target tokens.

    Attributes:
        best: (V_src, k) the target ids each source id translates to, most probable first;
            -1 where a source id has fewer than k (or was never seen).
        frequent: (N,) the most frequent target ids, always candidates.
        target_vocab_size: the target vocabulary the ids index.
        source_digest, target_digest: :func:`vocabulary_digest` of the tokenizers it was made
            with; a checkpoint with other vocabularies is refused.
    """

    best: Tensor
    frequent: Tensor
    target_vocab_size: int
    source_digest: str
    target_digest: str

    def candidates(self, src: Tensor) -> Tensor:
        """(B, S) source ids -> (C,) sorted target ids: the special tokens, the frequent
        ones and every source token's list (padding included, whose list is empty)."""
        words = torch.unique(src.reshape(-1).clamp(0, self.best.size(0) - 1).cpu())
        kept = torch.zeros(self.target_vocab_size, dtype=torch.bool)
        kept[: len(SPECIAL_TOKENS)] = True
        kept[self.frequent.long()] = True
        ids = self.best[words].reshape(-1).long()
        kept[ids[ids >= 0]] = True
        return kept.nonzero()[:, 0].to(src.device)  # sorted: the special tokens keep 0..3

    def check_fits(self, source: Tokenizer, target: Tokenizer, where: str) -> None:
        """Refuse, in one line naming ``where`` (the file), a model with other vocabularies."""
        for side, tokenizer, digest in (
            ("source", source, self.source_digest),
            ("target", target, self.target_digest),
        ):
            if vocabulary_digest(tokenizer) != digest:
                raise ConfigError(
                    f"--shortlist {where} was built for another {side} vocabulary than the "
                    "model's; build one for this checkpoint with tformer shortlist"
                )

    def save(self, path: Path) -> None:
        """Write the shortlist as safetensors (through a temporary file and a rename)."""
        metadata = {
            "format": FORMAT,
            "version": str(VERSION),
            "target_vocab_size": str(self.target_vocab_size),
            "source_digest": self.source_digest,
            "target_digest": self.target_digest,
        }
        tensors = {"best": self.best.int().contiguous(), "frequent": self.frequent.int()}
        write_bytes_atomic(path, save(tensors, metadata=metadata))


def load_shortlist(path: Path) -> Shortlist:
    """Read a shortlist file written by :meth:`Shortlist.save`.

    Raises:
        CheckpointError: naming ``path``: missing, not a regular file, too big, not a
            shortlist, or holding ids outside its vocabulary.
    """
    data = read_bytes(path, MAX_BYTES, too_big="a shortlist is far smaller")
    try:
        tensors = load(data)
        header_size = int.from_bytes(data[:8], "little")
        metadata = json_loads(data[8 : 8 + header_size]).get("__metadata__") or {}
    except (SafetensorError, ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: not a safetensors file ({error})") from None
    if metadata.get("format") != FORMAT or set(tensors) != {"best", "frequent"}:
        raise CheckpointError(f"{path}: not a tformer shortlist (tformer shortlist writes one)")
    if metadata.get("version") != str(VERSION):
        raise CheckpointError(
            f"{path}: shortlist version {metadata.get('version')!r}; this tformer reads "
            f"version {VERSION}"
        )
    best, frequent = tensors["best"].long(), tensors["frequent"].long()
    try:
        vocab = int(metadata.get("target_vocab_size", ""))
    except ValueError:
        vocab = -1
    ids = torch.cat([best.reshape(-1), frequent])
    if best.dim() != 2 or frequent.dim() != 1 or vocab < 1 or bool((ids >= vocab).any()):
        raise CheckpointError(f"{path}: its ids do not fit its target vocabulary of {vocab}")
    digests = str(metadata.get("source_digest")), str(metadata.get("target_digest"))
    return Shortlist(best, frequent, vocab, *digests)


def check_sizes(per_word: int, frequent: int) -> None:
    """``--per-word`` and ``--frequent``: in range, refused in one line otherwise."""
    if not 1 <= per_word <= MAX_PER_WORD:
        raise ConfigError(f"--per-word {per_word} must be from 1 to {MAX_PER_WORD}")
    if frequent < 0:
        raise ConfigError(f"--frequent {frequent} must be >= 0")


def translation_table(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    source_vocab: int,
    target_vocab: int,
    iterations: int = EM_ITERATIONS,
) -> tuple[Tensor, Tensor, Tensor]:
    """IBM Model 1's p(t | s) over the (source id, target id) pairs that co-occur.

    Each target token of a sentence pair is explained by one of its source tokens, chosen with
    probability proportional to p(t | s) (the E step); the expected counts, normalised per
    source token, are the next p(t | s) (the M step). Sparse: only pairs seen together exist.

    Returns:
        (K,) source ids, (K,) target ids and (K,) p(t | s), one entry per co-occurring pair.
    """
    src_words, tgt_words, groups = [], [], []
    group = 0
    for src, tgt in pairs:
        if not src or not tgt:
            continue
        s = torch.as_tensor(src, dtype=torch.long)
        t = torch.as_tensor(tgt, dtype=torch.long)
        src_words.append(s.repeat(len(t)))  # every source token for each target token
        tgt_words.append(t.repeat_interleave(len(s)))
        groups.append(torch.arange(group, group + len(t)).repeat_interleave(len(s)))
        group += len(t)
    if not src_words:
        empty = torch.empty(0, dtype=torch.long)
        return empty, empty, torch.empty(0)
    s_all, t_all, g_all = torch.cat(src_words), torch.cat(tgt_words), torch.cat(groups)
    keys, inverse = torch.unique(s_all * target_vocab + t_all, return_inverse=True)
    key_src, key_tgt = keys // target_vocab, keys % target_vocab
    prob = torch.ones(len(keys), dtype=torch.float64)
    for _ in range(iterations):
        p = prob[inverse]
        denominators = torch.zeros(group, dtype=torch.float64).index_add_(0, g_all, p)
        counts = torch.zeros(len(keys), dtype=torch.float64).index_add_(
            0, inverse, p / denominators[g_all]
        )
        totals = torch.zeros(source_vocab, dtype=torch.float64).index_add_(0, key_src, counts)
        prob = counts / totals[key_src]
    return key_src, key_tgt, prob


def build_shortlist(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    source: Tokenizer,
    target: Tokenizer,
    *,
    per_word: int,
    frequent: int,
) -> Shortlist:
    """The shortlist of ``pairs`` (source ids, target ids): each source id's ``per_word``
    most probable target ids under IBM Model 1, and the ``frequent`` commonest target ids."""
    check_sizes(per_word, frequent)
    source_vocab, target_vocab = source.vocab_size, target.vocab_size
    key_src, key_tgt, prob = translation_table(pairs, source_vocab, target_vocab)
    # Group by source id, most probable first: a stable sort by probability, then by source.
    order = torch.sort(prob, descending=True, stable=True).indices
    order = order[torch.sort(key_src[order], stable=True).indices]
    sorted_src, sorted_tgt = key_src[order], key_tgt[order]
    starts = torch.searchsorted(sorted_src, sorted_src, right=False)
    rank = torch.arange(len(sorted_src)) - starts
    keep = rank < per_word
    best = torch.full((source_vocab, per_word), -1, dtype=torch.int32)
    best[sorted_src[keep], rank[keep]] = sorted_tgt[keep].int()
    best[: len(SPECIAL_TOKENS)] = -1  # <pad> and the other specials translate to nothing
    targets = [torch.as_tensor(tgt, dtype=torch.long) for _, tgt in pairs]
    counts = torch.bincount(torch.cat([torch.empty(0, dtype=torch.long), *targets]),
                            minlength=target_vocab)  # fmt: skip
    counts[: len(SPECIAL_TOKENS)] = -1  # always candidates anyway
    top = torch.sort(counts, descending=True, stable=True).indices[: min(frequent, target_vocab)]
    top = top[counts[top] > 0]
    return Shortlist(
        best, top.int(), target_vocab, vocabulary_digest(source), vocabulary_digest(target)
    )
