"""Logit processors, the cached decoding loop, and reproducible sampling."""

from __future__ import annotations

import pytest
import torch

from tformer.checkpoint import load_checkpoint
from tformer.decoding import (
    DecodingConfig,
    apply_temperature,
    decode,
    decode_texts,
    top_k_filter,
    top_p_filter,
)
from tformer.errors import ConfigError
from tformer.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tformer.train import TrainResult


def test_temperature_scales_logits_exactly() -> None:
    z = torch.tensor([[1.0, 2.0, 4.0]])
    for t in (0.5, 1.0, 2.0):
        torch.testing.assert_close(apply_temperature(z, t).softmax(-1), (z / t).softmax(-1))


def test_top_k_keeps_the_k_largest_and_ties() -> None:
    z = torch.tensor([[1.0, 5.0, 3.0, 3.0, 0.0]])
    kept = torch.isfinite(top_k_filter(z, 2))[0].tolist()
    assert kept == [False, True, True, True, False]  # the tie at the 2nd value is kept
    assert torch.isfinite(top_k_filter(z, 0)).all()


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    z = probs.log()
    assert torch.isfinite(top_p_filter(z, 0.5))[0].tolist() == [True, False, False, False]
    assert torch.isfinite(top_p_filter(z, 0.7))[0].tolist() == [True, True, False, False]
    assert torch.isfinite(top_p_filter(z, 0.81))[0].tolist() == [True, True, True, False]
    assert torch.isfinite(top_p_filter(z, 1.0)).all()


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"temperature": -1}, "--temperature"),
        ({"top_k": -1}, "--top-k"),
        ({"top_p": 0.0}, "--top-p"),
        ({"top_p": 1.5}, "--top-p"),
        ({"num_samples": 3}, "--num-samples"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        DecodingConfig(**kwargs)


def _full_greedy(model: torch.nn.Module, src: torch.Tensor, steps: int) -> list[list[int]]:
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


def test_cached_greedy_equals_full_recomputation(trained: TrainResult) -> None:
    ckpt = load_checkpoint(trained.run_dir)
    tok = ckpt.tokenizers.source
    texts = ["3 1 4", "1 5 9 2 6 5", "7"]
    from tformer.data import pad

    src = pad([tok.encode(t) for t in texts])  # batched, with padding
    cached = decode(ckpt.model, src, DecodingConfig(max_new_tokens=20))
    assert [h.ids for h in cached] == _full_greedy(ckpt.model, src, 21)
    assert all(h.finished for h in cached)
    # Per-token log-probabilities are the model's; their sum is the score.
    assert all(len(h.token_logprobs) == len(h.ids) + 1 for h in cached)
    assert all(h.score <= 0 for h in cached)


def test_sampling_is_reproducible_with_a_seed(trained: TrainResult) -> None:
    ckpt = load_checkpoint(trained.run_dir)
    src = [ckpt.tokenizers.source.encode("2 7 1 8")] * 4
    config = DecodingConfig(temperature=8.0, seed=11, num_samples=3)
    a = decode_texts(ckpt.model, src, config)
    b = decode_texts(ckpt.model, src, config)
    assert [[h.ids for h in row] for row in a] == [[h.ids for h in row] for row in b]
    c = decode_texts(ckpt.model, src, DecodingConfig(temperature=8.0, seed=12, num_samples=3))
    assert [[h.ids for h in row] for row in a] != [[h.ids for h in row] for row in c]


def test_outputs_come_back_in_input_order(trained: TrainResult) -> None:
    ckpt = load_checkpoint(trained.run_dir)
    texts = ["1 2 3 4 5 6", "9", "4 4"]
    ids = [ckpt.tokenizers.source.encode(t) for t in texts]
    together = decode_texts(ckpt.model, ids, DecodingConfig(), batch_size=2)
    alone = [decode_texts(ckpt.model, [i], DecodingConfig())[0] for i in ids]
    assert [r[0].ids for r in together] == [r[0].ids for r in alone]
