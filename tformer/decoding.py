"""Autoregressive decoding: pure logit processors and a cached greedy / sampling loop.

Shape legend: B rows being decoded (sources x samples), S source length, V target vocabulary.

Order of the logit processors, applied to the raw logits z of each step:
    1. temperature   z / T                  (T = 0 means greedy: argmax, no sampling)
    2. top-k         keep the k largest logits
    3. top-p         keep the smallest set of tokens whose probability reaches p
then sample from softmax of what is left. Scores are log-probabilities under the *model*
(softmax(z), before any processor), so they compare across decoding settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.errors import ConfigError
from tformer.model import Transformer
from tformer.model.transformer import EncoderOutput
from tformer.tokenizer import BOS_ID, EOS_ID, PAD_ID

# -- pure logit processors --------------------------------------------------------------------


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """z / T. T must be > 0 (T = 0, greedy, is handled by the caller as argmax)."""
    return logits / temperature


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Set every logit below the k-th largest (per row) to -inf; ties at the k-th are kept."""
    if k <= 0 or k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering: keep the most probable tokens until their mass reaches ``p``.

    The token that crosses ``p`` is kept, so at least one token always survives.
    """
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    # Mass strictly before each token; a token is dropped once that mass has reached p.
    before = probs.cumsum(dim=-1) - probs
    drop_sorted = before >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def process_logits(
    logits: Tensor, *, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> Tensor:
    """Apply temperature, top-k and top-p in that order (see the module docstring)."""
    logits = apply_temperature(logits, temperature)
    logits = top_k_filter(logits, top_k)
    return top_p_filter(logits, top_p)


# -- settings ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DecodingConfig:
    """How to pick each next token."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 128
    num_samples: int = 1
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"--temperature {self.temperature} must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ConfigError(f"--top-k {self.top_k} must be >= 0 (0 = off)")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"--top-p {self.top_p} must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens {self.max_new_tokens} must be >= 1")
        if self.num_samples < 1:
            raise ConfigError(f"--num-samples {self.num_samples} must be >= 1")
        if self.num_samples > 1 and self.temperature == 0:
            raise ConfigError(
                "--num-samples > 1 needs sampling: with --temperature 0 (greedy) every sample "
                "would be the same; set --temperature, e.g. 0.8"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Hypothesis:
    """One decoded sequence: token ids (no BOS/EOS), per-token log-probabilities, their sum."""

    ids: list[int]
    token_logprobs: list[float]
    finished: bool

    @property
    def score(self) -> float:
        return float(sum(self.token_logprobs))


# -- the decoding loop ------------------------------------------------------------------------


def _select_rows(encoded: EncoderOutput, index: Tensor) -> EncoderOutput:
    return EncoderOutput(encoded.memory.index_select(0, index), encoded.mask.index_select(0, index))


@torch.no_grad()
def decode(
    model: Transformer,
    src: Tensor,
    config: DecodingConfig,
    generator: torch.Generator | None = None,
) -> list[Hypothesis]:
    """Decode a padded (B, S) batch of source ids; one hypothesis per row, in row order.

    The source is encoded once; each step feeds only the newest token and reuses the cached
    keys/values of earlier steps; rows that produced EOS leave the batch.
    """
    model.eval()
    device = src.device
    encoded = model.encode(src)
    cache = model.new_cache()
    n = src.size(0)
    max_steps = min(config.max_new_tokens, model.config.max_len - 1) + 1  # + 1 for EOS
    active = torch.arange(n, device=device)  # original row of each live batch row
    last = torch.full((n, 1), BOS_ID, dtype=torch.long, device=device)
    ids: list[list[int]] = [[] for _ in range(n)]
    logps: list[list[float]] = [[] for _ in range(n)]
    finished = [False] * n

    for _ in range(max_steps):
        logits = model.decode(last, encoded, cache=cache).logits[:, -1].float()  # (B, V)
        logits[:, PAD_ID] = float("-inf")  # padding is never a prediction
        logits[:, BOS_ID] = float("-inf")
        log_probs = logits.log_softmax(dim=-1)
        if config.greedy:
            chosen = logits.argmax(dim=-1)
        else:
            processed = process_logits(
                logits, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p
            )
            chosen = torch.multinomial(processed.softmax(dim=-1), 1, generator=generator)[:, 0]
        chosen_logp = log_probs.gather(1, chosen[:, None])[:, 0]

        keep: list[int] = []
        for row, (orig, token, logp) in enumerate(
            zip(active.tolist(), chosen.tolist(), chosen_logp.tolist(), strict=True)
        ):
            logps[orig].append(logp)
            if token == EOS_ID:
                finished[orig] = True
            else:
                ids[orig].append(token)
                keep.append(row)
        if not keep:
            break
        if len(keep) < active.numel():
            index = torch.tensor(keep, device=device)
            active = active.index_select(0, index)
            chosen = chosen.index_select(0, index)
            cache.reorder(index)
            encoded = _select_rows(encoded, index)
        last = chosen[:, None]

    return [Hypothesis(ids[i], logps[i], finished[i]) for i in range(n)]


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def decode_texts(
    model: Transformer,
    src_ids: Sequence[Sequence[int]],
    config: DecodingConfig,
    *,
    batch_size: int = 64,
) -> list[list[Hypothesis]]:
    """Decode many sources: sorted by length into batches, results back in input order.

    Returns:
        For each source, ``config.num_samples`` hypotheses.
    """
    from tformer.data import pad  # local: data imports HF datasets lazily, keep this light

    device = next(model.parameters()).device
    generator = make_generator(config.seed, device)
    order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
    rows_per_batch = max(1, batch_size // config.num_samples)
    results: list[list[Hypothesis]] = [[] for _ in src_ids]
    for start in range(0, len(order), rows_per_batch):
        chunk = order[start : start + rows_per_batch]
        # Empty inputs still need one position for the encoder to attend to.
        rows = [list(src_ids[i]) or [EOS_ID] for i in chunk for _ in range(config.num_samples)]
        hyps = decode(model, pad(rows).to(device), config, generator)
        for j, index in enumerate(chunk):
            results[index] = hyps[j * config.num_samples : (j + 1) * config.num_samples]
    return results
