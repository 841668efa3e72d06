"""The packed-weight path of tformer's Linear gives F.linear's results, and only where meant."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tformer.model import linear as linear_module
from tformer.model.linear import Linear, packing_applies

pytestmark = pytest.mark.skipif(
    not linear_module._PACKING, reason="this torch build has no MKL weight packing"
)


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
        assert not packing_applies(torch.randn(1, 8), layer.weight)  # a matrix-vector product
        assert not packing_applies(torch.randn(200, 8), layer.weight)  # BLAS packs well itself
        assert not packing_applies(x.to(torch.bfloat16), layer.weight)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not packing_applies(x, layer.weight)
    out = layer(x)
    out.sum().backward()  # the training path is differentiable as ever
    assert layer.weight.grad is not None and "_packed_weight" not in layer.__dict__


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
