"""Beam search over the cached decoder (Sutskever et al., 2014; Wu et al., 2016 for the length
penalty), batched over sources.

Shape legend: B live sources, K beam size, R = B x K rows, t tokens so far, V target vocabulary.

Each source keeps K live beams. At each step every beam's log-probabilities (after the
constraint processors, applied to the log-probabilities as Hugging Face's beam search applies
them: repetition penalty, no-repeat n-gram, min new tokens) are added to its running sum,
and the 2K best continuations per source are visited best first: an <eos> among the first K
ends a hypothesis, which goes to the source's pool of finished hypotheses; the
other continuations refill the K live beams. The decoder's key/value cache follows the beams
by row reordering, never by recomputation.

Finished hypotheses are ranked by the GNMT / Hugging Face length-normalised score

    score = sum of log p(token) / length ** length_penalty

where length counts the generated tokens including <eos>. length_penalty 0 ranks by raw
log-probability (favouring short outputs), 1 by mean log-probability per token, > 1 favours
longer outputs. Early stopping: a source is done once K of its hypotheses have ended and its
best live beam, scored at its current length, cannot beat the worst of them (the Hugging Face
default); its rows then leave the batch. When --max-new-tokens is reached,
the live beams among the K best continuations join the pool as unfinished hypotheses where
they beat its worst (as Hugging Face's beam search finishes them). Returns the ``n_best``
best of the pool, best first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from tformer.config import BOS_ID, EOS_ID
from tformer.decoding.ensemble import Decodable
from tformer.decoding.logits import mask_special_tokens, run_stages
from tformer.decoding.settings import DecodingConfig, Hypothesis
from tformer.decoding.steppers import candidates, make_stepper, step_limit, token_ids

NEG_INF = float("-inf")


def length_normalised(logprob: float, length: int, length_penalty: float) -> float:
    """score = logprob / length ** length_penalty (GNMT / Hugging Face convention)."""
    return logprob / max(length, 1) ** length_penalty


@dataclass
class Pool:
    """The best ``size`` hypotheses of one source, by length-normalised score."""

    size: int
    length_penalty: float
    hyps: list[Hypothesis] = field(default_factory=list)

    def add(self, ids: list[int], logps: list[float], search_logprob: float, ended: bool) -> None:
        score = length_normalised(search_logprob, len(logps), self.length_penalty)
        if len(self.hyps) == self.size and score <= self.worst:
            return
        self.hyps.append(Hypothesis(ids, logps, ended, beam_score=score))
        self.hyps.sort(key=lambda h: h.score, reverse=True)  # stable: earlier wins a tie
        del self.hyps[self.size :]

    @property
    def worst(self) -> float:
        return self.hyps[-1].score if self.hyps else NEG_INF

    @property
    def full(self) -> bool:
        return len(self.hyps) == self.size


@dataclass
class _Beams:
    """The live rows: K per live source after the first step (1 before it)."""

    sources: list[int]  # the source of each live block of ``width`` rows
    width: int
    tokens: Tensor  # (R, t) generated so far
    logps: Tensor  # (R, t) the model's log-probability of each
    sums: Tensor  # (R,) running sum of the constrained log-probabilities (the search score)


@torch.inference_mode()  # lighter than no_grad: no version counters
def beam_search(
    model: Decodable, src: Tensor, config: DecodingConfig
) -> list[list[Hypothesis]]:
    """Beam search for a padded (B, S) batch; the ``n_best`` hypotheses per source, best first."""
    model.eval()
    device = src.device
    k = config.beam_size
    n_src = src.size(0)
    constraints = config.constraints()
    vocab = candidates(model, src)  # with a shortlist, tokens are positions in it
    stepper = make_stepper(model, src, config.use_cache, vocab)
    pools = [Pool(k, config.length_penalty) for _ in range(n_src)]
    beams = _Beams(
        sources=list(range(n_src)),
        width=1,  # the first step runs once per source; its K best continuations fill the beam
        tokens=torch.empty(n_src, 0, dtype=torch.long, device=device),
        logps=torch.empty(n_src, 0, device=device),
        sums=torch.zeros(n_src, device=device),
    )
    last = torch.full((n_src,), BOS_ID, dtype=torch.long, device=device)
    limit = step_limit(model, config, src)

    for step in range(limit):
        logits = mask_special_tokens(stepper.step(last), inplace=True)  # (R, V)
        model_logp = logits.log_softmax(dim=-1)
        # The constraints act on the log-probabilities, not renormalised afterwards (as in
        # Hugging Face's beam search): what they rule out is only ruled out, and an
        # unpenalised hypothesis is scored by its model log-probability.
        search_logp = model_logp
        if constraints:
            search_logp = run_stages(model_logp, beams.tokens, constraints)
        rows, next_tokens, sums, live = _select(
            beams, search_logp, model_logp, pools, k, last_step=step == limit - 1
        )
        if not live:
            break
        index = torch.tensor(rows, device=device)
        new = torch.tensor(next_tokens, device=device)
        same_source = live == beams.sources and beams.width == k
        stepper.reorder(index, same_source=same_source)
        beams = _Beams(
            sources=live,
            width=k,
            tokens=torch.cat([beams.tokens.index_select(0, index), new[:, None]], dim=1),
            logps=torch.cat(
                [beams.logps.index_select(0, index), model_logp[index, new][:, None]], 1
            ),
            sums=torch.tensor(sums, device=device),
        )
        last = new

    return token_ids([_n_best(pool, config.n_best) for pool in pools], vocab)


def _top_continuations(beams: _Beams, search_logp: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The ``n`` best (running sum, row-in-block * V + token) of each live source, best first.

    Each row's ``n`` best first, then the best of those: the same set as one top-k over a
    source's whole (width * V) block, and on a CPU several times faster, since a top-k along
    rows runs one row per thread where one long row runs on one.
    """
    vocab = search_logp.size(-1)
    sources = len(beams.sources)
    per_row = min(n, vocab)
    # A row's running sum is one number added to all of its tokens: it changes no rank in the
    # row, so it is added to the row's n best only, not to all V.
    row_best, row_tokens = search_logp.topk(per_row, dim=1)  # (R, n)
    row_sums = beams.sums[:, None] + row_best
    top_sums, at = row_sums.view(sources, -1).topk(n, dim=1)  # (B, n) over width * n
    tokens = row_tokens.view(sources, -1).gather(1, at)
    return top_sums, (at // per_row) * vocab + tokens


def _select(
    beams: _Beams,
    search_logp: Tensor,
    model_logp: Tensor,
    pools: list[Pool],
    k: int,
    *,
    last_step: bool,
) -> tuple[list[int], list[int], list[float], list[int]]:
    """One step of the search for every live source.

    Returns:
        (row each next beam continues, its new token, its running sum, the sources still
        live); a source that is done contributes no rows.
    """
    vocab = search_logp.size(-1)
    top_sums, top_flat = _top_continuations(beams, search_logp, min(2 * k, beams.width * vocab))
    top_sums_l, top_flat_l = top_sums.tolist(), top_flat.tolist()
    history: list[list[int]] | None = None  # fetched from the device only when needed
    history_logps: list[list[float]] | None = None
    rows: list[int] = []
    next_tokens: list[int] = []
    sums: list[float] = []
    live: list[int] = []
    for b, source in enumerate(beams.sources):
        kept: list[tuple[int, int, float]] = []
        in_top_k = 0  # how many of kept rank among the K best continuations
        for rank, (total, flat) in enumerate(zip(top_sums_l[b], top_flat_l[b], strict=True)):
            if total == NEG_INF or len(kept) == k:
                break
            row, token = b * beams.width + flat // vocab, flat % vocab
            if token != EOS_ID:
                kept.append((row, token, total))
                in_top_k += rank < k
            elif rank < k:  # an <eos> below the K best would not be in the beam at all
                if history is None or history_logps is None:
                    history, history_logps = beams.tokens.tolist(), beams.logps.tolist()
                eos_logp = float(model_logp[row, EOS_ID])
                pools[source].add(history[row], [*history_logps[row], eos_logp], total, True)
        if last_step:
            _finish_unended(beams, model_logp, pools[source], kept[:in_top_k])
            continue
        if not kept or _done(pools[source], kept[0][2], beams.tokens.size(1) + 1):
            continue  # done: its rows leave the batch
        # Fewer than K possible continuations (tiny vocabularies): pad with dead beams.
        kept += [(kept[0][0], kept[0][1], NEG_INF)] * (k - len(kept))
        live.append(source)
        for row, token, total in kept:
            rows.append(row)
            next_tokens.append(token)
            sums.append(total)
    return rows, next_tokens, sums, live


def _done(pool: Pool, best_live_sum: float, length: int) -> bool:
    """K hypotheses have ended and the best live beam, scored at its length, cannot beat the
    worst of them: Hugging Face's default heuristic (exact for length_penalty 0, where sums
    only fall; with a positive one a longer output could still score higher)."""
    if not pool.full:
        return False
    return length_normalised(best_live_sum, length, pool.length_penalty) <= pool.worst


def _finish_unended(
    beams: _Beams, model_logp: Tensor, pool: Pool, kept: list[tuple[int, int, float]]
) -> None:
    """--max-new-tokens reached: the live continuations among the K best join the pool,
    marked unfinished, where they beat its worst (as an <eos> there would have)."""
    for row, token, total in kept:
        ids = [*beams.tokens[row].tolist(), token]
        logps = [*beams.logps[row].tolist(), float(model_logp[row, token])]
        pool.add(ids, logps, total, False)


def _n_best(pool: Pool, n: int) -> list[Hypothesis]:
    if not pool.hyps:  # every continuation was ruled out (only with extreme constraints)
        return [Hypothesis([], [], False, beam_score=NEG_INF)]
    return pool.hyps[:n]
