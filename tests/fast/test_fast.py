"""The speed-ups of tformer.fast swapped into a model: same state dict, same outputs.

The lean cached step (with folded cross-attention for one source) and the inference
projection are held against the paper's full forward, which ``tformer.model`` computes.
"""

from __future__ import annotations

import pytest
import torch

from tests.model.test_model import tiny
from tformer.config import BOS_ID, PAD_ID, ModelConfig
from tformer.decoding.api import decode
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.steppers import CachedStepper
from tformer.fast.accelerate import accelerate, is_accelerated, plain
from tformer.fast.attention import FastMultiHeadAttention, FoldedSource, FoldingKVCache
from tformer.fast.step import FastTransformer
from tformer.model import DecoderCache, MultiHeadAttention, Transformer
from tformer.model.layers import DecoderLayer


def accelerated(config: ModelConfig) -> FastTransformer:
    return accelerate(Transformer(config))


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_cached_decoding_matches_full_forward(
    norm: str, activation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lean steps take DecoderLayer.step, the one-position form of forward's maths: count its
    # calls, so this comparison is known to hold that path against the full forward; the
    # paper's own cached decode (a plain model) must agree too.
    calls = []
    lean_step = DecoderLayer.step
    monkeypatch.setattr(
        DecoderLayer,
        "step",
        lambda self, *a, **k: calls.append(1) or lean_step(self, *a, **k),
    )
    torch.manual_seed(0)
    model = Transformer(tiny(norm=norm, activation=activation)).eval()
    src = torch.tensor([[5, 6, 7, 8], [9, 10, PAD_ID, PAD_ID]])
    tgt = torch.tensor([[BOS_ID, 11, 12, 13, 14], [BOS_ID, 15, 16, 17, 18]])
    full = model(src, tgt).logits
    torch.testing.assert_close(cached_logits(model, src, tgt), full, atol=1e-5, rtol=1e-5)
    assert not calls
    accelerate(model)
    torch.testing.assert_close(model(src, tgt).logits, full, atol=1e-5, rtol=1e-5)
    cache = model.new_cache()
    stepped = cached_logits(model, src, tgt, cache)
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)
    assert cache.length == tgt.size(1)
    assert len(calls) == tgt.size(1) * model.config.n_decoder_layers


def cached_logits(
    model: Transformer, src: torch.Tensor, tgt: torch.Tensor, cache: DecoderCache | None = None
) -> torch.Tensor:
    """Logits of ``tgt`` decoded one cached step at a time (into ``cache`` when given): lean
    steps for an accelerated model in eval mode, the paper's cached ``decode`` otherwise."""
    encoded = model.encode(src)
    cache = model.new_cache() if cache is None else cache
    lean = isinstance(model, FastTransformer) and not model.training
    steps = [
        model.step(tgt[:, t : t + 1], encoded.memory, encoded.mask, cache)
        if lean
        else model.decode(tgt[:, t : t + 1], encoded, cache=cache).logits
        for t in range(tgt.size(1))
    ]
    return torch.cat(steps, dim=1)


def randomise_biases(model: Transformer) -> Transformer:
    """Biases start at zero; folded cross-attention must get them right too."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(std=0.5)
    return model


def test_fused_step_projection_follows_weight_updates_and_stays_out_of_the_state_dict() -> None:
    # The cached step projects queries, keys and values with one stacked copy of W^Q and the
    # key/value weight: an in-place update of either must reach it, and the checkpoint
    # keeps the separate projections.
    torch.manual_seed(0)
    model = accelerated(tiny()).eval()
    keys = set(model.state_dict())
    src = torch.tensor([[5, 6, 7, 8]])
    tgt = torch.tensor([[BOS_ID, 11, 12, 13]])
    with torch.inference_mode():
        torch.testing.assert_close(cached_logits(model, src, tgt), model(src, tgt).logits)
        before = cached_logits(model, src, tgt)
    attention = model.decoder.layers[0].self_attn
    with torch.no_grad():
        attention.q_proj.weight.mul_(1.5)
        attention.kv_proj.bias.add_(0.25)
    with torch.inference_mode():
        after = cached_logits(model, src, tgt)
        torch.testing.assert_close(after, model(src, tgt).logits)
    assert not torch.allclose(before, after)
    assert set(model.state_dict()) == keys


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize(
    ("src_ids", "folded"),
    [
        ([5, 6, 7, 8], True),
        ([5, 6, 7, PAD_ID, PAD_ID], True),  # a padded source: the folded scores are masked
        (list(range(5, 15)), True),  # 10 tokens: 10 x (4 - 1) < 32 = D
        (list(range(5, 16)), False),  # 11 tokens: folding would read more than it saves
    ],
)
def test_folded_cross_attention_equals_the_full_forward(
    norm: str, src_ids: list[int], folded: bool
) -> None:
    # At batch 1, cross-attention steps fold W^Q into the source's keys and W^O into its
    # values; the logits must be the full forward's, padding included.
    torch.manual_seed(0)
    model = randomise_biases(accelerated(tiny(norm=norm)).eval())
    src = torch.tensor([src_ids])
    tgt = torch.tensor([[BOS_ID, 11, 12, 13, 14]])
    cache = model.new_cache()
    with torch.inference_mode():
        stepped = cached_logits(model, src, tgt, cache)
        torch.testing.assert_close(stepped, model(src, tgt).logits)
    assert all(
        isinstance(layer.cross_attn, FoldingKVCache)
        and (layer.cross_attn.folded is not None) == folded
        for layer in cache.layers
    )


@pytest.mark.parametrize(
    "config",
    [
        DecodingConfig(beam_size=4, n_best=4, max_new_tokens=8),
        DecodingConfig(temperature=1.0, num_samples=3, seed=7, max_new_tokens=8),
    ],
    ids=["beam", "samples"],
)
def test_beams_and_samples_of_one_source_decode_through_folded_cross_attention(
    config: DecodingConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rows of a single source's beams or samples are copies of one source: they share
    # its folded matrices, and decode exactly as with unfolded cross-attention.
    model = randomise_biases(accelerated(tiny()))
    src = torch.tensor([[5, 6, 7, 8, 9]])
    rows_folded: list[int] = []
    folded_step = FastMultiHeadAttention.folded_cross_step

    def counted(self: FastMultiHeadAttention, query: torch.Tensor, *args: object) -> torch.Tensor:
        rows_folded.append(query.size(0))
        return folded_step(self, query, *args)

    monkeypatch.setattr(FastMultiHeadAttention, "folded_cross_step", counted)
    folded = decode(model, src, config)[0]
    assert max(rows_folded) > 1  # several rows went through the folded path
    monkeypatch.setattr(FastMultiHeadAttention, "folding_pays", lambda *args: False)
    unfolded = decode(model, src, config)[0]
    assert [h.ids for h in folded] == [h.ids for h in unfolded]
    for f, u in zip(folded, unfolded, strict=True):
        assert f.token_logprobs == pytest.approx(u.token_logprobs, abs=1e-5)


def test_a_cross_attention_cache_knows_when_its_rows_hold_one_source() -> None:
    k = torch.randn(2, 4, 5, 8)
    cache = FoldingKVCache()
    cache.set(k, k)
    cache.reorder(torch.tensor([1, 0, 1]))
    assert not cache.one_source  # two sources, reordered
    cache.set(k[:1], k[:1])
    assert cache.one_source
    cache.folded = FoldedSource(k, k, k, k, heads=4, length=5)
    cache.reorder(torch.tensor([0, 0, 0, 0]))  # expanded to four beams: its folded matrices hold
    assert cache.one_source and cache.folded is not None
    torch.testing.assert_close(cache.k, k[[0, 0, 0, 0]])
    cache.set(k, k)  # a new batch
    assert not cache.one_source and cache.folded is None


def test_cross_attention_is_not_folded_for_several_rows_or_with_gradients() -> None:
    model = accelerated(tiny()).eval()
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    tgt = torch.tensor([[BOS_ID], [BOS_ID]])
    for rows, grad in ((2, False), (1, True)):
        cache = model.new_cache()
        with torch.set_grad_enabled(grad):
            encoded = model.encode(src[:rows])
            model.step(tgt[:rows], encoded.memory, encoded.mask, cache)
        assert all(
            isinstance(layer.cross_attn, FoldingKVCache) and layer.cross_attn.folded is None
            for layer in cache.layers
        )


def test_cached_steps_in_training_mode_keep_dropout() -> None:
    # The lean step has no dropout, so a model in training mode must not take it: with
    # dropout on, two identical cached steps then differ, as the full forward's would.
    model = accelerated(tiny(dropout=0.5)).train()
    src = torch.tensor([[5, 6, 7, 8]])
    encoded = model.encode(src)
    first, second = (CachedStepper(model, encoded).step(torch.tensor([BOS_ID])) for _ in range(2))
    assert not torch.allclose(first, second)


def test_accelerate_keeps_the_state_dict_and_outputs_and_plain_undoes_it() -> None:
    torch.manual_seed(0)
    reference = Transformer(tiny(tie_embeddings=False, share_embeddings=False)).eval()
    model = Transformer(tiny(tie_embeddings=False, share_embeddings=False)).eval()
    model.load_state_dict(reference.state_dict())
    params = {name: p.data_ptr() for name, p in model.named_parameters()}
    src = torch.tensor([[5, 6, 7, 8], [9, 10, PAD_ID, PAD_ID]])
    tgt = torch.tensor([[BOS_ID, 11, 12], [BOS_ID, 15, 16]])
    assert not is_accelerated(model)
    assert accelerate(model) is model and is_accelerated(model)
    assert accelerate(model) is model  # idempotent
    assert isinstance(model.decoder.layers[0].cross_attn, FastMultiHeadAttention)
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == params
    assert model.state_dict().keys() == reference.state_dict().keys()
    with torch.inference_mode():
        want = reference(src, tgt).logits
        torch.testing.assert_close(model(src, tgt).logits, want, atol=1e-5, rtol=1e-5)
        decoded = decode(model, src, DecodingConfig(max_new_tokens=6))
    plain(model)
    assert not is_accelerated(model)
    assert all(
        type(m).__module__.startswith(("torch.", "tformer.model")) for m in model.modules()
    )
    assert not any("_packed_weight" in m.__dict__ or "_qkv" in m.__dict__ for m in model.modules())
    assert [h.ids for h in decode(model, src, DecodingConfig(max_new_tokens=6))[0]] == [
        h.ids for h in decoded[0]
    ]


@pytest.mark.parametrize("tied", [True, False])
def test_inference_projection_layout_matches_training_and_follows_weight_updates(
    tied: bool,
) -> None:
    # CPU inference multiplies by a cached (D, V) copy of the output matrix; it must give the
    # training path's logits, stay out of the state dict, and be remade when weights change.
    model = accelerated(tiny(tie_embeddings=tied)).eval()
    hidden = torch.randn(3, 5, 32)
    reference = model.project(hidden)  # autograd on: the plain F.linear path
    with torch.no_grad():
        fast = model.project(hidden)
        torch.testing.assert_close(fast, reference.detach(), rtol=1e-5, atol=1e-5)
        assert not any("transposed" in key for key in model.state_dict())
        weight = (
            model.decoder.embedding.weight if tied else model.output_projection.weight  # type: ignore[union-attr]
        )
        weight.mul_(2.0)  # an in-place update, as an optimizer step or load_state_dict makes
        torch.testing.assert_close(model.project(hidden), 2 * fast, rtol=1e-5, atol=1e-5)
        model.load_state_dict(Transformer(tiny(tie_embeddings=tied)).state_dict())
        expected = torch.nn.functional.linear(hidden, weight)
        torch.testing.assert_close(model.project(hidden), expected, rtol=1e-5, atol=1e-5)


def test_only_accelerated_attention_leaves_the_fused_kernel_for_bf16_cpu_training() -> None:
    x = torch.randn(1, 1, 2, 4, requires_grad=True).to(torch.bfloat16)
    plain_attention = MultiHeadAttention(8, 2)
    assert plain_attention.fused_kernel(x, x)  # the paper's module: one kernel everywhere
    fast_attention = accelerate(Transformer(tiny())).decoder.layers[0].self_attn
    assert isinstance(fast_attention, FastMultiHeadAttention)
    assert not fast_attention.fused_kernel(x, x)
    assert fast_attention.fused_kernel(x.detach(), x.detach())
