"""The fused label-smoothed cross-entropy against torch's own ``F.cross_entropy``."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tformer.config import PAD_ID
from tformer.training import loss as loss_module
from tformer.training.loss import scaled_loss, sequence_loss


def reference(logits: torch.Tensor, labels: torch.Tensor, smoothing: float) -> torch.Tensor:
    return F.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)),
        labels.reshape(-1),
        ignore_index=PAD_ID,
        label_smoothing=smoothing,
        reduction="sum",
    )


def loss_and_grad(fn, logits: torch.Tensor, labels: torch.Tensor, smoothing: float, scale: float):
    leaf = logits.detach().clone().requires_grad_()
    value = fn(leaf, labels, smoothing)
    (value * scale).backward()
    assert leaf.grad is not None
    return value.detach(), leaf.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_loss_and_gradient_match_torch(dtype: torch.dtype, smoothing: float) -> None:
    torch.manual_seed(0)
    logits = (torch.randn(3, 17, 901) * 4).to(dtype)
    labels = torch.randint(1, 901, (3, 17))
    labels[0, 9:] = PAD_ID  # a padded row contributes nothing
    labels[2, :3] = PAD_ID
    ours, our_grad = loss_and_grad(sequence_loss, logits, labels, smoothing, 1 / 40)
    ref, ref_grad = loss_and_grad(reference, logits, labels, smoothing, 1 / 40)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-3)
    assert our_grad.dtype == dtype
    tol = {torch.float32: 1e-6, torch.bfloat16: 1e-4, torch.float16: 1e-5}[dtype]
    torch.testing.assert_close(our_grad.float(), ref_grad.float(), rtol=1e-2, atol=tol)
    # Padded positions get no gradient at all.
    assert our_grad[0, 9:].abs().sum() == 0


@pytest.mark.parametrize("padded", [[], [5, 6], [0, 9]])
def test_blocks_cover_every_row(monkeypatch: pytest.MonkeyPatch, padded: list[int]) -> None:
    # Force blocks of 4 rows over 10 rows: the last block is short. Padding in some blocks and
    # not others: a block without padding skips its masking pass.
    monkeypatch.setattr(loss_module, "_BLOCK_ELEMENTS", 4 * 50)
    torch.manual_seed(1)
    logits = torch.randn(1, 10, 50)
    labels = torch.randint(1, 50, (1, 10))
    labels[0, padded] = PAD_ID
    ours, our_grad = loss_and_grad(sequence_loss, logits, labels, 0.1, 1.0)
    ref, ref_grad = loss_and_grad(reference, logits, labels, 0.1, 1.0)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(our_grad, ref_grad)
    assert our_grad[0, padded].abs().sum() == 0


def test_hand_computed_smoothed_loss() -> None:
    # Two classes. Row 1: logits (0, 0), p = (1/2, 1/2), so -log p is log 2 for both classes and
    # any smoothing gives log 2. Row 2: logits (0, log 3), p = (1/4, 3/4), label 1. Row 3: padding.
    eps = 0.2
    log = math.log
    logits = torch.tensor([[[0.0, 0.0], [0.0, log(3)], [5.0, -5.0]]], requires_grad=True)
    labels = torch.tensor([[1, 1, PAD_ID]])
    row2 = (1 - eps) * -log(0.75) + eps / 2 * (-log(0.25) - log(0.75))
    value = sequence_loss(logits, labels, eps)
    torch.testing.assert_close(value, torch.tensor(log(2) + row2))
    value.backward()
    assert logits.grad is not None
    # d/dx = softmax - (1 - eps) onehot - eps / V
    torch.testing.assert_close(logits.grad[0, 0], torch.tensor([0.5 - 0.1, 0.5 - 0.8 - 0.1]))
    torch.testing.assert_close(logits.grad[0, 1], torch.tensor([0.25 - 0.1, 0.75 - 0.8 - 0.1]))
    torch.testing.assert_close(logits.grad[0, 2], torch.zeros(2))


def test_bf16_autocast_training_step_matches_the_reference_loss() -> None:
    # Under autocast the loss still works in fp32 and its gradient reaches the weights.
    torch.manual_seed(2)
    weight = torch.randn(300, 32, requires_grad=True)
    hidden = torch.randn(2, 7, 32)
    labels = torch.randint(1, 300, (2, 7))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(hidden, weight)
        ours = sequence_loss(logits, labels, 0.1)
    ours.backward()
    assert weight.grad is not None
    ours_grad = weight.grad.clone()
    weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(hidden, weight)
    ref = reference(logits, labels, 0.1)
    ref.backward()
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(ours_grad, weight.grad, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_fused_formulas_match_torch(dtype: torch.dtype, smoothing: float) -> None:
    # The whole-tensor form that --compile fuses on a GPU, run eagerly: the same loss and
    # gradient as F.cross_entropy, padding included.
    torch.manual_seed(3)
    logits = (torch.randn(40, 333) * 4).to(dtype)
    labels = torch.randint(1, 333, (40,))
    labels[5:9] = PAD_ID
    total, lse = loss_module.fused_loss(logits, labels, smoothing)
    scale = torch.tensor(0.25)
    grad = loss_module.fused_grad(logits, labels, lse, smoothing, scale)
    ref, ref_grad = loss_and_grad(reference, logits, labels, smoothing, 0.25)
    torch.testing.assert_close(total, ref, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(lse, torch.logsumexp(logits.float(), dim=1))
    assert grad.dtype == dtype
    tol = {torch.float32: 1e-6, torch.bfloat16: 1e-4, torch.float16: 1e-5}[dtype]
    torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=1e-2, atol=tol)
    assert grad[5:9].abs().sum() == 0


@pytest.mark.slow
def test_compiled_fused_loss_through_sequence_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    # The path training with --compile takes on a GPU, compiled here for the CPU: batches of
    # different lengths share one compilation and match the reference; the vocabulary is a
    # constant of it, so another vocabulary compiles afresh.
    pytest.importorskip("torch._inductor")
    from torch._dynamo.utils import counters

    monkeypatch.setattr(loss_module, "_FUSED_DEVICES", frozenset({"cpu"}))
    loss_module._compiled.cache_clear()
    torch._dynamo.reset()
    counters.clear()
    compiled = []
    try:
        for rows, vocab in ((6, 129), (11, 129), (3, 129), (6, 131)):
            torch.manual_seed(rows)
            logits = torch.randn(2, rows, vocab) * 3
            labels = torch.randint(1, vocab, (2, rows))
            labels[1, -2:] = PAD_ID
            fused = lambda x, y, s: sequence_loss(x, y, s, fused=True)  # noqa: E731
            ours, our_grad = loss_and_grad(fused, logits, labels, 0.1, 0.5)
            ref, ref_grad = loss_and_grad(reference, logits, labels, 0.1, 0.5)
            torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(our_grad, ref_grad, rtol=1e-4, atol=1e-6)
            compiled.append(counters["stats"]["unique_graphs"])
    finally:
        loss_module._compiled.cache_clear()
    assert compiled == [2, 2, 2, 4]  # the loss and its gradient, then both for 131


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("hint", "factor"), [(1 / 37, 1 / 37), (0.25, 0.5), (1.0, 3.0)])
def test_gradient_scaled_ahead_matches_torch(
    dtype: torch.dtype, hint: float, factor: float
) -> None:
    # The training step says which factor backward will bring (1 / tokens); the gradient is
    # right whether that factor comes (no pass in backward) or another does (a loss scaler's).
    torch.manual_seed(4)
    logits = (torch.randn(2, 9, 401) * 4).to(dtype)
    labels = torch.randint(1, 401, (2, 9))
    labels[1, 6:] = PAD_ID
    hinted = lambda x, y, s: sequence_loss(x, y, s, grad_scale=hint)  # noqa: E731
    ours, our_grad = loss_and_grad(hinted, logits, labels, 0.1, factor)
    ref, ref_grad = loss_and_grad(reference, logits, labels, 0.1, factor)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-3)
    assert our_grad.dtype == dtype
    tol = {torch.float32: 1e-6, torch.bfloat16: 1e-4, torch.float16: 1e-5}[dtype]
    torch.testing.assert_close(our_grad.float(), ref_grad.float(), rtol=1e-2, atol=tol * factor)
    assert our_grad[1, 6:].abs().sum() == 0


def test_backward_with_the_expected_factor_makes_no_pass_over_the_gradient() -> None:
    # With the factor it was told, backward hands the saved gradient on as it is; with another
    # it multiplies it once (the profiler counts the element-wise products over it).
    logits = torch.randn(64, 500, requires_grad=True)
    labels = torch.randint(1, 500, (64,))

    def products_in_backward(hint: float, factor: float) -> int:
        loss = sequence_loss(logits, labels, 0.1, grad_scale=hint) * factor
        with torch.profiler.profile() as prof:
            loss.backward()
        logits.grad = None
        return sum(e.name == "aten::mul_" for e in prof.events())

    # 1 / 4919 is not exact in fp32: the factor is compared as backward receives it.
    assert products_in_backward(1 / 4919, 1 / 4919) == 0
    assert products_in_backward(1.0, 1 / 4919) == 1
    # What a training step calls: the summed loss, and the scaled one it calls backward on.
    total, scaled = scaled_loss(logits, labels, 0.1, 1 / 4919)
    torch.testing.assert_close(scaled, total / 4919)
    with torch.profiler.profile() as prof:
        scaled.backward()
    assert not any(e.name == "aten::mul_" for e in prof.events())
    assert logits.grad is not None
    ref, ref_grad = loss_and_grad(reference, logits, labels, 0.1, 1 / 4919)
    torch.testing.assert_close(total, ref.detach(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(logits.grad, ref_grad, rtol=1e-4, atol=1e-9)
