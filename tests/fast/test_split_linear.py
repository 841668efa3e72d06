"""Products of 1-4 rows split over threads give F.linear's results, and only where meant."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import decoding_model, plain_linear, same_hypotheses
from tformer.decoding.api import decode
from tformer.decoding.settings import DecodingConfig
from tformer.fast import linear as linear_module
from tformer.fast.linear import Linear, split_linear, split_parts

pytestmark = pytest.mark.skipif(
    not linear_module._X86, reason="splitting over threads is used on x86 CPUs only"
)


@pytest.fixture
def onednn_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The choice made on non-Intel CPUs (where 2-4 rows split), whatever CPU runs the test."""
    monkeypatch.setattr(linear_module, "ONEDNN_LARGE_WEIGHTS", True)


def close_to_f_linear(out: torch.Tensor, x: torch.Tensor, layer: torch.nn.Linear) -> None:
    # Each block sums the same products as F.linear, perhaps in another order.
    bias = None if layer.bias is None else layer.bias.double()
    reference = F.linear(x.double(), layer.weight.double(), bias)
    assert out.shape == reference.shape
    torch.testing.assert_close(out.double(), reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(1, 256), (1, 1, 256), (2, 1, 256), (3, 256), (4, 1, 256)])
@pytest.mark.parametrize("bias", [True, False])
def test_split_product_equals_f_linear(
    two_threads: None, onednn_elsewhere: None, shape: tuple[int, ...], bias: bool
) -> None:
    torch.manual_seed(0)
    layer = Linear(256, 384, bias=bias)  # 96K entries: large enough to split
    x = torch.randn(*shape)
    with torch.no_grad():
        assert split_parts(x.numel() // 256, layer.weight) == 2
        close_to_f_linear(layer(x), x, layer)
        layer.weight.mul_(-0.5)  # a view of the weight, never a copy: updates show at once
        close_to_f_linear(layer(x), x, layer)
    assert "_packed_weight" not in layer.__dict__  # nothing packed, nothing cached
    assert set(layer.state_dict()) == ({"weight", "bias"} if bias else {"weight"})


@pytest.mark.parametrize("parts", [2, 3, 4, 6])
def test_any_number_of_blocks_equals_f_linear(parts: int) -> None:
    torch.manual_seed(1)
    layer = torch.nn.Linear(40, 48)
    for x in (torch.randn(1, 40), torch.randn(4, 1, 40), torch.randn(8, 40)[::2]):
        with torch.no_grad():
            close_to_f_linear(split_linear(x, layer.weight, layer.bias, parts), x, layer)


def test_blocks_follow_the_thread_count_and_divide_the_outputs() -> None:
    weight = torch.empty(512, 256)
    before = torch.get_num_threads()
    try:
        for count, parts in ((1, 0), (2, 2), (4, 4), (3, 2), (6, 4), (16, 16)):
            torch.set_num_threads(count)
            assert split_parts(1, weight) == parts, count
    finally:
        torch.set_num_threads(before)


def test_split_only_for_few_rows_large_weights_and_inference(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    square, small = torch.empty(512, 512), torch.empty(128, 128)  # 256K; 16K entries
    large = torch.empty(2048, 512)  # 1M entries: oneDNN's, from 2 rows, on non-Intel CPUs
    monkeypatch.setattr(linear_module, "ONEDNN_LARGE_WEIGHTS", True)
    assert [split_parts(rows, square) for rows in (1, 2, 4, 5, 32)] == [2, 2, 2, 0, 0]
    assert split_parts(1, small) == 0  # starting the threads would cost more than it saves
    assert split_parts(1, large) == 2 and split_parts(2, large) == 0
    assert split_parts(1, square.t()) == 0  # blocks of outputs must be views
    monkeypatch.setattr(linear_module, "ONEDNN_LARGE_WEIGHTS", False)  # Intel: 1 row only
    assert [split_parts(rows, square) for rows in (1, 2, 4)] == [2, 0, 0]
    layer = Linear(512, 512)
    x = torch.randn(1, 512)
    assert linear_module.inference_rows(x, layer.weight) == 0  # gradients enabled
    out = layer(x)
    out.sum().backward()  # the training path is F.linear's, differentiable as ever
    assert layer.weight.grad is not None
    with torch.no_grad():
        assert linear_module.inference_rows(x, layer.weight) == 1
        assert linear_module.inference_rows(x.double(), layer.weight.double()) == 0
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert linear_module.inference_rows(x, layer.weight) == 0


@pytest.mark.parametrize("beam_size", [1, 4])
def test_decoding_with_split_products_equals_plain_f_linear(
    two_threads: None, onednn_elsewhere: None, monkeypatch: pytest.MonkeyPatch, beam_size: int
) -> None:
    # With every weight eligible, a batch-1 greedy step (1 row) and a 4-beam step (4 rows)
    # split the stacked query/key/value, output, feed-forward, folded cross-attention and
    # vocabulary products; the tokens and their log-probabilities must be F.linear's.
    model = decoding_model(vocab=300, d_model=32, d_ff=128)
    src = torch.randint(4, 300, (1, 7))
    config = DecodingConfig(beam_size=beam_size, min_new_tokens=10, max_new_tokens=10)
    monkeypatch.setattr(linear_module, "SPLIT_MIN_WEIGHT", 0)
    monkeypatch.setattr(linear_module, "split_pays", lambda *_: True)  # whatever this CPU says
    shapes: set[tuple[int, int]] = set()
    split = linear_module.split_linear

    def recorded(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, parts: int
    ) -> torch.Tensor:
        shapes.add(tuple(weight.shape))
        return split(x, weight, bias, parts)

    monkeypatch.setattr(linear_module, "split_linear", recorded)
    got = decode(model, src, config)
    folded = (4 * 7, 32)  # the folded keys: (heads x source length) x d_model
    assert {(300, 32), (96, 32), (32, 32), (128, 32), (32, 128), folded} <= shapes
    plain_linear(monkeypatch)
    same_hypotheses(got, decode(model, src, config))


def test_the_faster_of_split_and_whole_is_measured_once_per_shape(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time
    import types

    # A delay no product of these sizes takes, even on a machine busy with other tests.
    DELAY = 0.05  # noqa: N806
    monkeypatch.setattr(linear_module, "_SPLIT_PAYS", {})
    weight, bias, x = torch.randn(384, 256), torch.randn(384), torch.randn(1, 256)
    split = linear_module.split_linear

    def slow_split(*args: object) -> torch.Tensor:
        time.sleep(DELAY)
        return split(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(linear_module, "split_linear", slow_split)
    assert linear_module.split_pays(x, weight, bias, 2) is False
    monkeypatch.setattr(linear_module, "split_linear", split)
    assert linear_module.split_pays(x, weight, bias, 2) is False  # kept: measured once

    def slow_linear(*args: object) -> torch.Tensor:
        time.sleep(DELAY)
        return F.linear(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(linear_module, "F", types.SimpleNamespace(linear=slow_linear))
    other = torch.randn(512, 256)  # another shape: measured afresh
    assert linear_module.split_pays(x, other, None, 2) is True
    layer = Linear(256, 512, bias=False)
    with torch.no_grad():
        layer.weight.copy_(other)
        close_to_f_linear(layer(x), x, layer)  # and the layer takes the split product
