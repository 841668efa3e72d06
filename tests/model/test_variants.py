"""The architecture variants, each against an independent reference built from its paper.

RoPE (Su et al. 2021) against rotation matrices written from its formula and the relative-offset
property; grouped-query attention (Ainslie et al. 2023) against multi-head attention with the
shared key/value weights repeated; SwiGLU / GeGLU (Shazeer 2020) against their formulas;
RMSNorm against ``torch.nn.RMSNorm`` and the formula; learned positions by a round trip.
GPT-2's and BERT's (Radford et al. 2019; Devlin et al. 2019): the tanh GELU, unscaled
embeddings, a segment vector, the layer-norm epsilon, the embedding norm and the masked-LM
head against formulas written out; their checkpoints end to end in tests/imports.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import nn

from tests.model.test_model import tiny
from tformer.config import BOS_ID, PAD_ID, ModelConfig
from tformer.errors import ConfigError
from tformer.model import MultiHeadAttention, Transformer, build_model
from tformer.model.layers import GatedFeedForward, feed_forward, norm_layer
from tformer.model.positions import (
    LearnedPositions,
    RotaryEmbedding,
    rotary_angles,
    rotate,
)


def rotation_matrix(position: int, d_k: int) -> torch.Tensor:
    """RoFormer's R_Θ,m (eq. 13): block-diagonal 2x2 rotations by m·θ_i, θ_i = 10000^(-2i/d)."""
    r = torch.zeros(d_k, d_k, dtype=torch.float64)
    for i in range(d_k // 2):
        angle = position * 10000 ** (-2 * i / d_k)
        c, s = math.cos(angle), math.sin(angle)
        r[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, -s], [s, c]])
    return r


def test_rope_is_the_papers_rotation_matrix() -> None:
    d_k, length = 8, 12
    x = torch.randn(2, 3, length, d_k, dtype=torch.float64)
    angles = rotary_angles(length, d_k)
    got = rotate(x, angles.cos(), angles.sin())
    want = torch.stack(
        [x[:, :, m] @ rotation_matrix(m, d_k).T for m in range(length)], dim=2
    )
    torch.testing.assert_close(got, want)


def test_rope_scores_depend_only_on_the_relative_offset() -> None:
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, 64).double()
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)

    def score(m: int, n: int) -> float:
        at = lambda v, p: rope(v.expand(1, 1, p + 1, 16))[0, 0, p]  # noqa: E731
        return float(at(q, m) @ at(k, n))

    for offset in (0, 3, -5):
        scores = [score(m, m - offset) for m in range(max(offset, 0), 40, 7)]
        assert max(scores) - min(scores) < 1e-5, (offset, scores)  # float32 tables
    assert abs(score(10, 3) - score(10, 4)) > 1e-3  # the offset itself does matter


def test_rope_starts_at_the_cache_offset() -> None:
    rope = RotaryEmbedding(8, 32)
    x = torch.randn(1, 2, 10, 8)
    whole = rope(x)
    torch.testing.assert_close(rope(x[:, :, 6:], start=6), whole[:, :, 6:])


def grouped_to_multi_head(gqa: MultiHeadAttention) -> MultiHeadAttention:
    """Multi-head attention whose key/value weights are ``gqa``'s repeated for every query head
    of a group (head h uses key/value head h // groups)."""
    d_model, heads, d_k = gqa.n_heads * gqa.d_k, gqa.n_heads, gqa.d_k
    mha = MultiHeadAttention(d_model, heads)
    index = torch.tensor(
        [(h // gqa.groups) * d_k + i for h in range(heads) for i in range(d_k)]
    )
    kv_index = torch.cat([index, index + gqa.kv_heads * d_k])  # keys, then values
    with torch.no_grad():
        mha.q_proj.load_state_dict(gqa.q_proj.state_dict())
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
        mha.kv_proj.weight.copy_(gqa.kv_proj.weight[kv_index])
        mha.kv_proj.bias.copy_(gqa.kv_proj.bias[kv_index])
    return mha


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("need_weights", [False, True])
def test_grouped_query_attention_is_multi_head_with_shared_keys_and_values(
    kv_heads: int, need_weights: bool
) -> None:
    torch.manual_seed(0)
    gqa = MultiHeadAttention(32, 4, kv_heads=kv_heads)
    with torch.no_grad():
        gqa.kv_proj.bias.normal_()
    assert gqa.kv_proj.weight.shape == (2 * kv_heads * 8, 32)
    mha = grouped_to_multi_head(gqa)
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    for args in ((x, x), (x, memory)):
        got, got_w = gqa(*args, need_weights=need_weights)
        want, want_w = mha(*args, need_weights=need_weights)
        torch.testing.assert_close(got, want)
        if need_weights:
            assert got_w is not None and got_w.shape == (2, 4, 5, args[1].size(1))
            torch.testing.assert_close(got_w, want_w)


def test_kv_heads_equal_to_heads_is_the_papers_multi_head_attention() -> None:
    torch.manual_seed(0)
    grouped = MultiHeadAttention(32, 4, kv_heads=4)
    paper = MultiHeadAttention(32, 4)
    paper.load_state_dict(grouped.state_dict())  # same names, same shapes
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(grouped(x, x, causal=True)[0], paper(x, x, causal=True)[0])


def test_a_grouped_cache_holds_only_the_key_value_heads() -> None:
    model = Transformer(tiny(kv_heads=1)).eval()
    cache = model.new_cache()
    encoded = model.encode(torch.tensor([[5, 6, 7]]))
    model.decode(torch.tensor([[1]]), encoded, cache=cache)
    k = cache.layers[0].self_attn.k
    assert k is not None and k.shape == (1, 1, 1, 8)  # (B, G, t, d_k): 1 of 4 heads
    assert model.config.kv_cache_bytes_per_token() * 4 == tiny().kv_cache_bytes_per_token()


@pytest.mark.parametrize(
    ("activation", "act"),
    [
        ("swiglu", lambda x: x * torch.sigmoid(x)),  # Swish_1
        ("geglu", lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))),  # GELU
        # T5 v1.1's gate: GELU's tanh approximation (Hendrycks & Gimpel 2016)
        ("geglu_tanh", lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi)
                                                            * (x + 0.044715 * x**3)))),
    ],
)
def test_gated_feed_forward_is_shazeers_formula(activation: str, act: object) -> None:
    torch.manual_seed(0)
    config = tiny(activation=activation, d_ff=96)
    ffn = feed_forward(config)
    assert isinstance(ffn, GatedFeedForward)
    assert config.ffn_hidden == 64  # 2/3 of 96, a multiple of 8
    for layer in (ffn.w1, ffn.v, ffn.w2):
        nn.init.normal_(layer.bias)
    x = torch.randn(3, 4, 32)
    w, b = ffn.w1.weight, ffn.w1.bias
    v, c = ffn.v.weight, ffn.v.bias
    w2, b2 = ffn.w2.weight, ffn.w2.bias
    want = (act(x @ w.T + b) * (x @ v.T + c)) @ w2.T + b2  # type: ignore[operator]
    torch.testing.assert_close(ffn(x), want)


def test_gated_hidden_width_rule() -> None:
    assert tiny(activation="relu", d_ff=100).ffn_hidden == 100
    assert tiny(activation="swiglu", d_ff=2048).ffn_hidden == 1368  # 1365.3 -> next 8
    assert tiny(activation="geglu", d_ff=64).ffn_hidden == 48


def test_rmsnorm_matches_torch_and_the_formula() -> None:
    torch.manual_seed(0)
    norm = norm_layer(tiny(normalization="rmsnorm"))
    with torch.no_grad():
        norm.weight.normal_()
    reference = nn.RMSNorm(32, eps=1e-6)
    reference.load_state_dict(norm.state_dict())
    x = torch.randn(4, 5, 32) * 3
    torch.testing.assert_close(norm(x), reference(x))
    formula = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), formula)
    assert set(norm.state_dict()) == {"weight"}  # no bias, unlike LayerNorm


def test_learned_positions_round_trip_and_fill_max_len() -> None:
    torch.manual_seed(0)
    config = tiny(positions="learned", max_len=16)
    model = Transformer(config).eval()
    positions = model.encoder.positions
    assert isinstance(positions, LearnedPositions)
    assert positions.table.weight.shape == (16, 32)
    assert "decoder.positions.table.weight" in model.state_dict()
    torch.manual_seed(1)
    again = Transformer(config).eval()
    again.load_state_dict(model.state_dict())
    src, tgt = torch.randint(4, 50, (2, 16)), torch.randint(4, 50, (2, 16))  # max_len exactly
    torch.testing.assert_close(again(src, tgt).logits, model(src, tgt).logits)
    x = torch.zeros(1, 16, 32)
    torch.testing.assert_close(positions(x), positions.table.weight[None])
    with pytest.raises(ValueError, match="exceeds max_len 16"):
        positions(torch.zeros(1, 17, 32))


def test_rope_adds_nothing_to_the_embeddings_and_rotates_self_attention_only() -> None:
    model = Transformer(tiny(positions="rope"))
    layer = model.decoder.layers[0]
    assert layer.self_attn.rotary is not None and layer.cross_attn.rotary is None
    assert model.encoder.layers[0].self_attn.rotary is not None
    x = torch.randn(1, 5, 32)
    model.eval()
    torch.testing.assert_close(model.encoder.positions(x), x)


# The state dict of the paper's model, as tformer saved it before the variants existed.
PAPER_TENSORS = {
    **{f"{side}.embedding.embedding.weight": (50, 32) for side in ("encoder", "decoder")},
    **{
        f"{prefix}.{attn}.{name}.{part}": shape
        for prefix, attns in (
            ("encoder.layers.0", ("self_attn",)),
            ("decoder.layers.0", ("self_attn", "cross_attn")),
        )
        for attn in attns
        for name, part, shape in (
            ("q_proj", "weight", (32, 32)), ("q_proj", "bias", (32,)),
            ("kv_proj", "weight", (64, 32)), ("kv_proj", "bias", (64,)),
            ("out_proj", "weight", (32, 32)), ("out_proj", "bias", (32,)),
        )
    },
    **{
        f"{side}.layers.0.feed_forward.{name}": shape
        for side in ("encoder", "decoder")
        for name, shape in (
            ("w1.weight", (64, 32)), ("w1.bias", (64,)),
            ("w2.weight", (32, 64)), ("w2.bias", (32,)),
        )
    },
    **{f"encoder.layers.0.norm{i}.{p}": (32,) for i in (1, 2) for p in ("weight", "bias")},
    **{f"decoder.layers.0.norm{i}.{p}": (32,) for i in (1, 2, 3) for p in ("weight", "bias")},
}  # fmt: skip


def test_the_default_state_dict_is_unchanged() -> None:
    model = Transformer(tiny(n_encoder_layers=1, n_decoder_layers=1))
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == PAPER_TENSORS
    explicit = Transformer(
        tiny(n_encoder_layers=1, n_decoder_layers=1, kv_heads=4, positions="sinusoidal",
             normalization="layernorm")
    )
    assert {k: tuple(v.shape) for k, v in explicit.state_dict().items()} == PAPER_TENSORS


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(kv_heads=3), "--kv-heads 3 must divide --n-heads 4"),
        (dict(kv_heads=0), "--kv-heads 0 must be >= 1"),
        (dict(positions="rope", d_model=36, n_heads=4), "--positions rope needs an even head"),
        (dict(positions="alibi"), "--positions 'alibi' must be one of"),
        (dict(activation="reglu"), "--activation 'reglu' must be one of"),
        (dict(normalization="scalenorm"), "--normalization 'scalenorm' must be one of"),
    ],
)
def test_bad_combinations_are_refused_naming_the_flags(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as error:
        tiny(**overrides)
    assert "\n" not in str(error.value)


def test_a_config_without_the_new_keys_takes_the_defaults() -> None:
    data = tiny().to_dict()
    for key in ("kv_heads", "positions", "normalization"):
        del data[key]
    assert ModelConfig.from_dict(data) == tiny()
    del data["norm"]
    with pytest.raises(ConfigError, match="missing ModelConfig keys"):
        ModelConfig.from_dict(data)


def test_silu_feed_forward_is_swish_and_transformers_swish() -> None:
    torch.manual_seed(0)
    ffn = feed_forward(tiny(activation="silu", d_ff=48))
    assert not isinstance(ffn, GatedFeedForward)  # ungated: d_ff as given
    nn.init.normal_(ffn.w1.bias)
    x = torch.randn(3, 4, 32)
    h = x @ ffn.w1.weight.T + ffn.w1.bias
    want = (h * torch.sigmoid(h)) @ ffn.w2.weight.T + ffn.w2.bias  # Swish_1 (Ramachandran 2017)
    torch.testing.assert_close(ffn(x), want)
    activations = pytest.importorskip("transformers.activations")
    swish = activations.ACT2FN["swish"]  # what a Marian config's "swish" runs
    torch.testing.assert_close(ffn(x), ffn.w2(swish(ffn.w1(x))))


@pytest.mark.parametrize("tied", [True, False])
def test_output_bias_is_added_to_the_logits(tied: bool) -> None:
    torch.manual_seed(0)
    model = Transformer(tiny(output_bias=True, tie_embeddings=tied)).eval()
    assert model.logits_bias is not None and not model.logits_bias.any()  # starts at zero
    with torch.no_grad():
        model.logits_bias.normal_()
    hidden = torch.randn(2, 3, 32)
    want = hidden @ model.output_weight().T + model.logits_bias
    torch.testing.assert_close(model.project(hidden), want)
    assert "logits_bias" in model.state_dict()
    assert "logits_bias" not in Transformer(tiny()).state_dict()  # the paper's: no bias
    counts = model.parameter_counts()
    assert counts["total"] == sum(p.numel() for p in model.parameters())


def test_source_eos_appends_eos_after_each_source() -> None:
    from tformer.config import EOS_ID, PAD_ID
    from tformer.model.transformer import append_eos

    src = torch.tensor([[5, 6, 7], [8, PAD_ID, PAD_ID]])
    want = torch.tensor([[5, 6, 7, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID]])
    assert torch.equal(append_eos(src, 8), want)
    # At max_len the last token makes room, as Marian's tokenizer truncates.
    assert torch.equal(append_eos(src, 3), torch.tensor([[5, 6, EOS_ID], [8, EOS_ID, PAD_ID]]))
    torch.manual_seed(0)
    model = Transformer(tiny(source_eos=True)).eval()
    reference = Transformer(tiny()).eval()
    reference.load_state_dict(model.state_dict())
    tgt = torch.tensor([[1, 9], [1, 10]])
    with torch.no_grad():
        encoded = model.encode(src)
        assert encoded.memory.shape[1] == 4
        torch.testing.assert_close(
            model(src, tgt).logits, reference(append_eos(src, 32), tgt).logits
        )


def test_source_eos_is_for_encoder_decoders() -> None:
    with pytest.raises(ConfigError, match="--source-eos is for encoder-decoder"):
        tiny(arch="decoder-only", source_eos=True)


# -- GPT-2's and BERT's variants -------------------------------------------------------------


def test_gelu_tanh_is_the_tanh_formula_and_transformers_gelu_new() -> None:
    torch.manual_seed(0)
    ffn = feed_forward(tiny(activation="gelu_tanh", d_ff=48))
    nn.init.normal_(ffn.w1.bias)
    x = torch.randn(3, 4, 32) * 2
    h = x @ ffn.w1.weight.T + ffn.w1.bias
    # Hendrycks & Gimpel (2016): 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))
    gelu = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    torch.testing.assert_close(ffn(x), gelu @ ffn.w2.weight.T + ffn.w2.bias)
    activations = pytest.importorskip("transformers.activations")
    torch.testing.assert_close(ffn(x), ffn.w2(activations.ACT2FN["gelu_new"](ffn.w1(x))))
    exact = feed_forward(tiny(activation="gelu", d_ff=48))
    exact.load_state_dict(ffn.state_dict())
    assert not torch.equal(exact(x), ffn(x))  # the erf GELU differs from the approximation


def test_unscaled_embeddings_with_a_segment_vector() -> None:
    torch.manual_seed(0)
    config = tiny(embedding_scale=False, segment_embedding=True)
    model = Transformer(config)
    embedding = model.encoder.embedding
    assert embedding.segment is not None and not embedding.segment.any()  # zeros to start
    with torch.no_grad():
        embedding.segment.normal_()
    ids = torch.tensor([[5, 6, 7]])
    want = embedding.weight[ids] + embedding.segment  # no x sqrt(d_model)
    torch.testing.assert_close(embedding(ids), want)
    scaled = Transformer(tiny()).encoder.embedding
    torch.testing.assert_close(scaled(ids), scaled.weight[ids] * math.sqrt(32))


def layer_norm_by_hand(x: torch.Tensor, norm: nn.LayerNorm, eps: float) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * norm.weight + norm.bias


def test_norm_eps_reaches_every_layer_norm() -> None:
    model = Transformer(tiny(norm_eps=1e-12, embedding_norm=True, norm="pre"))
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 + 2 * 2 + 2 * 3 + 2  # embedding norms, layers' norms, final norms
    assert {n.eps for n in norms} == {1e-12}
    assert {m.eps for m in Transformer(tiny()).modules() if isinstance(m, nn.LayerNorm)} == {1e-5}
    assert norm_layer(tiny(normalization="rmsnorm")).eps == 1e-6  # RMSNorm keeps LLaMA's
    x = torch.randn(2, 3, 32) * 1e-4  # tiny variance: there the epsilon tells
    torch.testing.assert_close(norms[0](x), layer_norm_by_hand(x, norms[0], 1e-12))


def test_embedding_norm_normalises_token_plus_position_before_the_first_layer() -> None:
    torch.manual_seed(0)
    model = Transformer(
        tiny(embedding_norm=True, positions="learned", embedding_scale=False, norm_eps=1e-12)
    ).eval()
    positions = model.encoder.positions
    assert isinstance(positions.norm, nn.LayerNorm)
    with torch.no_grad():
        positions.norm.weight.normal_()
        positions.norm.bias.normal_()
    ids = torch.tensor([[5, 6, 7, 8]])
    x = model.encoder.embedding.weight[ids] + positions.table.weight[:4]  # type: ignore[union-attr]
    want = layer_norm_by_hand(x, positions.norm, 1e-12)
    torch.testing.assert_close(positions(model.encoder.embedding(ids)), want)


def test_masked_lm_head_is_dense_activation_norm_then_the_tied_projection() -> None:
    torch.manual_seed(0)
    config = tiny(arch="encoder-only", mlm_head=True, output_bias=True, activation="gelu")
    model = build_model(config).eval()
    head = model.mlm_transform
    assert head is not None and model.logits_bias is not None
    with torch.no_grad():
        model.logits_bias.normal_()
        head.norm.weight.normal_()
    hidden = torch.randn(2, 3, 32)
    h = hidden @ head.dense.weight.T + head.dense.bias
    h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))  # BERT's (exact) GELU
    h = layer_norm_by_hand(h, head.norm, 1e-5)
    want = h @ model.encoder.embedding.weight.T + model.logits_bias
    torch.testing.assert_close(model.project(hidden), want)
    counts = model.parameter_counts()
    assert counts["total"] == sum(p.numel() for p in model.parameters())


def test_bos_first_reads_bos_before_the_text_and_leaves_its_row_out() -> None:
    torch.manual_seed(0)
    model = build_model(tiny(arch="encoder-only", bos_first=True, positions="learned")).eval()
    reference = build_model(tiny(arch="encoder-only", positions="learned", max_len=33)).eval()
    reference.load_state_dict(model.state_dict())
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, PAD_ID]])
    with torch.no_grad():
        out = model(src, need_weights=True)
        want = reference(torch.cat([torch.full((2, 1), BOS_ID), src], dim=1)).logits[:, 1:]
    torch.testing.assert_close(out.logits, want)
    assert out.attentions is not None and out.attentions.encoder[0].shape[-1] == 5  # <bos> too
    full = torch.randint(5, 50, (1, 32))  # max_len tokens: <bos> takes the extra position
    assert model(full).logits.shape == (1, 32, 50)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(mlm_head=True), "--mlm-head is for encoder-only models"),
        (dict(arch="decoder-only", bos_first=True), "--bos-first is for encoder-only models"),
        (dict(norm_eps=0.0), "--norm-eps 0.0 must be in (0, 1)"),
    ],
)
def test_gpt2_and_bert_variants_refuse_what_they_cannot_be(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        tiny(**overrides)


def test_a_config_without_the_gpt2_and_bert_keys_is_the_papers_model() -> None:
    data = tiny().to_dict()
    for key in ("embedding_scale", "norm_eps", "embedding_norm", "segment_embedding",
                "mlm_head", "bos_first"):  # fmt: skip
        del data[key]
    assert ModelConfig.from_dict(data) == tiny()
