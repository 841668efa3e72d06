"""A teacher's outputs for many sources, decoded in batches bounded by tokens: the targets of
sequence-level knowledge distillation (Kim & Rush 2016), where a student learns from the
teacher's beam output instead of the references."""

from __future__ import annotations

from collections.abc import Sequence

from tformer.checkpoint import Tokenizers
from tformer.data.batching import bucket_batches
from tformer.decoding.api import fit_input
from tformer.decoding.ensemble import Decodable
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.text import translate


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
    rows = config.rows_per_input
    outputs: list[list[str]] = [[] for _ in sources]
    # Training's grouping by length under a padded-token budget, each source counted with its
    # rows: the budget per row is the budget over the rows.
    for group in bucket_batches([(n, 0) for n in lengths], max(1, max_tokens // rows), seed=0):
        batch = group.tolist()
        texts = [sources[i] for i in batch]
        # One decoding call per batch: translate decodes batch_size rows together.
        found = translate(model, tokenizers, texts, config, batch_size=len(batch) * rows)
        for index, generations in zip(batch, found, strict=True):
            outputs[index] = [g.text for g in generations]
    return outputs
