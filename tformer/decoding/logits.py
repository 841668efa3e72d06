"""Logit processors: small pure functions that reshape one decoding step's scores.

Shape legend: B rows being decoded, V target vocabulary, t tokens generated so far.

Every processor maps raw scores ``(B, V)`` (and, where it needs them, the ``(B, t)`` tokens
generated so far) to new scores; a token is removed by setting its score to ``-inf``. They are
composed in one fixed order, the order Hugging Face ``generate`` uses:

    0. special tokens     <pad> and <bos> are never predicted                  (always)
    1. repetition penalty a seen token's logit z becomes z / θ if z > 0, else z · θ (CTRL)
    2. no-repeat n-gram   a token that would repeat an n-gram of the output is removed
    3. min new tokens     <eos> is removed until min_new_tokens tokens exist
       -- the "constraints" above shape the distribution every strategy sees (beam search
          applies them to log-probabilities, as Hugging Face's does)
    4. temperature        z / T
    5. top-k              keep the k largest scores (ties with the k-th are kept)
    6. top-p              keep the most probable tokens until their mass reaches p
    7. min-p              keep tokens whose probability is at least min_p x the top probability
       -- these "sampling" stages apply only when sampling (T > 0)

then a token is drawn from softmax of what is left, or the argmax is taken (greedy, T = 0).
Filters that could empty a row never do: the most probable token always survives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.config import BOS_ID, EOS_ID, PAD_ID

NEG_INF = float("-inf")

# (scores (B, V), generated tokens (B, t)) -> scores (B, V)
Processor = Callable[[Tensor, Tensor], Tensor]


# -- the pure functions -----------------------------------------------------------------------


def mask_special_tokens(logits: Tensor, *, inplace: bool = False) -> Tensor:
    """Remove <pad> and <bos>: neither is ever a prediction.

    ``inplace``: write into ``logits`` (a decoding loop's own fresh tensor) instead of a copy.
    """
    if not inplace:
        logits = logits.clone()
    logits[:, PAD_ID] = NEG_INF
    logits[:, BOS_ID] = NEG_INF
    return logits


def apply_repetition_penalty(logits: Tensor, history: Tensor, penalty: float) -> Tensor:
    """CTRL's penalty (Keskar et al., 2019) as Hugging Face applies it to logits.

    Each token already generated has its logit z replaced by z / θ when z > 0 and by z · θ
    otherwise, so θ > 1 always makes it less likely. θ = 1 is off.
    """
    if penalty == 1.0 or history.size(1) == 0:
        return logits
    seen = logits.gather(1, history)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(1, history, seen)  # repeats write the same value: no ambiguity


def ban_repeated_ngrams(logits: Tensor, history: Tensor, n: int) -> Tensor:
    """Remove every token that would complete an n-gram already present in ``history``."""
    t = history.size(1)
    if n <= 0 or t < n:
        return logits
    if n == 1:
        return logits.scatter(1, history, NEG_INF)
    windows = history.unfold(1, n, 1)  # (B, t - n + 1, n): every n-gram so far
    prefix = history[:, t - n + 1 :]  # (B, n - 1): what the next token would extend
    match = (windows[:, :, :-1] == prefix[:, None, :]).all(dim=-1)  # (B, t - n + 1)
    hits = torch.zeros_like(logits).scatter_add(1, windows[:, :, -1], match.to(logits.dtype))
    return logits.masked_fill(hits > 0, NEG_INF)


def suppress_eos(logits: Tensor, generated: int, min_new_tokens: int) -> Tensor:
    """Remove <eos> while fewer than ``min_new_tokens`` tokens have been generated."""
    if generated >= min_new_tokens:
        return logits
    logits = logits.clone()
    logits[:, EOS_ID] = NEG_INF
    return logits


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """z / T: softmax(z / T) is the sampling distribution. T must be > 0 (0 is greedy)."""
    return logits / temperature


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Set every logit below the k-th largest (per row) to -inf; ties at the k-th are kept."""
    if k <= 0 or k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al., 2020): keep the most probable tokens until their
    mass reaches ``p``.

    The token that crosses ``p`` is kept, and so is every token tied with it, so the result
    never depends on how a sort orders equal probabilities; at least one token survives.
    """
    if p >= 1.0:
        return logits
    probs = logits.softmax(dim=-1)
    sorted_probs = probs.sort(dim=-1, descending=True).values
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly before each token
    n_kept = (before < p).sum(dim=-1, keepdim=True).clamp(min=1)
    threshold = sorted_probs.gather(-1, n_kept - 1)  # the probability of the last one kept
    return logits.masked_fill(probs < threshold, NEG_INF)


def min_p_filter(logits: Tensor, min_p: float) -> Tensor:
    """Keep tokens with probability >= ``min_p`` x the most likely token's (Nguyen et al.,
    2024); 0 is off. The most likely token always survives."""
    if min_p <= 0.0:
        return logits
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, NEG_INF)


# -- composition ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """One processor in the pipeline, with the name shown by ``--explain``."""

    name: str
    apply: Processor


def constraint_stages(
    *, repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0, min_new_tokens: int = 0
) -> list[Stage]:
    """Stages 1-3 (see the module docstring): the ones that are switched on, in order."""
    stages = []
    if repetition_penalty != 1.0:
        stages.append(
            Stage(
                f"rep×{repetition_penalty:g}",
                lambda z, h: apply_repetition_penalty(z, h, repetition_penalty),
            )
        )
    if no_repeat_ngram_size > 0:
        stages.append(
            Stage(
                f"no-rep {no_repeat_ngram_size}",
                lambda z, h: ban_repeated_ngrams(z, h, no_repeat_ngram_size),
            )
        )
    if min_new_tokens > 0:
        stages.append(
            Stage(f"min {min_new_tokens}", lambda z, h: suppress_eos(z, h.size(1), min_new_tokens))
        )
    return stages


def sampling_stages(
    *, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> list[Stage]:
    """Stages 4-7 (see the module docstring): the ones that are switched on, in order."""
    stages = [Stage(f"T={temperature:g}", lambda z, h: apply_temperature(z, temperature))]
    if top_k > 0:
        stages.append(Stage(f"top-k {top_k}", lambda z, h: top_k_filter(z, top_k)))
    if top_p < 1.0:
        stages.append(Stage(f"top-p {top_p:g}", lambda z, h: top_p_filter(z, top_p)))
    if min_p > 0.0:
        stages.append(Stage(f"min-p {min_p:g}", lambda z, h: min_p_filter(z, min_p)))
    return stages


def run_stages(logits: Tensor, history: Tensor, stages: list[Stage]) -> Tensor:
    for stage in stages:
        logits = stage.apply(logits, history)
    return logits


def process_logits(
    logits: Tensor,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    history: Tensor | None = None,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    min_new_tokens: int = 0,
) -> Tensor:
    """The whole pipeline in its documented order (without the special-token mask).

    Args:
        logits: (B, V) raw scores of one step.
        temperature: > 0; greedy decoding takes the argmax of the constraints' output instead.
        history: (B, t) tokens generated so far; needed by the three constraints.
    """
    if history is None:
        history = torch.empty(logits.size(0), 0, dtype=torch.long, device=logits.device)
    stages = constraint_stages(
        repetition_penalty=repetition_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size,
        min_new_tokens=min_new_tokens,
    ) + sampling_stages(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    return run_stages(logits, history, stages)
