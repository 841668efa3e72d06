"""Head masks (Michel et al. 2019): a masked head's output is zeroed before W^O.

The reference is a second model whose W^O columns for those heads are zeroed by hand: the
same function, reached through the weights instead of the gates, on every path (the plain
forward, the cached decoding step, cross-attention folded into one source).
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.model.test_model import tiny
from tformer.decoding.api import decode_texts
from tformer.decoding.settings import DecodingConfig
from tformer.errors import ConfigError
from tformer.fast.accelerate import accelerate
from tformer.model import Transformer
from tformer.model.heads import (
    HeadName,
    all_heads,
    attention_layers,
    heads_masked,
    mask_heads,
    masked,
    parse_heads,
)


def model(**overrides: object) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny(**overrides)).eval()


def zeroed_copy(original: Transformer, heads: list[HeadName]) -> Transformer:
    """A copy of ``original`` with W^O's columns of ``heads`` set to zero."""
    reference = copy.deepcopy(original)
    layers = attention_layers(reference)
    with torch.no_grad():
        for head in heads:
            attention = layers[head.part][head.layer]
            cols = slice(head.head * attention.d_k, (head.head + 1) * attention.d_k)
            attention.out_proj.weight[:, cols] = 0.0
    return reference


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(4, 50, (3, 9), generator=generator), torch.randint(
        4, 50, (3, 6), generator=generator
    )


def test_masking_no_heads_changes_nothing() -> None:
    m = model()
    src, tgt = batch()
    before = m(src, tgt).logits
    mask_heads(m, [])
    assert torch.equal(m(src, tgt).logits, before)
    with heads_masked(m, parse_heads("enc.0.1", m)):
        assert not torch.equal(m(src, tgt).logits, before)
    assert masked(m) == []
    assert torch.equal(m(src, tgt).logits, before)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"kv_heads": 2}, {"positions": "rope"}, {"norm": "pre", "normalization": "rmsnorm"}],
    ids=["paper", "gqa", "rope", "pre-rmsnorm"],
)
def test_masked_forward_equals_zeroed_output_projection_columns(overrides: dict) -> None:
    m = model(**overrides)
    heads = parse_heads("enc.0.1,enc.1.3,dec.1.0,cross.0.2,cross.1.*", m)
    reference = zeroed_copy(m, heads)
    src, tgt = batch()
    mask_heads(m, heads)
    got, want = m(src, tgt, need_weights=True), reference(src, tgt, need_weights=True)
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-6)
    # The maps are still computed for a masked head: only its output is silenced.
    assert got.attentions is not None and want.attentions is not None
    torch.testing.assert_close(got.attentions.cross[1], want.attentions.cross[1])


@pytest.mark.parametrize("sources", [1, 3], ids=["one-source-folded", "batch"])
def test_masked_cached_decoding_equals_zeroed_columns(sources: int) -> None:
    # One source takes the folded cross-attention step, several the plain cached step.
    m = accelerate(model())
    heads = parse_heads("dec.0.2,cross.1.0,cross.1.3,enc.1.1", m)
    reference = accelerate(zeroed_copy(m, heads))
    mask_heads(m, heads)
    src = batch()[0][:sources].tolist()
    config = DecodingConfig(max_new_tokens=8, min_new_tokens=8)
    with torch.inference_mode():
        got = decode_texts(m, src, config)
        want = decode_texts(reference, src, config)
    for g, w in zip(got, want, strict=True):
        assert g[0].ids == w[0].ids
        assert g[0].token_logprobs == pytest.approx(w[0].token_logprobs, abs=1e-5)


def test_masking_a_whole_cross_attention_layer_cuts_it_off_from_the_source() -> None:
    m = model()
    outputs: list[torch.Tensor] = []
    hook = m.decoder.layers[0].cross_attn.register_forward_hook(
        lambda _module, _args, out: outputs.append(out[0])
    )
    src, tgt = batch()
    other = src.flip(0)  # different sources, same targets
    m(src, tgt), m(other, tgt)
    assert not torch.allclose(outputs[0], outputs[1])
    mask_heads(m, parse_heads("cross.0.*", m))
    m(src, tgt), m(other, tgt)
    torch.testing.assert_close(outputs[2], outputs[3], rtol=0, atol=0)
    hook.remove()
    # With every cross-attention layer masked, the logits ignore the source entirely.
    mask_heads(m, parse_heads("cross.0.*,cross.1.*", m))
    torch.testing.assert_close(m(src, tgt).logits, m(other, tgt).logits, rtol=0, atol=0)


def test_head_masks_are_settings_never_saved() -> None:
    m = model()
    keys = set(m.state_dict())
    mask_heads(m, all_heads(m))
    assert set(m.state_dict()) == keys
    assert not any("gate" in key for key in keys)


def test_head_names_parse_and_count_from_the_end() -> None:
    m = model()  # 2 encoder and 2 decoder layers of 4 heads
    assert len(all_heads(m)) == 3 * 2 * 4
    assert [str(h) for h in parse_heads("cross.-1.-1, enc.0.1,enc.0.1", m)] == [
        "enc.0.1",
        "cross.1.3",
    ]
    assert [str(h) for h in parse_heads("dec.1.*", m)] == [f"dec.1.{h}" for h in range(4)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("encoder.0.1", "PART.LAYER.HEAD"),
        ("enc.0", "PART.LAYER.HEAD"),
        ("enc.2.0", "--mask-heads 'enc.2.0': layer 2 is out of range: encoder self-attention "
         "has 2"),
        ("cross.0.4", "head 4 is out of range: cross-attention has 4"),
        ("dec.x.1", "layer 'x' is not a number"),
        (" , ", "names no head"),
    ],
)
def test_bad_head_names_are_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("*", r"\*")) as info:
        parse_heads(text, model())
    assert "\n" not in str(info.value)


def test_int8_decoding_honours_head_masks() -> None:
    from tformer.fast.int8 import quantize_int8

    m = model()
    mask_heads(m, parse_heads("cross.0.*,cross.1.*", m))
    quantize_int8(m)
    src = batch()[0].tolist()
    config = DecodingConfig(max_new_tokens=6, min_new_tokens=6)
    with torch.inference_mode():
        rows = decode_texts(m, src, config)
        alone = decode_texts(m, src[:1], config)  # one source: the folded step
    assert rows[0][0].ids == rows[1][0].ids == rows[2][0].ids == alone[0][0].ids
    assert rows[0][0].token_logprobs == pytest.approx(rows[2][0].token_logprobs, abs=1e-4)
    mask_heads(m, [])
    with torch.inference_mode():
        assert len({tuple(r[0].ids) for r in decode_texts(m, src, config)}) > 1
