"""Dropout's cheaper CPU mask keeps nn.Dropout's statistics and gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tformer.fast.dropout import Dropout, dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_each_lane_drops_with_probability_p(p: float) -> None:
    torch.manual_seed(0)
    n = 400_000
    mask = keep_mask(torch.Size([n]), p)
    assert mask.dtype == torch.bool and mask.shape == (n,)
    # Four 16-bit lanes come from one 64-bit draw: each must be uniform on its own.
    # Binomial standard deviation of a rate over 100k samples is < 0.0016; allow 4 of them.
    for lane in range(4):
        rate = mask[lane::4].float().mean().item()
        assert abs(rate - (1 - p)) < 0.0064, (lane, rate)
    # Neighbouring elements are independent: P(both kept) = (1 - p)^2.
    both = (mask[:-1] & mask[1:]).float().mean().item()
    assert abs(both - (1 - p) ** 2) < 0.0064


def test_survivors_are_scaled_and_gradient_follows_the_mask() -> None:
    torch.manual_seed(1)
    x = torch.randn(64, 33, 16, requires_grad=True)
    y = dropout(x, 0.25, training=True)
    kept = y != 0
    torch.testing.assert_close(y[kept], x.detach()[kept] / 0.75)
    assert 0.7 < kept.float().mean().item() < 0.8
    y.sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, kept.float() / 0.75)


def test_bf16_keeps_its_dtype_and_the_mean() -> None:
    torch.manual_seed(2)
    x = torch.ones(200_000, dtype=torch.bfloat16)
    y = dropout(x, 0.1, training=True)
    assert y.dtype == torch.bfloat16
    assert abs(y.float().mean().item() - 1.0) < 0.01


def test_module_is_an_identity_in_eval_and_at_zero() -> None:
    x = torch.randn(5, 7)
    module = Dropout(0.5)
    assert isinstance(module, nn.Dropout) and module.p == 0.5
    assert module.state_dict() == {}
    assert torch.equal(module.eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))


def test_the_same_seed_gives_the_same_mask() -> None:
    torch.manual_seed(3)
    a = dropout(torch.ones(1000), 0.3, training=True)
    torch.manual_seed(3)
    b = dropout(torch.ones(1000), 0.3, training=True)
    assert torch.equal(a, b)
