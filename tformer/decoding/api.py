"""Decoding entry points: a padded batch, many sources in input order, or one streamed source.

Greedy decoding and sampling live in ``sampling``, beam search in ``beam``; both share the
settings, the steppers and the logit processors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from tformer.config import EOS_ID, PAD_ID
from tformer.data.batching import pad
from tformer.decoding.beam import beam_search
from tformer.decoding.ensemble import Decodable
from tformer.decoding.sampling import StepEvents, sample_steps
from tformer.decoding.settings import DecodingConfig, Hypothesis
from tformer.errors import ConfigError
from tformer.fast import sharing


def _drain(events: StepEvents) -> list[list[Hypothesis]]:
    while True:
        try:
            next(events)
        except StopIteration as stop:
            return stop.value


def decode(model: Decodable, src: Tensor, config: DecodingConfig) -> list[list[Hypothesis]]:
    """Decode a padded (B, S) batch of source ids.

    A source longer than the model's ``max_len`` is read up to ``max_len`` tokens (the encoder
    has no positions past it); the CLI warns when that happens.

    Returns:
        For each source row, in row order: ``num_samples`` hypotheses (greedy / sampling), or
        the ``n_best`` best of beam search, best first.
    """
    if model.continues_prompts:
        return _decode_prompts(model, src, config)
    src = src[:, : model.config.max_len]
    if config.beam_size > 1:
        return beam_search(model, src, config)
    return _drain(sample_steps(model, src, config))


def _decode_prompts(
    model: Decodable, prompts: Tensor, config: DecodingConfig
) -> list[list[Hypothesis]]:
    """A decoder-only model's padded (B, P) prompts, decoded in groups of one length: a
    prompt is read in one pass after <bos>, so padding inside a group would sit between the
    prompt and what follows it."""
    lengths = (prompts != PAD_ID).sum(dim=1).tolist()
    results: list[list[Hypothesis]] = [[] for _ in lengths]
    for length in sorted(set(lengths)):
        rows = [i for i, n in enumerate(lengths) if n == length]
        group = prompts[rows, :length]
        group = group[:, max(0, length - (model.config.max_len - 1)) :]
        if config.beam_size > 1:
            hyps = beam_search(model, group, config)
        else:
            hyps = _drain(sample_steps(model, group, config))
        for row, found in zip(rows, hyps, strict=True):
            results[row] = found
    return results


def stream_tokens(
    model: Decodable, src_ids: Sequence[int], config: DecodingConfig, sample: int = 0
) -> Iterator[int]:
    """Yield the output tokens of one source as they are decoded (greedy or sampling).

    Gives the same tokens as ``decode_texts`` with the same settings (sample ``sample``).
    """
    if config.beam_size > 1:
        raise ConfigError(
            "streaming needs greedy decoding or sampling: beam search knows its best output "
            "only at the end; drop --stream or --beam-size"
        )
    if not 0 <= sample < config.num_samples:
        raise ValueError(f"sample {sample} is outside 0..{config.num_samples - 1}")
    device = next(model.parameters()).device
    src = torch.tensor([fit_input(model, src_ids)], dtype=torch.long, device=device)
    for _, tokens in sample_steps(model, src, config, samples=[sample]):
        if tokens[0] == EOS_ID:
            return
        yield tokens[0]


def fit_input(model: Decodable, ids: Sequence[int]) -> list[int]:
    """An input as ``model`` reads it: a source (:func:`fit_source`), or a decoder-only
    model's prompt, its last ``max_len - 1`` ids (after <bos>), possibly none."""
    max_len = model.config.max_len
    if model.continues_prompts:
        return list(ids[len(ids) - (max_len - 1) :] if len(ids) >= max_len else ids)
    return fit_source(ids, max_len)


def fit_source(src_ids: Sequence[int], max_len: int) -> list[int]:
    """A source as the encoder reads it: its first ``max_len`` ids; an empty one as <eos>
    (the encoder needs one position to attend to)."""
    return list(src_ids[:max_len]) or [EOS_ID]


def long_inputs_warning(
    lengths: Sequence[int], max_len: int, *, prompts: bool = False
) -> str | None:
    """What to tell a user whose inputs (of ``lengths`` tokens) are longer than the model's
    ``max_len``, of which ``fit_source`` reads only the first ``max_len`` (a decoder-only
    model's ``prompts``: the last ``max_len - 1``, after <bos>); None when all fit."""
    room = max_len - 1 if prompts else max_len
    cut = [(n, length) for n, length in enumerate(lengths, start=1) if length > room]
    if not cut:
        return None
    n, length = cut[0]
    kept = f"last {room} tokens (after <bos>)" if prompts else f"first {room} tokens"
    return (
        f"{len(cut)} of {len(lengths)} inputs are longer than the model's max_len of {max_len} "
        f"tokens (input {n} has {length}); only their {kept} were read"
    )


def long_target_warning(length: int, max_len: int, name: str = "--target") -> str | None:
    """What to tell a user whose teacher-forced target ``name`` of ``length`` tokens does not
    fit after <bos> in ``max_len`` positions; None when it fits."""
    room = max_len - 1
    if length <= room:
        return None
    return (
        f"{name} has {length} tokens; with <bos> the model's max_len of {max_len} leaves room "
        f"for {room}, so only its first {room} tokens were read"
    )


def decode_texts(
    model: Decodable,
    src_ids: Sequence[Sequence[int]],
    config: DecodingConfig,
    *,
    batch_size: int = 64,
) -> list[list[Hypothesis]]:
    """Decode many sources: sorted by length into batches, results back in input order.

    Args:
        batch_size: rows decoded together (each source takes num_samples or beam_size rows).
    Returns:
        For each source, ``config.num_samples`` hypotheses, or the ``n_best`` of beam search.
    """
    device = next(model.parameters()).device
    sources_per_batch = max(1, batch_size // config.rows_per_input)
    order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
    results: list[list[Hypothesis]] = [[] for _ in src_ids]
    for start in range(0, len(order), sources_per_batch):
        chunk = order[start : start + sources_per_batch]
        rows = [fit_input(model, src_ids[i]) for i in chunk]
        sharing.rebalance()  # fewer threads while other tformer processes are busy
        for index, hyps in zip(chunk, decode(model, pad(rows).to(device), config), strict=True):
            results[index] = hyps
    return results
