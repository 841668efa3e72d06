"""int8 CPU decoding: every linear product with int8 weights, the vocabulary projection included.

Each weight is stored as int8 per output channel (symmetric: scale = max |w| / 127 for each
row), and each call quantises its input on the fly (one scale and zero point per call) and
runs torch's quantized dynamic linear kernel (fbgemm on x86, which accumulates in int32 and
returns float32). That kernel ran 2-6x faster than float32 ``F.linear`` for the shapes of a
decoding step (docs/performance.md). CPUs without VNNI instructions add pairs of 8-bit
products in 16 bits, which can saturate, so there the inputs use 7 bits (``reduce_range``),
as torch does by default.

Quantising is for inference only: it happens on load (``--quantize int8``), the checkpoint
stays float32, and a quantised model cannot be trained or saved. Attention scores, softmax,
layer norms and embeddings stay float32. The speed-ups of ``tformer.fast.accelerate`` read
the float weights directly, so a quantised model decodes on the plain (cached) path.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from tformer.device import cpuinfo
from tformer.errors import ConfigError
from tformer.model.transformer import Transformer

QUANTIZE_CHOICES = ("none", "int8")


def _reduce_range() -> bool:
    flags = cpuinfo().get("flags", "").split()
    return not any("vnni" in flag for flag in flags)


class Int8Linear(nn.Module):
    """``F.linear(x, W, b)`` with W in int8 per output channel and x quantised per call."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        weight = weight.detach().float().contiguous()
        self.in_features, self.out_features = weight.size(1), weight.size(0)
        scale = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12).double()
        zero = torch.zeros(weight.size(0), dtype=torch.long)
        b = None if bias is None else bias.detach().float().contiguous()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notice that these kernels move to torchao
            qweight = torch.quantize_per_channel(weight, scale, zero, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(qweight, b)
        self._reduce_range = _reduce_range()

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).float().contiguous()
        y = torch.ops.quantized.linear_dynamic(flat, self._packed, self._reduce_range)
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class Int8Transformer(Transformer):
    """:class:`Transformer` whose output projection is an :class:`Int8Linear` too."""

    int8_projection: Int8Linear

    def project(self, hidden: Tensor) -> Tensor:
        return self.int8_projection(hidden)


def check_quantize(quantize: str, device: torch.device) -> bool:
    """``--quantize``: True for int8 (CPU only), False for none; anything else is refused."""
    if quantize not in QUANTIZE_CHOICES:
        raise ConfigError(
            f"--quantize {quantize!r} is not supported; choose one of {', '.join(QUANTIZE_CHOICES)}"
        )
    if quantize == "int8" and device.type != "cpu":
        raise ConfigError(
            f"--quantize int8 runs on the CPU only, not --device {device}; "
            "drop --quantize or use --device cpu"
        )
    return quantize == "int8"


def quantize_int8(model: Transformer) -> Int8Transformer:
    """Quantise ``model`` (in place, on the CPU) for int8 decoding and return it.

    Every ``nn.Linear`` becomes an :class:`Int8Linear` and so does the output projection (the
    target embedding when tied; the embedding itself stays float32 for the lookup). The model
    is put in eval mode with gradients off: it is for decoding only.
    """
    from tformer.fast.accelerate import plain

    if isinstance(model, Int8Transformer):
        return model
    if next(model.parameters()).device.type != "cpu":
        raise ConfigError("int8 decoding runs on the CPU only: load the model with --device cpu")
    plain(model).eval().requires_grad_(False)
    projection = Int8Linear(model.output_weight(), None)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, Int8Linear(child.weight, child.bias))
    model.__class__ = Int8Transformer
    model.int8_projection = projection
    return model  # type: ignore[return-value]


def is_quantized(model: nn.Module) -> bool:
    return isinstance(model, Int8Transformer)
