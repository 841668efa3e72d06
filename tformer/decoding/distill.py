"""A teacher's outputs for many sources, decoded in batches bounded by tokens: the targets of
sequence-level knowledge distillation (Kim & Rush 2016), where a student learns from the
teacher's beam output instead of the references."""

from __future__ import annotations

from collections.abc import Sequence

from tformer.checkpoint import Tokenizers
from tformer.decoding.api import fit_input
from tformer.decoding.ensemble import Decodable
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.text import translate


def rows_per_source(config: DecodingConfig) -> int:
    """The decoder rows one source takes: its beams, or its samples."""
    return config.beam_size if config.beam_size > 1 else config.num_samples


def token_batches(lengths: Sequence[int], rows: int, max_tokens: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped shortest first so that each group's padded source
    tokens (sources x ``rows`` x its longest source) stay within ``max_tokens``; a source
    longer than the budget gets a group of its own."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        # Sorted by length, so the newest source is the longest of its group.
        if current and (len(current) + 1) * rows * lengths[index] > max_tokens:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def teacher_outputs(
    model: Decodable,
    tokenizers: Tokenizers,
    sources: Sequence[str],
    config: DecodingConfig,
    *,
    max_tokens: int,
) -> list[list[str]]:
    """The texts ``translate`` gives for each of ``sources`` (``n_best`` of beam search, or
    ``num_samples``), in input order, decoded one token-bounded batch at a time."""
    lengths = [len(fit_input(model, tokenizers.source.encode(text))) for text in sources]
    rows = rows_per_source(config)
    outputs: list[list[str]] = [[] for _ in sources]
    for batch in token_batches(lengths, rows, max_tokens):
        texts = [sources[i] for i in batch]
        # One decoding call per batch: translate decodes batch_size rows together.
        found = translate(model, tokenizers, texts, config, batch_size=len(batch) * rows)
        for index, generations in zip(batch, found, strict=True):
            outputs[index] = [g.text for g in generations]
    return outputs
