"""Greedy decoding and sampling, step by step, with reproducible randomness.

Shape legend: B source rows, R rows being decoded (sources x samples), t tokens generated so
far, V target vocabulary.

Sampling is reproducible per input: the random number that picks row r's token at step t is a
hash of (seed, the source's token ids, the sample index, t), so the same input with the same
seed gives the same samples whatever else is in the batch, the batch size, or the device.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tformer.config import BOS_ID, EOS_ID, PAD_ID
from tformer.decoding.ensemble import Decodable
from tformer.decoding.logits import Stage, mask_special_tokens, run_stages
from tformer.decoding.settings import DecodingConfig, Hypothesis
from tformer.decoding.steppers import candidates, make_stepper, step_limit, token_ids


def _hash64(*parts: int) -> int:
    data = struct.pack(f"<{len(parts)}Q", *(p % 2**64 for p in parts))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def row_key(src_ids: Sequence[int], sample: int) -> int:
    """A stable 64-bit name for (source, sample index): the input's own random stream."""
    return _hash64(*src_ids, len(src_ids), sample)


def uniform(seed: int, key: int, step: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, key, step), 53 random bits."""
    return (_hash64(seed, key, step) >> 11) * 2.0**-53


def sample_from_logits(logits: Tensor, uniforms: Tensor) -> Tensor:
    """Inverse-CDF sampling from softmax(logits): row i takes the first token whose
    cumulative probability exceeds ``uniforms[i]``. Tokens at -inf are never chosen.

    Args:
        logits: (R, V) processed scores. uniforms: (R,) numbers in [0, 1).
    Returns:
        (R,) token ids.
    """
    device = logits.device
    if device.type == "mps":  # no float64 there
        logits = logits.cpu()
    cdf = logits.double().softmax(dim=-1).cumsum(dim=-1)  # float64: no drift over 50k tokens
    target = uniforms.to(cdf)[:, None] * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, target, right=True)[:, 0].clamp(max=logits.size(-1) - 1)
    return tokens.to(device)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A torch generator seeded with ``seed``; None (torch's global one) when no seed."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def resolve_seed(seed: int | None) -> int:
    """The given seed, or a fresh one from torch's global generator."""
    if seed is not None:
        return seed
    return int(torch.randint(0, 2**62, ()).item())


# Each step yields the rows that got a token and those tokens (<eos> included); the
# generator's return value is one list of hypotheses per source row.
StepEvents = Generator[tuple[list[int], list[int]], None, list[list[Hypothesis]]]


def _source_rows(src: Tensor) -> list[list[int]]:
    return [[t for t in row if t != PAD_ID] for row in src.tolist()]


@dataclass
class _Outputs:
    """What each hypothesis (source x sample) has produced so far, and which rows are live."""

    active: list[int]  # the hypothesis of each live row
    ids: list[list[int]] = field(default_factory=list)
    logps: list[list[float]] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ids = [[] for _ in self.active]
        self.logps = [[] for _ in self.active]
        self.finished = [False] * len(self.active)

    def record(self, tokens: list[int], logps: list[float]) -> list[int]:
        """Add one step's token per live row; returns the rows that go on (no <eos> yet)."""
        keep: list[int] = []
        for row, (h, token, logp) in enumerate(zip(self.active, tokens, logps, strict=True)):
            self.logps[h].append(logp)
            if token == EOS_ID:
                self.finished[h] = True
            else:
                self.ids[h].append(token)
                keep.append(row)
        return keep

    def hypotheses(self, per_source: int) -> list[list[Hypothesis]]:
        hyps = [
            Hypothesis(i, lp, f)
            for i, lp, f in zip(self.ids, self.logps, self.finished, strict=True)
        ]
        return [hyps[i : i + per_source] for i in range(0, len(hyps), per_source)]


def _choose(scores: Tensor, history: Tensor, warpers: list[Stage], uniforms: list[float]) -> Tensor:
    """(R, V) processed scores -> (R,) next tokens: sampled through ``warpers`` with one
    uniform number per row, else greedy."""
    if warpers:
        u = torch.tensor(uniforms, dtype=torch.float64)
        return sample_from_logits(run_stages(scores, history, warpers), u)
    # max(dim) gives the same first-maximum index as argmax, and is faster on a CPU
    return scores.max(dim=-1).indices


@torch.inference_mode()  # lighter than no_grad: no version counters
def sample_steps(
    model: Decodable,
    src: Tensor,
    config: DecodingConfig,
    samples: Sequence[int] | None = None,
) -> StepEvents:
    """Greedy / sampling decoding of a padded (B, S) batch, step by step (see ``decode``).

    Rows are sources x samples; the first step runs once per source and is then copied to its
    samples; a row that produced <eos> leaves the batch. Yielded row numbers count
    source x len(samples) + sample position.

    Args:
        samples: which sample indices to decode (default: all ``config.num_samples``).
    """
    model.eval()
    device = src.device
    samples = range(config.num_samples) if samples is None else samples
    n_src, n = src.size(0), len(samples)
    seed = resolve_seed(config.seed)
    keys = [row_key(ids, s) for ids in _source_rows(src) for s in samples]
    constraints, warpers = config.constraints(), config.sampling()
    vocab = candidates(model, src)  # with a shortlist, tokens are positions in it
    stepper = make_stepper(model, src, config.use_cache, vocab)
    ids = None if vocab is None else vocab.tolist()

    out = _Outputs(list(range(n_src * n)))
    history = torch.empty(n_src, 0, dtype=torch.long, device=device)  # (R, t)
    last = torch.full((n_src,), BOS_ID, dtype=torch.long, device=device)
    limit = step_limit(model, config, src)

    for step in range(limit):
        logits = mask_special_tokens(stepper.step(last), inplace=True)  # (R, V)
        if step == 0 and n > 1:  # one step per source so far: copy it to the samples
            expand = torch.arange(n_src, device=device).repeat_interleave(n)
            logits, history = logits.index_select(0, expand), history.index_select(0, expand)
            stepper.reorder(expand)
        model_logp = logits.log_softmax(dim=-1)
        scores = run_stages(logits, history, constraints)
        u = [uniform(seed, keys[h], step) for h in out.active] if warpers else []
        chosen = _choose(scores, history, warpers, u)
        chosen_logp = model_logp.gather(1, chosen[:, None])[:, 0]
        tokens = chosen.tolist()
        keep = out.record(tokens, chosen_logp.tolist())
        yield out.active, (tokens if ids is None else [ids[t] for t in tokens])
        if not keep or step == limit - 1:
            break
        history = torch.cat([history, chosen[:, None]], dim=1)
        if len(keep) < len(out.active):  # finished rows stop costing compute
            index = torch.tensor(keep, device=device)
            out.active = [out.active[row] for row in keep]
            chosen, history = chosen.index_select(0, index), history.index_select(0, index)
            stepper.reorder(index)
        last = chosen

    return token_ids(out.hypotheses(n), vocab)
