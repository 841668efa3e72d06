"""The encoder-decoder: positions, masking, weight tying, caching, parameter counts."""

from __future__ import annotations

import math

import pytest
import torch

from tformer.config import BOS_ID, PAD_ID, ModelConfig, preset
from tformer.model import Transformer
from tformer.model.positions import sinusoidal_positions


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
