"""The three families as siblings behind one protocol: what each says it has, and that
``encode`` / ``decode`` / ``project`` and its attention parts agree with that."""

from __future__ import annotations

import pytest
import torch

from tformer.config import BOS_ID, ModelConfig
from tformer.errors import ConfigError
from tformer.model import (
    DecoderOnlyTransformer,
    EncoderOnlyTransformer,
    Transformer,
    TransformerBase,
    build_model,
    model_class,
)
from tformer.model.heads import all_heads, parse_heads

VOCAB, D, HEADS = 30, 16, 2
FAMILIES = ("encoder-decoder", "decoder-only", "encoder-only")


def tiny(arch: str) -> TransformerBase:
    torch.manual_seed(0)
    config = ModelConfig(
        arch=arch,  # type: ignore[arg-type]
        src_vocab_size=VOCAB,
        tgt_vocab_size=VOCAB,
        d_model=D,
        n_heads=HEADS,
        n_encoder_layers=2,
        n_decoder_layers=3,
        d_ff=32,
        dropout=0.0,
        max_len=16,
    )
    return build_model(config).eval()


def test_the_families_are_siblings_not_subclasses_of_one_another() -> None:
    classes = (Transformer, DecoderOnlyTransformer, EncoderOnlyTransformer)
    for cls in classes:
        assert TransformerBase in cls.__bases__
        assert [other for other in classes if other is not cls and issubclass(cls, other)] == []
    assert [model_class(arch) for arch in FAMILIES] == list(classes)
    assert all(type(tiny(arch)) is model_class(arch) for arch in FAMILIES)
    assert [model_class(arch).family for arch in FAMILIES] == list(FAMILIES)


@pytest.mark.parametrize(
    ("arch", "kinds", "reads_source", "generates", "continues_prompts", "fills_masks"),
    [
        ("encoder-decoder", ("encoder", "decoder", "cross"), True, True, False, False),
        ("decoder-only", ("decoder",), False, True, True, False),
        ("encoder-only", ("encoder",), False, False, False, True),
    ],
)
def test_each_family_says_what_it_has(
    arch: str,
    kinds: tuple[str, ...],
    reads_source: bool,
    generates: bool,
    continues_prompts: bool,
    fills_masks: bool,
) -> None:
    model = tiny(arch)
    assert model.attention_kinds == kinds
    assert (model.reads_source, model.generates) == (reads_source, generates)
    assert (model.continues_prompts, model.fills_masks) == (continues_prompts, fills_masks)
    # The stacks it holds are the ones its answers imply.
    assert list(model.stacks()) == [
        name for name, has in (("encoder", "encoder" in kinds), ("decoder", generates)) if has
    ]
    assert hasattr(model, "encoder") == ("encoder" in kinds)
    assert hasattr(model, "decoder") == generates


@pytest.mark.parametrize("arch", FAMILIES)
def test_the_attention_parts_are_the_kinds_it_says_and_its_forward_returns(arch: str) -> None:
    model = tiny(arch)
    parts = model.attention_parts()
    assert tuple(parts) == model.attention_kinds
    layers = {"encoder": 2, "decoder": 3, "cross": 3}
    assert {kind: len(found) for kind, found in parts.items()} == {
        kind: layers[kind] for kind in model.attention_kinds
    }
    ids = torch.tensor([[BOS_ID, 5, 6, 7, 8]])
    maps = model(ids, ids, need_weights=True).attentions
    assert maps is not None
    returned = {kind: getattr(maps, kind) for kind in ("encoder", "decoder", "cross")}
    assert {kind for kind, found in returned.items() if found} == set(model.attention_kinds)
    assert all(len(returned[kind]) == len(parts[kind]) for kind in model.attention_kinds)
    # Head names come from the same parts: every head of every kind it has, nothing else.
    assert len(all_heads(model)) == HEADS * sum(layers[kind] for kind in model.attention_kinds)


def test_a_head_of_a_part_the_model_lacks_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="a decoder-only model has no cross-attention"):
        parse_heads("cross.0.1", tiny("decoder-only"))
    with pytest.raises(ConfigError, match="an encoder-only model has no decoder self-attention"):
        parse_heads("dec.0.*", tiny("encoder-only"))


@pytest.mark.parametrize("arch", FAMILIES)
def test_encode_decode_and_project_give_the_forward_passes_logits(arch: str) -> None:
    model = tiny(arch)
    src = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 13, 14]])
    tgt_in = torch.tensor([[BOS_ID, 20, 21], [BOS_ID, 22, 23]])
    with torch.no_grad():
        encoded = model.encode(src)
        if not model.generates:  # one pass over its input: logits at every position
            assert encoded.memory.shape == (2, 5, D)
            logits = model.project(encoded.memory)
            assert logits.shape == (2, 5, VOCAB)
            torch.testing.assert_close(logits, model(src).logits)
            with pytest.raises(NotImplementedError, match="has no decoder"):
                model.decode(tgt_in, encoded)
            return
        # A prompt-continuing model reads no source: an empty memory.
        assert encoded.memory.shape == ((2, 5, D) if model.reads_source else (2, 0, D))
        decoded = model.decode(tgt_in, encoded)
        assert decoded.logits.shape == (2, 3, VOCAB)
        torch.testing.assert_close(decoded.logits, model(src, tgt_in).logits)
        # Cached decoding, one position at a time, gives the same logits.
        cache = model.new_cache()
        steps = [model.decode(tgt_in[:, t : t + 1], encoded, cache=cache).logits for t in range(3)]
        torch.testing.assert_close(torch.cat(steps, dim=1), decoded.logits)


@pytest.mark.parametrize("arch", FAMILIES)
def test_project_is_the_tied_embedding_of_the_stack_that_writes_the_output(arch: str) -> None:
    model = tiny(arch)
    writer = list(model.stacks().values())[-1]
    assert model.output_weight() is writer.embedding.weight
    hidden = torch.randn(1, 2, D)
    torch.testing.assert_close(model.project(hidden), hidden @ writer.embedding.weight.T)
