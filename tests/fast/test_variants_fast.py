"""Every architecture variant through the speed-ups: the lean cached step (with folded
cross-attention for one source), beam search and sampling, and int8 decoding.

Accelerated must equal plain for each variant, as ``test_fast.py`` holds for the paper's model.
"""

from __future__ import annotations

import pytest
import torch

from tests.fast.test_fast import cached_logits, randomise_biases
from tests.model.test_model import tiny
from tformer.config import BOS_ID, PAD_ID
from tformer.decoding.api import decode
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.steppers import CachedStepper, RecomputeStepper
from tformer.fast.accelerate import accelerate, plain
from tformer.fast.attention import FoldingKVCache
from tformer.fast.int8 import quantize_int8
from tformer.fast.step import LeanStep
from tformer.model import Transformer, build_model
from tformer.model.layers import DecoderLayer

VARIANTS = {
    "learned": dict(positions="learned"),
    "rope": dict(positions="rope"),
    "gqa2": dict(kv_heads=2),
    "mqa": dict(kv_heads=1),
    "swiglu": dict(activation="swiglu"),
    "geglu": dict(activation="geglu"),
    "rmsnorm": dict(normalization="rmsnorm"),
    "marian": dict(activation="silu", output_bias=True, source_eos=True),
    "all-pre": dict(positions="rope", kv_heads=2, activation="swiglu",
                    normalization="rmsnorm", norm="pre"),
    "gpt2-bert": dict(activation="gelu_tanh", embedding_scale=False, norm_eps=1e-12,
                      embedding_norm=True, segment_embedding=True, positions="learned",
                      norm="pre", output_bias=True),
    # T5 (v1.0 and v1.1): relative position bias, unscaled scores, bias-free layers, pre-norm
    # RMSNorm, unscaled embeddings, the output rescaled before the tied projection
    "t5": dict(positions="relative", attention_scale=False, linear_bias=False, norm="pre",
               normalization="rmsnorm", norm_eps=1e-6, embedding_scale=False,
               output_scale=True, source_eos=True, relative_buckets=8,
               relative_max_distance=20),
    "t5-v1.1": dict(positions="relative", attention_scale=False, linear_bias=False,
                    norm="pre", normalization="rmsnorm", norm_eps=1e-6, embedding_scale=False,
                    activation="geglu_tanh", d_ff=96, relative_buckets=8,
                    relative_max_distance=20),
}  # fmt: skip
# GPT-2's variants on a decoder-only model (the family they come with).
GPT2 = dict(arch="decoder-only", activation="gelu_tanh", embedding_scale=False, norm_eps=1e-5,
            positions="learned", norm="pre", output_bias=True)  # fmt: skip


def variant_model(name: str) -> Transformer:
    torch.manual_seed(0)
    config = tiny(**VARIANTS[name]) if name in VARIANTS else tiny(**GPT2)
    model = randomise_biases(build_model(config))
    with torch.no_grad():
        for key, parameter in model.named_parameters():
            if key.endswith("segment"):  # zeros to start: give it something to add
                parameter.normal_(std=0.5)
    return model.eval()


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("rows", [1, 2])
def test_lean_cached_steps_equal_the_full_forward(
    name: str, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    lean_step = DecoderLayer.step
    monkeypatch.setattr(
        DecoderLayer, "step", lambda self, *a, **k: calls.append(1) or lean_step(self, *a, **k)
    )
    model = variant_model(name)
    src = torch.tensor([[5, 6, 7, 8], [9, 10, PAD_ID, PAD_ID]])[:rows]
    tgt = torch.tensor([[BOS_ID, 11, 12, 13, 14], [BOS_ID, 15, 16, 17, 18]])[:rows]
    with torch.inference_mode():
        full = model(src, tgt).logits
        torch.testing.assert_close(cached_logits(model, src, tgt), full, atol=1e-5, rtol=1e-5)
        accelerate(model)
        torch.testing.assert_close(model(src, tgt).logits, full, atol=1e-5, rtol=1e-5)
        cache = model.new_cache()
        stepped = cached_logits(model, src, tgt, cache)
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)
    assert len(calls) == tgt.size(1) * model.config.n_decoder_layers  # the lean path ran
    folded = [
        isinstance(c.cross_attn, FoldingKVCache) and c.cross_attn.folded is not None
        for c in cache.layers
    ]
    assert folded == [rows == 1] * len(folded)  # one source: cross-attention folded
    kv = cache.layers[0].self_attn.k
    assert kv is not None and kv.size(1) == model.config.n_kv_heads  # only G heads cached


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize(
    "config",
    [
        DecodingConfig(beam_size=3, n_best=2, max_new_tokens=6),
        DecodingConfig(temperature=1.0, num_samples=2, seed=7, max_new_tokens=6),
        DecodingConfig(max_new_tokens=6, use_cache=False),
    ],
    ids=["beam", "samples", "uncached"],
)
def test_accelerated_decoding_equals_plain(name: str, config: DecodingConfig) -> None:
    model = variant_model(name)
    src = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, PAD_ID, PAD_ID]])
    want = decode(model, src, config)
    got = decode(accelerate(model), src, config)
    cached = decode(plain(model), src, DecodingConfig(max_new_tokens=6))
    for got_row, want_row in zip(got, want, strict=True):
        assert [h.ids for h in got_row] == [h.ids for h in want_row]
        for g, w in zip(got_row, want_row, strict=True):
            assert g.token_logprobs == pytest.approx(w.token_logprobs, abs=1e-4)
    if not config.use_cache:  # greedy without the cache equals greedy with it
        assert [[h.ids for h in row] for row in cached] == [[h.ids for h in row] for row in want]


@pytest.mark.parametrize("name", [*VARIANTS, "gpt2"])  # gpt2: decoder-only, no cross-attention
def test_int8_lean_steps_stay_within_the_int8_forwards_error(name: str) -> None:
    reference = variant_model(name)
    model = quantize_int8(variant_model(name))
    assert isinstance(model, LeanStep)  # decoding takes the lean step, GPT-2's too
    src = torch.tensor([[5, 6, 7, 8]])
    errors = {"lean": 0.0, "forward": 0.0}
    with torch.inference_mode():
        encoded = model.encode(src)
        lean, forward = CachedStepper(model, encoded), RecomputeStepper(model, encoded)
        exact = RecomputeStepper(reference, reference.encode(src))
        tokens = torch.full((1,), BOS_ID)
        for _ in range(5):
            want = exact.step(tokens)
            for key, stepper in (("lean", lean), ("forward", forward)):
                errors[key] = max(errors[key], float((stepper.step(tokens) - want).abs().max()))
            tokens = want.argmax(-1)
    assert 0 < errors["lean"] <= 2 * errors["forward"] + 0.02, errors
    assert errors["forward"] < 0.5, errors


@pytest.mark.parametrize("name", VARIANTS)
def test_bf16_cpu_training_steps_of_accelerated_and_plain_agree(name: str) -> None:
    # Accelerated, bf16 CPU training writes attention out (the faster backward there) and
    # draws dropout masks its own way: with dropout off, loss and gradients match plain.
    src = torch.tensor([[5, 6, 7, 8], [9, 10, PAD_ID, PAD_ID]])
    tgt = torch.tensor([[BOS_ID, 11, 12, 13], [BOS_ID, 15, 16, 17]])
    results = []
    for fast in (False, True):
        model = variant_model(name).train()
        if fast:
            accelerate(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(src, tgt).logits.float().logsumexp(-1).mean()
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((loss.detach(), grads))
    (plain_loss, plain_grads), (fast_loss, fast_grads) = results
    assert torch.isfinite(fast_grads).all()
    torch.testing.assert_close(fast_loss, plain_loss, atol=2e-2, rtol=2e-2)
    cosine = torch.nn.functional.cosine_similarity(fast_grads, plain_grads, dim=0)
    assert cosine > 0.99, float(cosine)

