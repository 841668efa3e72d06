"""The encoder-decoder: positions, masking, weight tying, caching, parameter counts."""

from __future__ import annotations

import math

import pytest
import torch

from tformer.config import ModelConfig, preset
from tformer.data.tokenizer import BOS_ID, PAD_ID
from tformer.decoding.sampling import DecodingConfig, decode
from tformer.model import Transformer
from tformer.model.attention import FoldedSource, KVCache, MultiHeadAttention
from tformer.model.layers import DecoderLayer, sinusoidal_positions
from tformer.model.transformer import DecoderCache


def tiny(**overrides: object) -> ModelConfig:
    values = dict(
        src_vocab_size=50,
        tgt_vocab_size=50,
        d_model=32,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=64,
        dropout=0.0,
        max_len=32,
    )
    values.update(overrides)
    return ModelConfig(**values)  # type: ignore[arg-type]


def test_sinusoidal_positions_hand_computed() -> None:
    table = sinusoidal_positions(10, 6)
    for pos in (0, 1, 7):
        for i in range(3):
            angle = pos / 10000 ** (2 * i / 6)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_embeddings_are_scaled_by_sqrt_d_model() -> None:
    model = Transformer(tiny()).eval()
    ids = torch.tensor([[4, 5]])
    emb = model.encoder.embedding
    torch.testing.assert_close(emb(ids), emb.weight[ids] * math.sqrt(32))


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_forward_shapes(norm: str) -> None:
    model = Transformer(tiny(norm=norm)).eval()
    src = torch.randint(4, 50, (3, 7))
    tgt = torch.randint(4, 50, (3, 5))
    out = model(src, tgt, need_weights=True)
    assert out.logits.shape == (3, 5, 50)
    maps = out.attentions
    assert maps is not None and len(maps.encoder) == len(maps.cross) == 2
    assert maps.encoder[0].shape == (3, 4, 7, 7)
    assert maps.decoder[0].shape == (3, 4, 5, 5)
    assert maps.cross[0].shape == (3, 4, 5, 7)
    torch.testing.assert_close(out.logits, model(src, tgt).logits, atol=1e-5, rtol=1e-5)


def test_tied_embeddings_are_one_matrix() -> None:
    model = Transformer(tiny())
    assert model.encoder.embedding is model.decoder.embedding
    assert model.output_projection is None
    untied = Transformer(tiny(tie_embeddings=False, share_embeddings=False, tgt_vocab_size=60))
    assert untied.output_projection is not None
    assert untied.encoder.embedding is not untied.decoder.embedding


def test_padding_is_never_attended() -> None:
    model = Transformer(tiny()).eval()
    src = torch.tensor([[5, 6, 7, PAD_ID, PAD_ID]])
    other = src.clone()
    other[0, 3:] = torch.tensor([9, 10])  # change what sits under the padding...
    tgt = torch.tensor([[BOS_ID, 8, 9]])
    a = model(src, tgt).logits
    # ...the unpadded source gives the same logits as the padded one.
    b = model(src[:, :3], tgt).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a, model(other, tgt).logits)


def test_decoder_never_sees_the_future() -> None:
    model = Transformer(tiny()).eval()
    src = torch.tensor([[5, 6, 7]])
    a = model(src, torch.tensor([[BOS_ID, 8, 9, 10]])).logits
    b = model(src, torch.tensor([[BOS_ID, 8, 30, 31]])).logits
    torch.testing.assert_close(a[:, :2], b[:, :2])
    assert not torch.allclose(a[:, 2:], b[:, 2:])


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_cached_decoding_matches_full_forward(
    norm: str, activation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cached inference steps take DecoderLayer.step, the lean copy of forward's maths: count
    # its calls, so this comparison is known to hold that path against the full forward.
    calls = []
    lean_step = DecoderLayer.step
    monkeypatch.setattr(
        DecoderLayer, "step", lambda self, *a, **k: calls.append(1) or lean_step(self, *a, **k)
    )
    model = Transformer(tiny(norm=norm, activation=activation)).eval()
    src = torch.tensor([[5, 6, 7, 8], [9, 10, PAD_ID, PAD_ID]])
    tgt = torch.tensor([[BOS_ID, 11, 12, 13, 14], [BOS_ID, 15, 16, 17, 18]])
    full = model(src, tgt).logits
    cache = model.new_cache()
    stepped = cached_logits(model, src, tgt, cache)
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)
    assert cache.length == tgt.size(1)
    assert len(calls) == tgt.size(1) * model.config.n_decoder_layers


def cached_logits(
    model: Transformer, src: torch.Tensor, tgt: torch.Tensor, cache: DecoderCache | None = None
) -> torch.Tensor:
    """Logits of ``tgt`` decoded one cached step at a time (into ``cache`` when given)."""
    encoded = model.encode(src)
    cache = model.new_cache() if cache is None else cache
    steps = [
        model.decode(tgt[:, t : t + 1], encoded, cache=cache).logits for t in range(tgt.size(1))
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
    model = Transformer(tiny()).eval()
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
    model = randomise_biases(Transformer(tiny(norm=norm)).eval())
    src = torch.tensor([src_ids])
    tgt = torch.tensor([[BOS_ID, 11, 12, 13, 14]])
    cache = model.new_cache()
    with torch.inference_mode():
        stepped = cached_logits(model, src, tgt, cache)
        torch.testing.assert_close(stepped, model(src, tgt).logits)
    assert all((layer.cross_attn.folded is not None) == folded for layer in cache.layers)


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
    model = randomise_biases(Transformer(tiny()))
    src = torch.tensor([[5, 6, 7, 8, 9]])
    rows_folded: list[int] = []
    folded_step = MultiHeadAttention.folded_cross_step

    def counted(self: MultiHeadAttention, query: torch.Tensor, *args: object) -> torch.Tensor:
        rows_folded.append(query.size(0))
        return folded_step(self, query, *args)

    monkeypatch.setattr(MultiHeadAttention, "folded_cross_step", counted)
    folded = decode(model, src, config)[0]
    assert max(rows_folded) > 1  # several rows went through the folded path
    monkeypatch.setattr(MultiHeadAttention, "folding_pays", lambda *args: False)
    unfolded = decode(model, src, config)[0]
    assert [h.ids for h in folded] == [h.ids for h in unfolded]
    for f, u in zip(folded, unfolded, strict=True):
        assert f.token_logprobs == pytest.approx(u.token_logprobs, abs=1e-5)


def test_a_cross_attention_cache_knows_when_its_rows_hold_one_source() -> None:
    k = torch.randn(2, 4, 5, 8)
    cache = KVCache()
    cache.set(k, k)
    cache.reorder(torch.tensor([1, 0, 1]))
    assert not cache.one_source  # two sources, reordered
    cache.set(k[:1], k[:1])
    assert cache.one_source
    cache.folded = FoldedSource(k, k, k, heads=4, length=5)
    cache.reorder(torch.tensor([0, 0, 0, 0]))  # expanded to four beams: its folded matrices hold
    assert cache.one_source and cache.folded is not None
    torch.testing.assert_close(cache.k, k[[0, 0, 0, 0]])
    cache.set(k, k)  # a new batch
    assert not cache.one_source and cache.folded is None


def test_cross_attention_is_not_folded_for_several_rows_or_with_gradients() -> None:
    model = Transformer(tiny()).eval()
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    tgt = torch.tensor([[BOS_ID], [BOS_ID]])
    for rows, grad in ((2, False), (1, True)):
        cache = model.new_cache()
        with torch.set_grad_enabled(grad):
            model.decode(tgt[:rows], model.encode(src[:rows]), cache=cache)
        assert all(layer.cross_attn.folded is None for layer in cache.layers)


def test_cached_steps_in_training_mode_keep_dropout() -> None:
    # The lean step has no dropout, so a model in training mode must not take it: with
    # dropout on, two identical cached steps then differ, as the full forward's would.
    model = Transformer(tiny(dropout=0.5)).train()
    src = torch.tensor([[5, 6, 7, 8]])
    encoded = model.encode(src)
    first, second = (
        model.decode(torch.tensor([[BOS_ID]]), encoded, cache=model.new_cache()).logits
        for _ in range(2)
    )
    assert not torch.allclose(first, second)


def test_base_preset_has_the_papers_parameter_count() -> None:
    # The paper reports 65M parameters for the base model with a ~37k shared vocabulary.
    model = Transformer(preset("base", src_vocab_size=37000, tgt_vocab_size=37000))
    counts = model.parameter_counts()
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert 60e6 < counts["total"] < 66e6
    assert counts["embeddings"] == 37000 * 512
    assert counts["encoder"] + counts["decoder"] + counts["embeddings"] == counts["total"]


def test_position_limit_is_enforced() -> None:
    model = Transformer(tiny(max_len=4)).eval()
    with pytest.raises(ValueError, match="max_len"):
        model(torch.tensor([[5, 6, 7, 8, 9]]), torch.tensor([[BOS_ID]]))


@pytest.mark.parametrize("tied", [True, False])
def test_inference_projection_layout_matches_training_and_follows_weight_updates(
    tied: bool,
) -> None:
    # CPU inference multiplies by a cached (D, V) copy of the output matrix; it must give the
    # training path's logits, stay out of the state dict, and be remade when weights change.
    model = Transformer(tiny(tie_embeddings=tied)).eval()
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
