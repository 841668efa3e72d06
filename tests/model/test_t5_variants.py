"""T5's variants (Raffel et al. 2020), each against an independent reference.

The relative position buckets against transformers' ``T5Attention._relative_position_bucket``
and against the rule written out for small offsets; biased, unscaled attention against
softmax(Q Kᵀ + bias) V written out; bias-free layers and the output rescaling by their
parameters and the formula; cached decoding against the full forward (plain and accelerated).
T5's checkpoints end to end in tests/imports/test_t5.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.fast.test_fast import cached_logits
from tests.model.test_model import tiny
from tformer.config import BOS_ID, PAD_ID
from tformer.decoding.api import decode
from tformer.decoding.settings import DecodingConfig
from tformer.errors import ConfigError
from tformer.fast.accelerate import accelerate
from tformer.fast.int8 import quantize_int8
from tformer.fast.step import LeanStep
from tformer.model import Transformer, build_model
from tformer.model.attention import scaled_dot_product_attention
from tformer.model.layers import DecoderLayer
from tformer.model.positions import RelativePositionBias, relative_bucket

# Every T5 variant at once, on the paper's encoder-decoder.
T5 = dict(positions="relative", relative_buckets=8, relative_max_distance=16,
          attention_scale=False, linear_bias=False, normalization="rmsnorm", norm="pre",
          embedding_scale=False, output_scale=True)  # fmt: skip


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("buckets", "max_distance"), [(8, 16), (32, 128)])
def test_relative_buckets_are_t5s(bidirectional: bool, buckets: int, max_distance: int) -> None:
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    offsets = torch.arange(-300, 301)
    want = t5.T5Attention._relative_position_bucket(
        offsets, bidirectional=bidirectional, num_buckets=buckets, max_distance=max_distance
    )
    got = relative_bucket(
        offsets, bidirectional=bidirectional, buckets=buckets, max_distance=max_distance
    )
    assert torch.equal(got, want)


def test_small_offsets_have_a_bucket_each() -> None:
    offsets = torch.arange(-3, 4)
    # Bidirectional, 16 buckets: 8 a side, the first 4 exact; keys after the query from 8.
    both = relative_bucket(offsets, bidirectional=True, buckets=16, max_distance=32)
    assert both.tolist() == [3, 2, 1, 0, 9, 10, 11]
    # Causal, 8 buckets: distance back to the key, exact up to 3; later keys all in bucket 0.
    causal = relative_bucket(offsets, bidirectional=False, buckets=8, max_distance=32)
    assert causal.tolist() == [3, 2, 1, 0, 0, 0, 0]


def test_the_bias_starts_at_the_cache_offset() -> None:
    bias = RelativePositionBias(tiny(**T5), bidirectional=False)
    whole = bias(6, 6)  # (1, H, 6, 6)
    torch.testing.assert_close(bias(2, 6, start=4), whole[:, :, 4:])
    row = bias.table.weight[relative_bucket(torch.arange(6) - 3, bidirectional=False,
                                            buckets=8, max_distance=16)]  # fmt: skip
    torch.testing.assert_close(whole[0, :, 3], row.T)


@pytest.mark.parametrize("fused", [True, False])
def test_biased_unscaled_attention_is_the_formula(fused: bool) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(1, 3, 5, 5, dtype=torch.float64)
    mask = torch.tensor([True, True, True, False, False])[None, None, None].expand(2, 1, 1, 5)
    scores = q @ k.transpose(-2, -1) + bias
    scores = scores.masked_fill(~mask, float("-inf"))
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    want_causal = (scores.masked_fill(~causal, float("-inf")).softmax(-1)) @ v
    want = scores.softmax(-1) @ v
    got, _ = scaled_dot_product_attention(q, k, v, mask, bias=bias, scale=1.0, fused=fused)
    torch.testing.assert_close(got, want)
    got, _ = scaled_dot_product_attention(
        q, k, v, mask, bias=bias, scale=1.0, fused=fused, causal=True
    )
    torch.testing.assert_close(got, want_causal)


def test_t5_layers_have_no_biases_and_the_bias_table_is_per_stack() -> None:
    model = Transformer(tiny(**T5))
    names = [name for name, _ in model.named_parameters()]
    assert not [n for n in names if n.endswith(".bias")]
    assert [n for n in names if "relative" in n] == [
        "encoder.relative.table.weight",
        "decoder.relative.table.weight",
    ]
    assert model.encoder.relative is not None and model.encoder.relative.bidirectional
    assert model.decoder.relative is not None and not model.decoder.relative.bidirectional


def test_output_scale_multiplies_the_final_norm_by_d_model_to_the_minus_half() -> None:
    torch.manual_seed(0)
    rescaled = Transformer(tiny(**T5)).eval()
    unscaled = Transformer(tiny(**{**T5, "output_scale": False})).eval()
    unscaled.load_state_dict(rescaled.state_dict())
    src, tgt = torch.tensor([[5, 6, 7]]), torch.tensor([[BOS_ID, 8, 9]])
    with torch.no_grad():
        encoded = unscaled.encode(src)
        hidden = unscaled.decoder(tgt, encoded.memory, encoded.mask)[0]
        want = hidden * 32**-0.5 @ unscaled.output_weight().T
        torch.testing.assert_close(rescaled(src, tgt).logits, want)


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder-only"])
def test_relative_positions_decode_cached_as_uncached(arch: str) -> None:
    torch.manual_seed(0)
    model = build_model(tiny(**T5, arch=arch)).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # the bias tables start near zero: make them matter
            parameter.normal_(std=0.5)
    src = torch.tensor([[5, 6, 7, 8], [9, 10, PAD_ID, PAD_ID]])
    tgt = torch.tensor([[BOS_ID, 11, 12, 13, 14], [BOS_ID, 15, 16, 17, 18]])
    with torch.inference_mode():
        full = model(src, tgt).logits
        torch.testing.assert_close(cached_logits(model, src, tgt), full, atol=1e-5, rtol=1e-5)
        accelerate(model)  # the lean step, with the relative bias at the cache's offset
        greedy = DecodingConfig(max_new_tokens=6)
        cached = decode(model, src, greedy)
        uncached = decode(model, src, DecodingConfig(max_new_tokens=6, use_cache=False))
        beams = decode(model, src, DecodingConfig(beam_size=3, max_new_tokens=6))
        beams_uncached = decode(
            model, src, DecodingConfig(beam_size=3, max_new_tokens=6, use_cache=False)
        )
    assert [[h.ids for h in row] for row in cached] == [[h.ids for h in row] for row in uncached]
    assert [[h.ids for h in row] for row in beams] == [
        [h.ids for h in row] for row in beams_uncached
    ]


def test_int8_decodes_the_t5_variants_on_the_lean_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """T5's variants quantise (bias-free int8 layers) and decode on the lean step, its
    relative bias and unscaled scores included; tests/fast/test_variants_fast.py holds the
    int8 steps within the int8 forward's own error."""
    torch.manual_seed(0)
    model = quantize_int8(Transformer(tiny(**T5)).eval())
    assert isinstance(model, LeanStep)
    steps = []
    lean = DecoderLayer.step
    monkeypatch.setattr(
        DecoderLayer, "step", lambda self, *a, **k: steps.append(1) or lean(self, *a, **k)
    )
    with torch.inference_mode():
        out = decode(model, torch.tensor([[5, 6, 7, 8]]), DecodingConfig(max_new_tokens=6))
    assert out[0][0].ids and steps  # decoded, one lean step per layer and token


def test_bad_relative_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="--relative-buckets 1 must be >= 2"):
        tiny(**{**T5, "relative_buckets": 1})


@pytest.mark.parametrize("to", ["ctranslate2"])  # --to huggingface writes a T5 model
def test_exports_refuse_the_t5_variants_naming_them(to: str) -> None:
    from tformer.export.api import check_variants

    with pytest.raises(ConfigError) as refused:
        check_variants(tiny(**T5), to)
    message = str(refused.value)
    assert "\n" not in message
    for named in ("--positions relative", "--no-attention-scale", "--no-linear-bias",
                  "--output-scale"):  # fmt: skip
        assert named in message
