"""Beam search: the search itself on a model with known probabilities, then on the real one."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor, nn

from tformer.checkpoint.store import Checkpoint, load_checkpoint
from tformer.config import BOS_ID, EOS_ID
from tformer.data.batching import pad
from tformer.decoding.api import decode, decode_texts
from tformer.decoding.beam import beam_search
from tformer.decoding.settings import DecodingConfig
from tformer.model import DecoderCache, DecoderOutput, EncoderOutput
from tformer.training.run import TrainResult

A, B, C, D = 4, 5, 6, 7
V = 8
QUIET = 8  # a source token after which the model says <eos> at once

# next-token probabilities given the last token: a first-order Markov chain
TABLE = {
    BOS_ID: {A: 0.5, B: 0.4, EOS_ID: 0.1},
    A: {C: 0.35, D: 0.33, EOS_ID: 0.32},
    B: {EOS_ID: 0.9, C: 0.1},
    C: {EOS_ID: 1.0},
    D: {EOS_ID: 1.0},
}


def log_table(table: dict[int, dict[int, float]]) -> Tensor:
    logits = torch.full((V, V), float("-inf"))
    for prev, nexts in table.items():
        for token, p in nexts.items():
            logits[prev, token] = math.log(p)
    return logits


class TableModel(nn.Module):
    """A test double with the Transformer's decoding interface and a fixed next-token table.

    With ``TABLE``, greedy reads A C <eos> (p = 0.5 x 0.35 = 0.175); the most probable output
    is B <eos> (p = 0.4 x 0.9 = 0.36), which only a search finds. A source starting with
    ``QUIET`` ends at once, so tests can watch finished rows leave the batch.
    """

    # What a model says it has (TransformerBase): a translation model's decoder.
    reads_source = True
    generates = True
    continues_prompts = False

    def __init__(self, table: dict[int, dict[int, float]] = TABLE) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))  # gives the model a device
        self.config = SimpleNamespace(max_len=16)
        self.register_buffer("table", log_table(table))
        self.register_buffer("quiet", log_table({t: {EOS_ID: 1.0} for t in range(V)}))
        self.batch_sizes: list[int] = []

    def encode(self, src: Tensor) -> EncoderOutput:
        # The "memory" carries each source's first token, so it must follow every reorder.
        return EncoderOutput(src[:, :1, None].float(), (src != 0)[:, None, None])

    def new_cache(self) -> DecoderCache:
        return DecoderCache([])  # the table needs only the newest token

    def decode(
        self, tgt: Tensor, encoded: EncoderOutput, *, cache: DecoderCache | None = None
    ) -> DecoderOutput:
        self.batch_sizes.append(tgt.size(0))
        quiet = encoded.memory[:, 0, 0] == QUIET
        logits = torch.where(quiet[:, None, None], self.quiet[tgt], self.table[tgt])
        return DecoderOutput(logits)  # (B, T, V)


def beam(k: int, n_best: int = 1, **kwargs: object) -> DecodingConfig:
    return DecodingConfig(beam_size=k, n_best=n_best, **kwargs)


def test_beam_finds_the_best_sequence_greedy_misses() -> None:
    model = TableModel()
    src = torch.tensor([[9]])
    assert decode(model, src, DecodingConfig())[0][0].ids == [A, C]
    best = decode(model, src, beam(2, length_penalty=0.0))[0][0]
    assert best.ids == [B] and best.finished
    assert best.logprob == pytest.approx(math.log(0.36))
    assert best.token_logprobs == pytest.approx([math.log(0.4), math.log(0.9)])


def test_n_best_is_sorted_by_the_documented_length_penalty() -> None:
    model = TableModel()
    src = torch.tensor([[9]])
    for alpha in (0.0, 1.0, 2.0):
        hyps = decode(model, src, beam(3, n_best=3, length_penalty=alpha))[0]
        assert len(hyps) == 3
        for h in hyps:  # score = sum log p / length ** alpha, the length counting <eos>
            assert h.score == pytest.approx(h.logprob / len(h.token_logprobs) ** alpha)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    # log(0.36) / 2**2 = -0.255 loses to log(0.175) / 3**2 = -0.194: long outputs win.
    assert decode(model, src, beam(3, length_penalty=2.0))[0][0].ids == [A, C]
    assert decode(model, src, beam(3, length_penalty=1.0))[0][0].ids == [B]


def test_the_search_goes_on_while_a_live_beam_can_still_win() -> None:
    # After two steps the pool holds two ended outputs, <eos> alone (log 0.45 / 1 = -0.80) and
    # B <eos> (log 0.2 / 2 = -0.80), but the live A C (log 0.27 = -1.31, / 3 = -0.44 if it
    # ended now) can still beat them, so the search goes on and finds it.
    table = {
        BOS_ID: {EOS_ID: 0.45, A: 0.3, B: 0.25},
        A: {C: 0.9, EOS_ID: 0.1},
        B: {EOS_ID: 0.8, D: 0.2},
        C: {EOS_ID: 1.0},
        D: {EOS_ID: 1.0},
    }
    hyps = decode(TableModel(table), torch.tensor([[9]]), beam(2, n_best=2))[0]
    assert [h.ids for h in hyps] == [[A, C], []]
    assert hyps[0].score == pytest.approx(math.log(0.27) / 3)


def test_finished_sources_leave_the_batch() -> None:
    model = TableModel()
    out = decode(model, torch.tensor([[9], [QUIET]]), beam(2))
    assert [h[0].ids for h in out] == [[B], []]
    assert model.batch_sizes == [2, 2, 2]  # one row per source, then 2 beams of source 0 only
    model.batch_sizes.clear()
    out = decode(model, torch.tensor([[9], [QUIET]]), DecodingConfig())
    assert [h[0].ids for h in out] == [[A, C], []]
    assert model.batch_sizes == [2, 1, 1]  # A C <eos> for the first, <eos> for the second


def test_max_new_tokens_returns_unfinished_beams() -> None:
    hyps = decode(TableModel(), torch.tensor([[9]]), beam(2, n_best=2, max_new_tokens=1))[0]
    assert [h.ids for h in hyps] == [[A], [B]]
    assert not any(h.finished for h in hyps)


# -- the real model ----------------------------------------------------------------------------

TEXTS = ["3 1 4", "1 5 9 2 6 5", "7", "2 7 1 8 2", "0 0 0"]


@pytest.fixture(scope="module")
def ckpt(trained: TrainResult) -> Checkpoint:
    return load_checkpoint(trained.run_dir)


def test_beam_size_one_equals_greedy(ckpt: Checkpoint) -> None:
    src = pad([ckpt.tokenizers.source.encode(t) for t in TEXTS])
    greedy = decode(ckpt.model, src, DecodingConfig())
    one = beam_search(ckpt.model, src, DecodingConfig())  # the search loop with one beam
    assert [h[0].ids for h in one] == [h[0].ids for h in greedy]
    for a, b in zip(one, greedy, strict=True):
        assert a[0].token_logprobs == pytest.approx(b[0].token_logprobs, abs=1e-5)


def test_cached_beam_search_equals_full_recomputation(ckpt: Checkpoint) -> None:
    src = pad([ckpt.tokenizers.source.encode(t) for t in TEXTS])  # batched, with padding
    config = dict(beam_size=4, n_best=4, length_penalty=0.6, max_new_tokens=12)
    cached = decode(ckpt.model, src, DecodingConfig(**config))
    full = decode(ckpt.model, src, DecodingConfig(**config, use_cache=False))
    assert [[h.ids for h in row] for row in cached] == [[h.ids for h in row] for row in full]
    for a, b in zip(cached, full, strict=True):
        for x, y in zip(a, b, strict=True):
            assert x.token_logprobs == pytest.approx(y.token_logprobs, abs=1e-5)
            assert x.score == pytest.approx(y.score, abs=1e-5)


def test_beam_search_is_at_least_as_likely_as_greedy(ckpt: Checkpoint) -> None:
    ids = [ckpt.tokenizers.source.encode(t) for t in TEXTS]
    greedy = decode_texts(ckpt.model, ids, DecodingConfig())
    beams = decode_texts(ckpt.model, ids, beam(4, length_penalty=0.0), batch_size=8)
    for g, b in zip(greedy, beams, strict=True):
        assert b[0].logprob >= g[0].logprob - 1e-5


def test_constraints_apply_to_beam_search(ckpt: Checkpoint) -> None:
    ids = [ckpt.tokenizers.source.encode(t) for t in TEXTS]
    config = beam(3, n_best=3, no_repeat_ngram_size=1, min_new_tokens=2)
    for row in decode_texts(ckpt.model, ids, config):
        for h in row:
            assert len(set(h.ids)) == len(h.ids) and len(h.ids) >= 2


@pytest.mark.parametrize(("sources", "width", "vocab", "k"), [(1, 4, 5000, 4), (3, 4, 7, 4),
                                                              (2, 1, 50, 5), (2, 3, 2, 4)])
def test_each_rows_best_then_the_best_of_those_is_one_top_k_over_the_block(
    sources: int, width: int, vocab: int, k: int
) -> None:
    """The two-stage top-k picks what one top-k over each source's (width x V) block picks."""
    from tformer.decoding.beam import _Beams, _top_continuations

    generator = torch.Generator().manual_seed(sources * 100 + vocab)
    rows = sources * width
    beams = _Beams(sources=list(range(sources)), width=width,
                   tokens=torch.zeros(rows, 0, dtype=torch.long),
                   logps=torch.zeros(rows, 0), sums=torch.randn(rows, generator=generator))
    logp = torch.randn(rows, vocab, generator=generator).log_softmax(-1)
    n = min(2 * k, width * vocab)
    want_sums, want_flat = (beams.sums[:, None] + logp).view(sources, -1).topk(n, dim=1)
    got_sums, got_flat = _top_continuations(beams, logp, n)
    assert torch.equal(got_sums, want_sums)
    assert torch.equal(got_flat, want_flat)
