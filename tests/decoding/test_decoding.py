"""Logit processors, exact sampling, the cached decoding loop, streaming and explanations."""

from __future__ import annotations

import math

import pytest
import torch

from tformer.analysis.explain import explain
from tformer.checkpoint.store import Checkpoint, load_checkpoint
from tformer.config import BOS_ID, EOS_ID, PAD_ID
from tformer.data.batching import pad
from tformer.decoding.api import decode, decode_texts, stream_tokens
from tformer.decoding.logits import (
    apply_repetition_penalty,
    apply_temperature,
    ban_repeated_ngrams,
    mask_special_tokens,
    min_p_filter,
    process_logits,
    suppress_eos,
    top_k_filter,
    top_p_filter,
)
from tformer.decoding.sampling import row_key, sample_from_logits, uniform
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.steppers import CachedStepper, RecomputeStepper
from tformer.errors import ConfigError
from tformer.fast.accelerate import accelerate
from tformer.fast.step import step_mask
from tformer.training.run import TrainResult

TEXTS = ["3 1 4", "1 5 9 2 6 5", "7", "2 7 1 8 2"]


@pytest.fixture(scope="module")
def ckpt(trained: TrainResult) -> Checkpoint:
    """The trained model with tformer's speed-ups, as decoding runs it by default."""
    checkpoint = load_checkpoint(trained.run_dir)
    accelerate(checkpoint.model)
    return checkpoint


def support(logits: torch.Tensor) -> list[int]:
    return torch.isfinite(logits[0]).nonzero()[:, 0].tolist()


# -- processors: hand-computed supports, ties included ----------------------------------------


def test_temperature_scales_logits_exactly() -> None:
    z = torch.tensor([[1.0, 2.0, 4.0]])
    for t in (0.5, 1.0, 2.0):
        torch.testing.assert_close(apply_temperature(z, t).softmax(-1), (z / t).softmax(-1))


def test_top_k_keeps_the_k_largest_and_ties() -> None:
    z = torch.tensor([[1.0, 5.0, 3.0, 3.0, 0.0]])
    assert support(top_k_filter(z, 1)) == [1]
    assert support(top_k_filter(z, 2)) == [1, 2, 3]  # the tie at the 2nd value is kept
    assert support(top_k_filter(z, 3)) == [1, 2, 3]
    assert support(top_k_filter(z, 4)) == [0, 1, 2, 3]
    assert support(top_k_filter(z, 0)) == [0, 1, 2, 3, 4]
    assert support(top_k_filter(torch.tensor([[2.0, 2.0, 2.0, 1.0]]), 1)) == [0, 1, 2]


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    z = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert support(top_p_filter(z, 0.5)) == [0]
    assert support(top_p_filter(z, 0.7)) == [0, 1]
    assert support(top_p_filter(z, 0.81)) == [0, 1, 2]
    assert support(top_p_filter(z, 1.0)) == [0, 1, 2, 3]
    # 0.45 + 0.25 crosses 0.6; the other 0.25 is tied with the crossing token and stays too.
    tied = torch.tensor([[0.25, 0.45, 0.05, 0.25]]).log()
    assert support(top_p_filter(tied, 0.3)) == [1]
    assert support(top_p_filter(tied, 0.6)) == [0, 1, 3]
    assert support(top_p_filter(tied, 0.71)) == [0, 1, 3]
    assert support(top_p_filter(tied, 0.96)) == [0, 1, 2, 3]
    assert support(top_p_filter(tied, 1e-6)) == [1]  # never empty


def test_min_p_keeps_tokens_near_the_top() -> None:
    z = torch.tensor([[0.5, 0.25, 0.2, 0.05]]).log()
    assert support(min_p_filter(z, 0.45)) == [0, 1]  # threshold 0.225
    assert support(min_p_filter(z, 0.3)) == [0, 1, 2]  # threshold 0.15
    assert support(min_p_filter(z, 0.05)) == [0, 1, 2, 3]
    assert support(min_p_filter(z, 0.0)) == [0, 1, 2, 3]
    tied = torch.tensor([[0.05, 0.4, 0.4, 0.15]]).log()
    assert support(min_p_filter(tied, 1.0)) == [1, 2]  # both tops survive
    assert support(min_p_filter(tied, 0.3)) == [1, 2, 3]


def test_repetition_penalty_follows_ctrl() -> None:
    z = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    seen = torch.tensor([[0, 1, 0]])  # repeats are penalised once
    out = apply_repetition_penalty(z, seen, 2.0)
    torch.testing.assert_close(out, torch.tensor([[1.0, -2.0, 0.5, 3.0]]))
    assert torch.equal(apply_repetition_penalty(z, seen, 1.0), z)


def test_no_repeat_ngram_bans_the_completing_token() -> None:
    z = torch.zeros(1, 10)
    history = torch.tensor([[5, 6, 7, 5, 6]])
    assert support(ban_repeated_ngrams(z, history, 3)) == [0, 1, 2, 3, 4, 5, 6, 8, 9]  # not 7
    assert support(ban_repeated_ngrams(z, history, 2)) == [0, 1, 2, 3, 4, 5, 6, 8, 9]  # 6 -> 7
    assert support(ban_repeated_ngrams(z, history, 1)) == [0, 1, 2, 3, 4, 8, 9]
    assert support(ban_repeated_ngrams(z, history, 4)) == list(range(10))  # 7 5 6 unseen
    assert support(ban_repeated_ngrams(z, history[:, :2], 3)) == list(range(10))  # too short


def test_min_new_tokens_suppresses_eos_only_until_reached() -> None:
    z = torch.zeros(1, 6)
    assert EOS_ID not in support(suppress_eos(z, 2, 3))
    assert EOS_ID in support(suppress_eos(z, 3, 3))
    assert support(mask_special_tokens(z)) == [i for i in range(6) if i not in (PAD_ID, BOS_ID)]


def test_process_logits_composes_in_the_documented_order() -> None:
    torch.manual_seed(0)
    z = torch.randn(3, 12)
    history = torch.randint(4, 12, (3, 5))
    kwargs = dict(repetition_penalty=1.3, no_repeat_ngram_size=2, min_new_tokens=9)
    expected = apply_repetition_penalty(z, history, 1.3)
    expected = ban_repeated_ngrams(expected, history, 2)
    expected = suppress_eos(expected, 5, 9)
    expected = apply_temperature(expected, 0.7)
    expected = top_k_filter(expected, 6)
    expected = top_p_filter(expected, 0.8)
    expected = min_p_filter(expected, 0.05)
    got = process_logits(
        z, temperature=0.7, top_k=6, top_p=0.8, min_p=0.05, history=history, **kwargs
    )
    torch.testing.assert_close(got, expected)


# -- sampling is exact ------------------------------------------------------------------------

# chi-square critical values at significance 0.001 (standard tables), by degrees of freedom
CHI2_CRITICAL_0_001 = {5: 20.515}


def chi_square(observed: torch.Tensor, expected: torch.Tensor) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def draw(logits: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """n draws through the real path: hashed uniforms, inverse-CDF sampling."""
    u = torch.tensor([uniform(seed, row_key([7], 0), step) for step in range(n)])
    return sample_from_logits(logits.expand(n, -1), u)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_sampling_frequencies_match_softmax_z_over_t(temperature: float) -> None:
    z = torch.tensor([[0.0, 0.5, 1.0, 1.5, 2.0, 2.5]])
    n = 20000
    tokens = draw(process_logits(z, temperature=temperature), n, seed=1234)
    observed = torch.bincount(tokens, minlength=6).double()
    expected = n * (z[0].double() / temperature).softmax(-1)
    assert chi_square(observed, expected) < CHI2_CRITICAL_0_001[5]
    # ... and the test has power: the same draws do not fit a different temperature.
    wrong = n * (z[0].double() / (temperature * 1.5)).softmax(-1)
    assert chi_square(observed, wrong) > CHI2_CRITICAL_0_001[5]


def test_temperature_towards_zero_is_argmax() -> None:
    z = torch.tensor([[0.3, 2.0, 1.9, -1.0]])
    tokens = draw(process_logits(z, temperature=1e-3), 500, seed=5)
    assert set(tokens.tolist()) == {1}


def test_filtered_tokens_are_never_sampled() -> None:
    z = torch.tensor([[0.0, 0.5, 1.0, 1.5, 2.0, 2.5]])
    tokens = draw(process_logits(z, temperature=1.0, top_k=3, top_p=0.9), 5000, seed=2)
    assert set(tokens.tolist()) <= {3, 4, 5}


# -- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "flags"),
    [
        ({"temperature": -1}, ["--temperature"]),
        ({"top_k": -1}, ["--top-k"]),
        ({"top_p": 0.0}, ["--top-p"]),
        ({"top_p": 1.5}, ["--top-p"]),
        ({"min_p": 1.5}, ["--min-p"]),
        ({"repetition_penalty": 0.0}, ["--repetition-penalty"]),
        ({"no_repeat_ngram_size": -2}, ["--no-repeat-ngram-size"]),
        ({"num_samples": 3}, ["--num-samples", "--temperature"]),
        ({"beam_size": 0}, ["--beam-size"]),
        ({"beam_size": 4, "num_samples": 2}, ["--num-samples 2", "--beam-size 4", "--n-best"]),
        ({"beam_size": 4, "temperature": 0.8}, ["--temperature 0.8", "--beam-size 4"]),
        ({"beam_size": 4, "top_p": 0.9}, ["--top-p 0.9", "--beam-size 4"]),
        ({"beam_size": 2, "n_best": 3}, ["--n-best 3", "--beam-size 2"]),
        ({"n_best": 2}, ["--n-best 2", "--beam-size 1"]),
        ({"min_new_tokens": 9, "max_new_tokens": 5}, ["--min-new-tokens 9", "--max-new-tokens 5"]),
        ({"top_k": 5}, ["--top-k 5", "--temperature"]),
        ({"min_p": 0.1}, ["--min-p 0.1", "--temperature"]),
        ({"length_penalty": 0.6}, ["--length-penalty 0.6", "--beam-size"]),
    ],
)
def test_bad_settings_are_refused_naming_the_flags(kwargs: dict, flags: list[str]) -> None:
    with pytest.raises(ConfigError) as error:
        DecodingConfig(**kwargs)
    for flag in flags:
        assert flag in str(error.value)


# -- the cached loop --------------------------------------------------------------------------


def full_greedy(model: torch.nn.Module, src: torch.Tensor, steps: int) -> list[list[int]]:
    """Reference: recompute the whole prefix at every step, no cache, no row dropping."""
    out = torch.full((src.size(0), 1), BOS_ID)
    for _ in range(steps):
        logits = model(src, out).logits[:, -1]
        logits[:, PAD_ID] = logits[:, BOS_ID] = float("-inf")
        out = torch.cat([out, logits.argmax(-1, keepdim=True)], dim=1)
    rows = []
    for row in out[:, 1:].tolist():
        rows.append(row[: row.index(EOS_ID)] if EOS_ID in row else row)
    return rows


def test_cached_greedy_equals_full_recomputation(ckpt: Checkpoint) -> None:
    tok = ckpt.tokenizers.source
    src = pad([tok.encode(t) for t in TEXTS])  # batched, with padding
    cached = [h[0] for h in decode(ckpt.model, src, DecodingConfig(max_new_tokens=20))]
    assert [h.ids for h in cached] == full_greedy(ckpt.model, src, 20)
    assert all(h.finished for h in cached)
    assert all(len(h.token_logprobs) == len(h.ids) + 1 for h in cached)
    assert all(h.score == h.logprob <= 0 for h in cached)

    no_cache = decode(ckpt.model, src, DecodingConfig(max_new_tokens=20, use_cache=False))
    for a, b in zip(cached, no_cache, strict=True):
        assert a.ids == b[0].ids
        torch.testing.assert_close(a.token_logprobs, b[0].token_logprobs, atol=1e-5, rtol=0)


def test_cached_step_logits_equal_recomputation_through_reorders(ckpt: Checkpoint) -> None:
    """Every step's logits, while rows are duplicated, permuted (beams) and dropped."""
    model = ckpt.model.eval()
    src = pad([ckpt.tokenizers.source.encode(t) for t in TEXTS])
    encoded = model.encode(src)
    cached, full = CachedStepper(model, encoded), RecomputeStepper(model, encoded)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.full((src.size(0),), BOS_ID)
    reorders = [
        (torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]), False),  # expand to 2 beams each
        (torch.tensor([1, 0, 3, 3, 4, 5, 7, 6]), True),  # reshuffle within sources
        (torch.tensor([0, 1, 6, 7]), False),  # drop two sources
        (torch.tensor([1, 1, 2, 3]), True),
        (torch.tensor([2, 3]), False),
    ]
    with torch.no_grad():
        for index, same_source in [(None, False), *reorders]:
            if index is not None:
                cached.reorder(index, same_source=same_source)
                full.reorder(index, same_source=same_source)
                tokens = tokens.index_select(0, index)
            a, b = cached.step(tokens), full.step(tokens)
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
            tokens = torch.multinomial(a.softmax(-1), 1, generator=generator)[:, 0]


def test_unpadded_sources_decode_without_a_mask_and_agree(ckpt: Checkpoint) -> None:
    # Sources of one length have no padding: steps attend without a mask, and must give the
    # logits of the masked, cache-free reference.
    model = ckpt.model.eval()
    tok = ckpt.tokenizers.source
    src = pad([tok.encode(t) for t in ["3 1 4", "2 7 1", "9 9 9"]])
    assert bool((src != PAD_ID).all())
    encoded = model.encode(src)
    assert step_mask(encoded.mask) is None
    padded = model.encode(pad([tok.encode(t) for t in TEXTS]))
    assert step_mask(padded.mask) is padded.mask
    cached, full = CachedStepper(model, encoded), RecomputeStepper(model, encoded)
    tokens = torch.full((src.size(0),), BOS_ID)
    with torch.no_grad():
        for _ in range(6):
            a, b = cached.step(tokens), full.step(tokens)
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
            tokens = a.max(dim=-1).indices


def test_special_token_mask_in_place_equals_the_copy() -> None:
    logits = torch.randn(3, 9)
    copy = mask_special_tokens(logits)
    assert torch.isfinite(logits).all()  # the default leaves its input alone
    same = mask_special_tokens(logits, inplace=True)
    assert same is logits and torch.equal(logits, copy)
    assert torch.isinf(logits[:, [PAD_ID, BOS_ID]]).all()


def test_min_and_max_new_tokens_bound_the_length(ckpt: Checkpoint) -> None:
    ids = [ckpt.tokenizers.source.encode(t) for t in TEXTS]
    exact = decode_texts(ckpt.model, ids, DecodingConfig(min_new_tokens=9, max_new_tokens=9))
    assert all(len(h[0].ids) == 9 and not h[0].finished for h in exact)
    short = decode_texts(ckpt.model, ids, DecodingConfig(max_new_tokens=2))
    assert all(len(h[0].ids) <= 2 for h in short)
    longer = decode_texts(ckpt.model, ids, DecodingConfig(min_new_tokens=7))
    assert all(len(h[0].ids) >= 7 and h[0].finished for h in longer)


def test_sampling_is_reproducible_with_a_seed(ckpt: Checkpoint) -> None:
    src = [ckpt.tokenizers.source.encode(t) for t in TEXTS]

    def run(seed: int, batch_size: int = 64) -> list[list[list[int]]]:
        config = DecodingConfig(temperature=8.0, seed=seed, num_samples=3)
        return [
            [h.ids for h in row]
            for row in decode_texts(ckpt.model, src, config, batch_size=batch_size)
        ]

    a = run(11)
    assert run(11) == a
    assert run(12) != a
    # An input's samples do not depend on what else is decoded with it, nor on batching.
    assert run(11, batch_size=3) == a
    alone = decode_texts(
        ckpt.model, src[1:2], DecodingConfig(temperature=8.0, seed=11, num_samples=3)
    )
    assert [h.ids for h in alone[0]] == a[1]


def test_outputs_come_back_in_input_order(ckpt: Checkpoint) -> None:
    texts = ["1 2 3 4 5 6", "9", "4 4"]
    ids = [ckpt.tokenizers.source.encode(t) for t in texts]
    together = decode_texts(ckpt.model, ids, DecodingConfig(), batch_size=2)
    alone = [decode_texts(ckpt.model, [i], DecodingConfig())[0] for i in ids]
    assert [r[0].ids for r in together] == [r[0].ids for r in alone]


def test_streamed_tokens_equal_the_batch_output(ckpt: Checkpoint) -> None:
    src = ckpt.tokenizers.source.encode("2 7 1 8")
    config = DecodingConfig(temperature=3.0, seed=4, num_samples=3)
    batch = decode_texts(ckpt.model, [src], config)[0]
    for sample in range(3):
        assert list(stream_tokens(ckpt.model, src, config, sample=sample)) == batch[sample].ids
    with pytest.raises(ConfigError, match="beam"):
        list(stream_tokens(ckpt.model, src, DecodingConfig(beam_size=2)))


def test_explain_replays_every_step(ckpt: Checkpoint) -> None:
    src = ckpt.tokenizers.source.encode("3 1 4")
    config = DecodingConfig(temperature=0.7, top_k=1, seed=0)
    hyp = decode_texts(ckpt.model, [src], config)[0][0]
    steps = explain(ckpt.model, src, hyp, config, top=3)
    assert [s.token for s in steps] == [*hyp.ids, EOS_ID]
    for step, logp in zip(steps, hyp.token_logprobs, strict=True):
        assert list(step.probs) == ["model", "T=0.7", "top-k 1"]
        assert step.probs["model"] == pytest.approx(math.exp(logp), abs=1e-4)
        assert step.probs["top-k 1"] == pytest.approx(1.0)  # one token left: certain
        assert step.alternatives[0] == (step.token, pytest.approx(1.0))
        assert len(step.source) == 3 and 0 < sum(w for _, w in step.source) <= 1 + 1e-5
        assert all(0 <= j < len(src) for j, _ in step.source)
