"""The training objective: label-smoothed cross-entropy over the non-padding labels.

With smoothing ε over a vocabulary of V, the target distribution puts 1 - ε on the reference
token and ε / V on every token (section 5.4 of the paper; the same definition as
``torch.nn.functional.cross_entropy(label_smoothing=ε)``). Per position, with
lse = log Σ_j exp(x_j):

    loss     = (1 - ε)(lse - x_y) + (ε / V) Σ_j (lse - x_j) = lse - (1 - ε) x_y - (ε / V) Σ_j x_j
    ∂loss/∂x = softmax(x) - (1 - ε) onehot(y) - ε / V

:class:`SmoothedCrossEntropy` computes both in one pass over the logits, a block of rows at a
time. Through ``F.cross_entropy`` the same loss made a full-size fp32 copy of the logits, their
log-softmax, and a backward pass over both: about a third of a small model's CPU training step,
because the (tokens x V) logits are by far the largest tensor of the model. Here each block stays
in cache, the exponentials are taken once, and what is kept for backward is the gradient itself,
in the logits' own dtype.

With ``fused=True`` on a GPU (training with ``--compile``) the same formulas are compiled with
``torch.compile``: forward reads the logits for the loss and each row's lse, backward reads them
once more and writes the gradient, already scaled by grad_output. The blocks take a dozen passes
over an fp32 copy of them (docs/performance.md). One compilation serves any number of rows of
one vocabulary.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from tformer.config import PAD_ID

_BLOCK_ELEMENTS = 1 << 20  # fp32 rows per block: 4 MB, about one core's share of cache
# On a GPU each block costs a dozen kernel launches whatever its size, and a 25,000-token batch
# in 4 MB blocks spent more time launching them than the model's step (docs/performance.md):
# there blocks are as large as a bounded fp32 workspace allows.
_DEVICE_BLOCK_ELEMENTS = 1 << 28  # 1 GB of fp32
# Where ``fused=True`` compiles the loss; on the CPU the blocks above are the faster code.
_FUSED_DEVICES = frozenset({"cuda"})


def _gradient_dtype(dtype: torch.dtype) -> torch.dtype:
    # bf16 keeps fp32's range, so its gradient can be stored as is; fp16's cannot hold the
    # tiny probabilities of a large vocabulary, so it is kept in fp32 until backward.
    return dtype if dtype != torch.float16 else torch.float32


def fused_loss(logits: Tensor, labels: Tensor, smoothing: float) -> tuple[Tensor, Tensor]:
    """The summed loss and each row's lse as whole-tensor expressions, for a compiler to fuse
    into one pass over the logits (eagerly it would materialise fp32 copies of them)."""
    x = logits.float()
    keep = labels != PAD_ID
    safe = labels.masked_fill(~keep, 0)[:, None]
    lse = torch.logsumexp(x, dim=1)
    loss = lse - (1.0 - smoothing) * x.gather(1, safe).squeeze(1)
    if smoothing:
        loss = loss - (smoothing / x.size(1)) * x.sum(dim=1)
    return loss.masked_fill(~keep, 0.0).sum(), lse


def fused_grad(
    logits: Tensor, labels: Tensor, lse: Tensor, smoothing: float, scale: Tensor
) -> Tensor:
    """``scale`` times the loss's gradient, from the logits and :func:`fused_loss`'s lse: one
    read of the logits and one write of the gradient, in their dtype, rounded once."""
    x = logits.float()
    vocab = x.size(1)
    keep = labels != PAD_ID
    onehot = torch.arange(vocab, device=x.device)[None, :] == labels[:, None]
    grad = torch.exp(x - lse[:, None]) - smoothing / vocab - (1.0 - smoothing) * onehot
    return torch.where(keep[:, None], grad * scale, 0.0).to(logits.dtype)


@functools.cache
def _compiled() -> tuple[Callable[..., tuple[Tensor, Tensor]], Callable[..., Tensor]]:
    # Compiled on first use; :func:`_any_rows` keeps one compilation for every batch.
    return torch.compile(fused_loss), torch.compile(fused_grad)


def _any_rows(*tensors: Tensor) -> None:
    """Compile for any number of rows but this vocabulary: with the vocabulary a constant the
    compiler indexes each row without dividing by a runtime size, and the passes over the
    logits run faster than with every size dynamic (docs/performance.md)."""
    for tensor in tensors:
        torch._dynamo.maybe_mark_dynamic(tensor, 0)


@functools.cache
def _has_triton() -> bool:
    # Looked up once: the loss asks at every training step.
    return importlib.util.find_spec("triton") is not None


def fusable(device: torch.device) -> bool:
    """Whether ``fused=True`` compiles the loss on ``device`` (a GPU with Triton, which the
    compiler writes GPU kernels in)."""
    if device.type not in _FUSED_DEVICES:
        return False
    return device.type != "cuda" or _has_triton()


class SmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy of (N, V) logits against (N,) labels."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        labels: Tensor,
        smoothing: float,
        fused: bool = False,
        grad_scale: float = 1.0,
    ) -> Tensor:
        n, vocab = logits.shape
        keep_dtype = _gradient_dtype(logits.dtype)
        want_grad = ctx.needs_input_grad[0]
        ctx.logits_dtype = logits.dtype
        ctx.fused = fused and fusable(logits.device)
        if ctx.fused:
            # The gradient waits for backward, where grad_output's factor is known: it is then
            # written once, already scaled (scaling a saved gradient cost another two passes).
            _any_rows(logits, labels)
            with torch.autocast(logits.device.type, enabled=False):
                fused_total, lse = _compiled()[0](logits, labels, smoothing)
            ctx.smoothing = smoothing
            ctx.save_for_backward(logits, labels, lse)
            return fused_total
        # The gradient is stored already multiplied by the factor backward is expected to bring
        # (the step's 1 / tokens), in the pass that computes it: scaling it in backward was one
        # more read and write of a (tokens x V) tensor. Kept in fp32, as backward receives it.
        grad = None
        if want_grad:
            ctx.grad_scale = float(torch.tensor(grad_scale, dtype=torch.float32))
            grad = torch.empty_like(logits, dtype=keep_dtype)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        elements = _BLOCK_ELEMENTS if logits.device.type == "cpu" else _DEVICE_BLOCK_ELEMENTS
        rows = max(1, elements // vocab)
        # One fp32 workspace for every block: a fresh multi-megabyte tensor per block would be
        # handed out by the system afresh each time and cost page faults on first touch.
        work = torch.empty(min(rows, n), vocab, dtype=torch.float32, device=logits.device)
        with torch.autocast(logits.device.type, enabled=False):  # the blocks work in fp32
            for start in range(0, n, rows):
                block = logits[start : start + rows]
                x = work[: block.size(0)]
                x.copy_(block)
                y = labels[start : start + rows]
                keep = y != PAD_ID
                safe_y = y.masked_fill(~keep, 0)[:, None]
                target_logit = x.gather(1, safe_y).squeeze(1)
                loss = -(1.0 - smoothing) * target_logit
                if smoothing:
                    loss -= (smoothing / vocab) * x.sum(dim=1)
                peak = x.amax(dim=1, keepdim=True)
                x.sub_(peak).exp_()
                sums = x.sum(dim=1, keepdim=True)
                loss += (peak + sums.log()).squeeze(1)  # + lse
                total += loss.masked_fill(~keep, 0.0).sum()
                if grad is not None:
                    x.mul_(sums.reciprocal_().mul_(grad_scale))  # softmax, scaled
                    if smoothing:
                        x.sub_(grad_scale * smoothing / vocab)
                    onehot = -(1.0 - smoothing) * grad_scale
                    x.scatter_add_(1, safe_y, x.new_full(safe_y.shape, onehot))
                    # A pass over the block only where it has padding; a CPU reads the mask
                    # for free, elsewhere asking would wait for the device.
                    if x.device.type != "cpu" or not bool(keep.all()):
                        x.masked_fill_(~keep[:, None], 0.0)
                    grad[start : start + rows] = x
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(
        ctx: Any, grad_output: Tensor
    ) -> tuple[Tensor | None, None, None, None, None]:
        if ctx.fused:
            logits, labels, lse = ctx.saved_tensors
            _any_rows(logits, labels, lse)
            with torch.autocast(logits.device.type, enabled=False):
                scaled = _compiled()[1](logits, labels, lse, ctx.smoothing, grad_output.float())
            return scaled, None, None, None, None
        (grad,) = ctx.saved_tensors
        # On a CPU the factor is read for free; elsewhere asking would wait for the device.
        if grad_output.device.type != "cpu" or float(grad_output) != ctx.grad_scale:
            # Another factor (a loss scaler's, or no hint given): the 0-dim fp32 ratio is
            # applied in fp32 arithmetic. In place: the saved gradient is used once (a second
            # backward would be refused by autograd's version check instead of reading a
            # scaled tensor).
            grad.mul_(grad_output / ctx.grad_scale)
        return grad.to(ctx.logits_dtype), None, None, None, None


def sequence_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float = 0.0,
    *,
    fused: bool = False,
    grad_scale: float = 1.0,
) -> torch.Tensor:
    """Summed cross-entropy over the non-padding labels (divide by their count for a mean).

    Args:
        logits: (B, T, V); labels: (B, T) with PAD_ID where nothing is predicted.
        fused: compile the loss where :func:`fusable` (training with ``--compile``).
        grad_scale: the factor the loss will be multiplied by before ``backward`` (a step's
            1 / tokens). Any factor gives the right gradient; this one costs no extra pass.

    Returns:
        A float32 scalar.
    """
    flat = logits.reshape(-1, logits.size(-1))
    return SmoothedCrossEntropy.apply(
        flat, labels.reshape(-1), float(label_smoothing), fused, float(grad_scale)
    )


def scaled_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float,
    factor: float,
    *,
    fused: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed loss and the loss times ``factor`` (a step's 1 / tokens), which a training
    step calls ``backward`` on: its gradient is scaled in the pass that computes it.

    Every training step (the loop, the dry run, the speed benchmark) goes through this.
    """
    total = sequence_loss(logits, labels, label_smoothing, fused=fused, grad_scale=factor)
    return total, total * factor
