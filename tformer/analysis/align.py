"""Word alignments from cross-attention: which source words each target word was read from.

Shape legend: L decoder layers, B pairs, H heads, T target tokens (rows), S source tokens
(columns).

Row i of a cross map is the decoder position that *predicts* target token i (row 0 reads
<bos>), so target token i is aligned through row i: what the decoder attended to while it
produced that token. The last row, which predicts <eos>, is dropped; sources carry no special
tokens, so every column is a source token.

Links are extracted on subword tokens (``argmax``: each target token to its most attended
source token; ``threshold``: every weight >= t) and a word pair is linked when any of their
subwords are, as in Garg et al. (2019) and awesome-align (Dou & Neubig, 2021): the rule keeps
every subword's own decision, where averaging weights over a word's pieces would let a long
word in many pieces look weaker than a one-piece word. ``units="tokens"`` keeps the subword
links (useful when a "word" holds a whole date).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from tformer.checkpoint.store import Tokenizers
from tformer.config import BOS_ID
from tformer.data.batching import bucket_batches, pad
from tformer.data.tokenizer import Tokenizer
from tformer.errors import ConfigError
from tformer.model import TransformerBase

Link = tuple[int, int]  # (source index, target index), 0-based
Choice = int | Literal["mean"]
UNITS = ("words", "tokens")
ALIGN_BATCH_TOKENS = 4096  # padded tokens a batch; the maps of a batch are L·H·B·T·S floats
ALIGN_CHUNK = 10_000  # pairs whose maps are held at once (a whole training split would not fit)

_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class PairMap:
    """The selected cross-attention of one pair, over its (possibly cut) tokens.

    Attributes:
        weights: (T, S) float32; row t is the attention that produced target token t.
        source_words / target_words: the word index of each source / target token.
    """

    weights: np.ndarray
    source_words: list[int]
    target_words: list[int]


@dataclass(frozen=True)
class Alignment:
    """The links of one pair and the units (words or subword tokens) they index."""

    links: list[Link]
    source: list[str]
    target: list[str]

    def pharaoh(self) -> str:
        """``0-0 1-2 ...``: source-target, sorted by target then source."""
        return " ".join(f"{i}-{j}" for i, j in self.links)


# -- words and their subwords -------------------------------------------------------------------


def word_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the whitespace-separated words of ``text``."""
    return [match.span() for match in _WORD.finditer(text)]


def token_words(text: str, offsets: Sequence[tuple[int, int]]) -> list[int]:
    """The word of each token, from the tokenizer's character offsets into ``text``.

    A token belongs to the word of its last non-space character. A token with none (the "▁"
    word marker, whose span is empty or covers the space before a word) belongs to the word
    that follows it, or the last word when nothing follows.
    """
    word_of_char = [-1] * len(text)
    for index, (start, end) in enumerate(word_spans(text)):
        word_of_char[start:end] = [index] * (end - start)
    words = [
        next((word_of_char[c] for c in range(min(end, len(text)) - 1, start - 1, -1)
              if word_of_char[c] >= 0), -1)
        for start, end in offsets
    ]
    following = max(word_of_char, default=-1)
    for index in range(len(words) - 1, -1, -1):  # markers take the next word's index
        if words[index] < 0:
            words[index] = following
        following = words[index]
    return words


# -- extraction ---------------------------------------------------------------------------------


def extract_links(weights: np.ndarray, threshold: float | None = None) -> list[Link]:
    """Links of a (T, S) map: each row's argmax, or with ``threshold`` every weight >= it.

    Returns (source, target) pairs sorted by target then source.
    """
    if weights.size == 0:
        return []
    if threshold is None:
        return [(int(s), t) for t, s in enumerate(weights.argmax(axis=1))]
    rows, cols = np.nonzero(weights >= threshold)
    return [(int(s), int(t)) for t, s in zip(rows, cols, strict=True)]


def merge_links(
    links: Sequence[Link], source_words: Sequence[int], target_words: Sequence[int]
) -> list[Link]:
    """Subword links -> word links: a word pair is linked when any of their subwords are."""
    merged = {(source_words[s], target_words[t]) for s, t in links}
    return sorted(merged, key=lambda link: (link[1], link[0]))


def check_choice(value: Choice, size: int, flag: str, what: str) -> None:
    """Refuse a layer or head number outside ``-size..size-1`` (``mean`` is always fine)."""
    if value == "mean":
        return
    if isinstance(value, bool) or not isinstance(value, int) or not -size <= value < size:
        raise ConfigError(
            f"{flag} {value} is out of range: the model has {size} {what} "
            f"(0..{size - 1}, -1..-{size}, or 'mean')"
        )


def check_extraction(threshold: float | None, units: str) -> None:
    """Refuse a threshold outside (0, 1] or units other than words / tokens."""
    if units not in UNITS:
        raise ConfigError(f"--units {units!r} must be one of {', '.join(UNITS)}")
    if threshold is not None and not 0.0 < threshold <= 1.0:
        raise ConfigError(f"--threshold {threshold} must be in (0, 1]; attention rows sum to 1")


def select(cross: Sequence[Tensor], layer: Choice, head: Choice) -> Tensor:
    """(B, T, S): one decoder layer's cross maps or their mean, one head or the heads' mean."""
    maps = cross[layer] if layer != "mean" else torch.stack(list(cross)).mean(0)  # (B, H, T, S)
    return maps.mean(1) if head == "mean" else maps[:, head]


# -- the maps of many pairs, in batches ---------------------------------------------------------


def cross_attention(
    model: TransformerBase,
    tokenizers: Tokenizers,
    pairs: Sequence[tuple[str, str]],
    *,
    layer: Choice = "mean",
    head: Choice = "mean",
    max_tokens: int = ALIGN_BATCH_TOKENS,
) -> list[PairMap]:
    """The selected cross-attention of each (source, target) pair, target teacher-forced.

    Pairs are run in length-bucketed batches of about ``max_tokens`` padded tokens; padding
    gets no weight (key mask) and changes no real row (the decoder is causal). Inputs longer
    than the model's ``max_len`` are cut to it, as in decoding; their last words get no links.

    Raises:
        ConfigError: ``layer`` or ``head`` out of range for the model.
    """
    config = model.config
    check_choice(layer, config.n_decoder_layers, "--layer", "decoder layers")
    check_choice(head, config.n_heads, "--head", "heads")
    sources = tokenizers.source.encodings([s for s, _ in pairs])
    targets = tokenizers.target.encodings([t for _, t in pairs])
    src_ids = [e.ids[: config.max_len] for e in sources]
    tgt_ids = [e.ids[: config.max_len - 1] for e in targets]
    weights = [np.zeros((len(t), len(s)), np.float32)
               for s, t in zip(src_ids, tgt_ids, strict=True)]
    runnable = [i for i in range(len(pairs)) if src_ids[i] and tgt_ids[i]]
    lengths = [(len(src_ids[i]), len(tgt_ids[i])) for i in runnable]
    was_training = model.training
    model.eval()
    try:
        for batch in bucket_batches(lengths, max_tokens, seed=0):
            rows = [runnable[k] for k in batch.tolist()]
            maps = _batch_maps(model, [src_ids[i] for i in rows],
                               [tgt_ids[i] for i in rows], layer, head)
            for b, i in enumerate(rows):
                weights[i] = maps[b, : len(tgt_ids[i]), : len(src_ids[i])]
    finally:
        model.train(was_training)
    return [
        PairMap(weights[i],
                token_words(pairs[i][0], sources[i].offsets[: len(src_ids[i])]),
                token_words(pairs[i][1], targets[i].offsets[: len(tgt_ids[i])]))
        for i in range(len(pairs))
    ]


@torch.no_grad()
def _batch_maps(
    model: TransformerBase,
    src_ids: list[list[int]],
    tgt_ids: list[list[int]],
    layer: Choice,
    head: Choice,
) -> np.ndarray:
    device = next(model.parameters()).device
    src = pad(src_ids).to(device)  # (B, S)
    tgt_in = pad([[BOS_ID, *ids] for ids in tgt_ids]).to(device)  # (B, T + 1)
    decoded = model.decode(tgt_in, model.encode(src), need_weights=True)
    assert decoded.cross_attentions is not None
    return select(decoded.cross_attentions, layer, head).float().cpu().numpy()  # (B, T+1, S)


def align(
    model: TransformerBase,
    tokenizers: Tokenizers,
    pairs: Sequence[tuple[str, str]],
    *,
    layer: Choice = "mean",
    head: Choice = "mean",
    threshold: float | None = None,
    units: str = "words",
    max_tokens: int = ALIGN_BATCH_TOKENS,
) -> list[Alignment]:
    """Word (or subword) alignments of (source, target) pairs from the model's cross-attention.

    Args:
        layer / head: a decoder layer and a head (negative counts from the end) or "mean".
        threshold: None for argmax (one link per target token); else every weight >= it.
        units: "words" (whitespace-separated) or "tokens" (the tokenizer's subwords).

    Raises:
        ConfigError: a layer or head out of range, a threshold outside (0, 1], unknown units.
    """
    check_extraction(threshold, units)
    check_choice(layer, model.config.n_decoder_layers, "--layer", "decoder layers")
    check_choice(head, model.config.n_heads, "--head", "heads")
    alignments: list[Alignment] = []
    for start in range(0, len(pairs), ALIGN_CHUNK):  # the maps of one chunk at a time
        chunk = pairs[start : start + ALIGN_CHUNK]
        maps = cross_attention(model, tokenizers, chunk, layer=layer, head=head,
                               max_tokens=max_tokens)
        alignments.extend(_links(tokenizers, pair, pair_map, threshold, units)
                          for pair, pair_map in zip(chunk, maps, strict=True))
    return alignments


def _links(
    tokenizers: Tokenizers,
    pair: tuple[str, str],
    pair_map: PairMap,
    threshold: float | None,
    units: str,
) -> Alignment:
    source, target = pair
    links = extract_links(pair_map.weights, threshold)
    if units == "tokens":
        return Alignment(sorted(links, key=lambda link: (link[1], link[0])),
                         _tokens(tokenizers.source, source),
                         _tokens(tokenizers.target, target))
    merged = merge_links(links, pair_map.source_words, pair_map.target_words)
    return Alignment(merged, _words(source), _words(target))


def unit_counts(
    tokenizers: Tokenizers, pairs: Sequence[tuple[str, str]], units: str
) -> list[tuple[int, int]]:
    """(source, target) words or tokens of each pair: the index ranges of its links."""
    if units == "words":
        return [(len(word_spans(s)), len(word_spans(t))) for s, t in pairs]
    sources = tokenizers.source.encode_batch([s for s, _ in pairs])
    targets = tokenizers.target.encode_batch([t for _, t in pairs])
    return [(len(s), len(t)) for s, t in zip(sources, targets, strict=True)]


def _words(text: str) -> list[str]:
    return [text[start:end] for start, end in word_spans(text)]


def _tokens(tokenizer: Tokenizer, text: str) -> list[str]:
    return list(tokenizer.encodings([text])[0].tokens)
