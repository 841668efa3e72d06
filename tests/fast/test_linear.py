"""The packed-weight path of tformer's Linear gives F.linear's results, and only where meant."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import decoding_model, plain_linear, same_hypotheses
from tformer.decoding.api import decode
from tformer.decoding.settings import DecodingConfig
from tformer.fast import linear as linear_module
from tformer.fast.linear import Linear, packing_applies

pytestmark = pytest.mark.skipif(
    not linear_module._PACKING, reason="this torch build has no MKL weight packing"
)


def close_to_f_linear(out: torch.Tensor, x: torch.Tensor, layer: torch.nn.Linear) -> None:
    # A different blocking sums the products in a different order: fp32 rounding only.
    reference = F.linear(
        x.double(), layer.weight.double(), None if layer.bias is None else layer.bias.double()
    )
    torch.testing.assert_close(out.double(), reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(4, 24), (32, 24), (96, 24), (8, 1, 24), (3, 5, 24)])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_path_equals_f_linear(shape: tuple[int, ...], bias: bool) -> None:
    torch.manual_seed(0)
    layer = Linear(24, 40, bias=bias)
    x = torch.randn(*shape)
    with torch.no_grad():
        assert packing_applies(x, layer.weight)
        first = layer(x)  # a row count seen once: plain product, nothing packed yet
        assert layer.__dict__["_packed_weight"][1] is None
        out = layer(x)  # the same row count again: packed
        assert layer.__dict__["_packed_weight"][1] is not None
        reference = F.linear(x, layer.weight, layer.bias)
        torch.testing.assert_close(first, reference)
        torch.testing.assert_close(out, reference)
    assert set(layer.state_dict()) == ({"weight", "bias"} if bias else {"weight"})


@pytest.mark.parametrize("shape", [(1, 24), (1, 1, 24)])
@pytest.mark.parametrize("bias", [True, False])
def test_one_row_packs_tall_weights_only_and_equals_f_linear(
    shape: tuple[int, ...], bias: bool
) -> None:
    # A matrix-vector product (batch-1 greedy decoding) packs weights at least twice as
    # tall as wide; square and wide ones keep F.linear.
    torch.manual_seed(0)
    tall, square, wide = Linear(24, 48, bias=bias), Linear(24, 24), Linear(24, 12)
    x = torch.randn(*shape)
    with torch.no_grad():
        assert linear_module.packed_rows(x, tall.weight) == 1
        assert not packing_applies(x, square.weight)
        assert not packing_applies(x, wide.weight)
        assert not packing_applies(torch.randn(*shape[:-1], 48), Linear(48, 95).weight)
        outputs = [tall(x) for _ in range(3)]  # packed from the second call on
        assert tall.__dict__["_packed_weight"][1] is not None
        for out in outputs:
            assert out.shape == (*shape[:-1], 48)
            close_to_f_linear(out, x, tall)
        tall.weight.add_(1.0)  # an in-place update: the packed copy must be remade
        close_to_f_linear(tall(x), x, tall)
        close_to_f_linear(tall(x), x, tall)


def test_packing_follows_row_count_and_weight_updates() -> None:
    torch.manual_seed(1)
    layer = Linear(16, 16)
    with torch.no_grad():
        for rows in (32, 31, 5):  # a batch shrinking as rows finish
            x = torch.randn(rows, 16)
            for _ in range(3):
                torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
            key, packed = layer.__dict__["_packed_weight"]
            assert key[0] == rows and packed is not None
        layer.weight.mul_(2.0)  # an in-place update: the packed copy must be remade
        for _ in range(2):
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


def test_a_row_count_seen_once_keeps_the_packed_copy_for_the_next_return() -> None:
    # Beam search: one row per source at the first step, K at every later one. The copy packed
    # for K survives the one-row step instead of being packed again at each search.
    torch.manual_seed(2)
    tall = Linear(24, 96)
    four, one = torch.randn(4, 24), torch.randn(1, 24)
    with torch.no_grad():
        for _ in range(2):
            tall(four)
        packed = tall.__dict__["_packed_weight"][1]
        assert packed is not None
        for _ in range(3):  # three searches
            close_to_f_linear(tall(one), one, tall)
            close_to_f_linear(tall(four), four, tall)
            assert tall.__dict__["_packed_weight"][1] is packed  # not packed again
        assert "_packed_spare" not in tall.__dict__
        tall(one)
        tall.weight.add_(1.0)  # an update: the copy packed for four rows is stale
        close_to_f_linear(tall(four), four, tall)
        assert "_packed_spare" not in tall.__dict__
        close_to_f_linear(tall(four), four, tall)
        assert tall.__dict__["_packed_weight"][1] is not packed


def test_repeated_beam_searches_pack_each_weight_once(monkeypatch: pytest.MonkeyPatch) -> None:
    model = decoding_model(vocab=300, d_model=32, d_ff=128)
    src = torch.randint(4, 300, (1, 7))
    beam = DecodingConfig(beam_size=4, min_new_tokens=8, max_new_tokens=8)
    first = decode(model, src, beam)
    packs: list[tuple[int, ...]] = []
    reorder = torch.ops.mkl._mkl_reorder_linear_weight

    def recorded(weight: torch.Tensor, rows: int) -> torch.Tensor:
        packs.append((*weight.shape, rows))
        return reorder(weight, rows)

    monkeypatch.setattr(torch.ops.mkl, "_mkl_reorder_linear_weight", recorded)
    again = decode(model, src, beam)
    # The decoder's copies for four rows outlived the one-row first step (the encoder's weights
    # are packed for the source's 7 rows now that they repeat).
    assert [shape for shape in packs if shape[-1] != 7] == []
    same_hypotheses(first, again)


def test_a_row_count_that_changes_every_call_is_never_packed() -> None:
    layer = Linear(16, 16)
    with torch.no_grad():
        for rows in range(4, 20):  # a prefix re-run in full at every step
            x = torch.randn(rows, 16)
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
            assert layer.__dict__["_packed_weight"][1] is None


def test_training_one_row_and_reduced_precision_keep_f_linear() -> None:
    layer = Linear(8, 8)
    x = torch.randn(16, 8)
    assert not packing_applies(x, layer.weight)  # gradients enabled
    with torch.no_grad():
        assert not packing_applies(torch.randn(1, 8), layer.weight)  # one row, square weight
        assert not packing_applies(torch.randn(200, 8), layer.weight)  # BLAS packs well itself
        assert not packing_applies(x.to(torch.bfloat16), layer.weight)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not packing_applies(x, layer.weight)
    out = layer(x)
    out.sum().backward()  # the training path is differentiable as ever
    assert layer.weight.grad is not None and "_packed_weight" not in layer.__dict__


@pytest.mark.slow
def test_compiled_inference_with_changing_row_counts_equals_eager() -> None:
    # Under torch.compile the row count is symbolic; the packing test must step aside
    # before reading it, and the traced product must still be F.linear's.
    torch.manual_seed(0)
    layer = Linear(16, 24).eval()
    compiled = torch.compile(layer, dynamic=True)
    with torch.no_grad():
        for rows in (5, 7, 9):
            x = torch.randn(rows, 16)
            torch.testing.assert_close(compiled(x), F.linear(x, layer.weight, layer.bias))


def test_batch_one_greedy_decoding_with_packed_tall_weights_equals_unpacked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At batch 1 every step is a matrix-vector product: the vocabulary, the stacked
    # query/key/value and the first feed-forward weights are packed; the tokens and their
    # log-probabilities must be those of plain F.linear.
    model = decoding_model(vocab=300, d_model=32, d_ff=128)
    src = torch.randint(4, 300, (1, 7))
    greedy = DecodingConfig(min_new_tokens=10, max_new_tokens=10)
    shapes: list[tuple[int, ...]] = []
    mkl_linear = torch.ops.mkl._mkl_linear

    def recorded(
        x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, *rest: object
    ) -> torch.Tensor:
        shapes.append(tuple(weight.shape))
        return mkl_linear(x, packed, weight, *rest)

    monkeypatch.setattr(torch.ops.mkl, "_mkl_linear", recorded)
    packed = decode(model, src, greedy)
    assert {(300, 32), (96, 32), (128, 32)} <= set(shapes)  # the paths under test ran
    plain_linear(monkeypatch)
    same_hypotheses(packed, decode(model, src, greedy))


# -- oneDNN packing of large weights -----------------------------------------------------------

needs_onednn = pytest.mark.skipif(
    not linear_module._ONEDNN, reason="this torch build has no oneDNN weight packing"
)


@pytest.fixture
def prefer_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The choice made on non-Intel CPUs, whatever CPU runs the test."""
    monkeypatch.setattr(linear_module, "ONEDNN_LARGE_WEIGHTS", True)


@needs_onednn
@pytest.mark.parametrize("rows", [2, 3, 32, 96])
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_packs_large_weights_and_equals_f_linear(
    prefer_onednn: None, rows: int, bias: bool
) -> None:
    torch.manual_seed(0)
    layer = Linear(512, 2048, bias=bias)  # 1M entries: a base-size feed-forward matrix
    x = torch.randn(rows, 1, 512)  # a decoding step's (B, 1, D)
    with torch.no_grad():
        assert linear_module.packed_rows(x, layer.weight) == rows
        first = layer(x)
        assert layer.__dict__["_packed_weight"][1] is None  # seen once: not packed yet
        out = layer(x)
        packed = layer.__dict__["_packed_weight"][1]
        assert packed is not None and packed.is_mkldnn  # oneDNN's blocked layout
        assert out.shape == (rows, 1, 2048)
        close_to_f_linear(first, x, layer)
        close_to_f_linear(out, x, layer)
        layer.weight.mul_(-0.5)  # an in-place update: the packed copy must be remade
        close_to_f_linear(layer(x), x, layer)
        close_to_f_linear(layer(x), x, layer)
    assert set(layer.state_dict()) == ({"weight", "bias"} if bias else {"weight"})


@needs_onednn
def test_onednn_takes_only_large_weights_and_few_rows(
    prefer_onednn: None, two_threads: None
) -> None:
    large = torch.empty(2048, 512)  # 1M entries
    # From 192K entries with >= 512 outputs: (1024 x 256), (512 x 512), (768 x 256).
    many_outputs = [torch.empty(1024, 256), torch.empty(512, 512), torch.empty(768, 256)]
    small, narrow = torch.empty(256, 256), torch.empty(256, 1024)  # 64K; 256K, 256 outputs
    with torch.no_grad():
        for weight in (large, *many_outputs):
            assert linear_module._uses_onednn(32, weight)
            assert linear_module.packed_rows(torch.empty(5, weight.size(1)), weight) == 5
            assert not linear_module._uses_onednn(1, weight)  # a matrix-vector product
            assert not linear_module._uses_onednn(97, weight)
        # 2-4 rows: oneDNN for large weights; smaller ones are split over threads instead.
        assert linear_module.packed_rows(torch.empty(2, 512), large) == 2
        for weight in many_outputs:
            assert linear_module.packed_rows(torch.empty(2, weight.size(1)), weight) == 0
        for weight in (small, narrow):
            assert not linear_module._uses_onednn(32, weight)
            # MKL keeps them where it packs, and 2-3 rows are not packed at all.
            assert linear_module.packed_rows(torch.empty(2, weight.size(1)), weight) == 0


@needs_onednn
def test_greedy_decoding_with_onednn_packing_equals_unpacked(
    prefer_onednn: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A vocabulary of 4096 x 256 (1M entries) and 1024-wide feed-forward layers take the
    # oneDNN path at batch 3 and, with 4 beams, at 4 rows; everything is held against F.linear.
    model = decoding_model(vocab=4096, d_model=256, d_ff=1024)
    src = torch.randint(4, 4096, (3, 9))
    greedy = DecodingConfig(min_new_tokens=12, max_new_tokens=12)
    beam = DecodingConfig(beam_size=4, min_new_tokens=12, max_new_tokens=12)
    calls = 0
    onednn_linear = torch.ops.mkldnn._linear_pointwise

    def counted(*args: object) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return onednn_linear(*args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", counted)
    packed = [decode(model, src, greedy), decode(model, src[:1], beam)]
    assert calls > 0  # the path under test ran
    plain_linear(monkeypatch)
    plain = [decode(model, src, greedy), decode(model, src[:1], beam)]
    for got, want in zip(packed, plain, strict=True):
        same_hypotheses(got, want)
