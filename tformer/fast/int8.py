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
layer norms and embeddings stay float32. A quantised model decodes through the lean cached
step of ``tformer.fast.accelerate``: self-attention's W^Q, W^K and W^V as one int8 product,
and cross-attention of one source folded (in float32, from the dequantised W^Q and W^O).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

from tformer.device import cpuinfo
from tformer.errors import ConfigError
from tformer.fast.attention import FastMultiHeadAttention, stacked_qkv
from tformer.fast.step import FastTransformer, LeanStep
from tformer.model.families import DecoderOnlyTransformer, EncoderOnlyTransformer
from tformer.model.transformer import Transformer, TransformerBase

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
        self._unpacked: tuple[Tensor, Tensor, Tensor | None] | None = None  # see rows()

    def dequantized(self) -> tuple[Tensor, Tensor | None]:
        """The float32 weight its int8 one stands for (int8 x scale), and the bias."""
        qweight, bias = torch.ops.quantized.linear_unpack(self._packed)
        return qweight.dequantize(), bias

    def rows(self, ids: Tensor) -> Int8Rows:
        """The product with the output rows ``ids`` alone (a lexical shortlist's), their int8
        values and scales as they are; unpacked once, since unpacking costs more than packing
        the rows kept."""
        if self._unpacked is None:
            qweight, bias = torch.ops.quantized.linear_unpack(self._packed)
            scales = qweight.q_per_channel_scales().float()
            self._unpacked = (qweight.int_repr(), scales, bias)
        values, scales, bias = self._unpacked
        kept_bias = None if bias is None else bias[ids]
        return Int8Rows(values[ids], scales[ids], kept_bias, self._reduce_range)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).float().contiguous()
        y = torch.ops.quantized.linear_dynamic(flat, self._packed, self._reduce_range)
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class Int8Rows(nn.Module):
    """Some output rows of an :class:`Int8Linear`, packed with one scale of 1 and their own
    scales applied to the product: the same int8 values and the same result, and packing
    them runs several times faster than packing them per channel (docs/performance.md), which
    matters when it happens for every batch."""

    def __init__(
        self, values: Tensor, scales: Tensor, bias: Tensor | None, reduce_range: bool
    ) -> None:
        super().__init__()
        self.out_features = values.size(0)
        self.scales, self.bias = scales, bias
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kept = torch._make_per_tensor_quantized_tensor(values, 1.0, 0)
            self._packed = torch.ops.quantized.linear_prepack(kept, None)
        self._reduce_range = reduce_range

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).float().contiguous()
        y = torch.ops.quantized.linear_dynamic(flat, self._packed, self._reduce_range)
        y = y.mul_(self.scales) if self.bias is None else torch.addcmul(self.bias, y, self.scales)
        return y.view(*shape[:-1], self.out_features)


class Int8MultiHeadAttention(FastMultiHeadAttention):
    """:class:`FastMultiHeadAttention` over :class:`Int8Linear` projections.

    ``qkv`` is W^Q stacked on W^K and W^V, quantised once (per output channel, so each row's
    scale is the one its own projection has): a decoding step's queries, keys and values in
    one product, as in float32.
    """

    qkv: Int8Linear

    def qkv_step(self, query: Tensor) -> Tensor:
        return self.qkv.forward(query)

    def fold_weights(self) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        q_weight, q_bias = _float(self.q_proj)
        o_weight, o_bias = _float(self.out_proj)
        return q_weight, q_bias, o_weight, o_bias


def _float(layer: nn.Module) -> tuple[Tensor, Tensor | None]:
    assert isinstance(layer, Int8Linear)
    return layer.dequantized()


class Int8Model(TransformerBase):
    """A model whose output projection is an :class:`Int8Linear` too; mixed in before the
    family's class, so each family keeps its own ``encode`` / ``decode``."""

    int8_projection: Int8Linear

    def project(self, hidden: Tensor) -> Tensor:
        return self.int8_projection(hidden)

    def projection_onto(self, ids: Tensor) -> Callable[[Tensor], Tensor]:
        return self.int8_projection.rows(ids)


class Int8Transformer(Int8Model, FastTransformer):
    """:class:`FastTransformer` whose output projection is an :class:`Int8Linear` too."""


class Int8DecoderOnlyTransformer(Int8Model, LeanStep, DecoderOnlyTransformer):
    """A decoder-only model (GPT) with int8 layers: its own ``encode`` / ``decode``, the lean
    step and the int8 projection."""


class Int8EncoderOnlyTransformer(Int8Model, EncoderOnlyTransformer):
    """An encoder-only model (BERT) with int8 layers: the encoder's products, the masked-LM
    head's dense layer and the output projection (its LayerNorm stays float32)."""

    def project(self, hidden: Tensor) -> Tensor:
        if self.mlm_transform is not None:
            hidden = self.mlm_transform(hidden)
        return self.int8_projection(hidden)


# Each family's int8 class, keyed by the family's own class.
_INT8_FAMILIES: dict[type[TransformerBase], type[TransformerBase]] = {
    Transformer: Int8Transformer,
    DecoderOnlyTransformer: Int8DecoderOnlyTransformer,
    EncoderOnlyTransformer: Int8EncoderOnlyTransformer,
}


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


def quantize_int8(model: TransformerBase) -> TransformerBase:
    """Quantise ``model`` (in place, on the CPU) for int8 inference and return it.

    Every ``nn.Linear`` becomes an :class:`Int8Linear` and so does the output projection (the
    target embedding when tied, the embedding itself staying float32 for the lookup; with
    Marian's logits bias as its bias). The model
    is put in eval mode with gradients off: it is for decoding only.
    """
    from tformer.fast.accelerate import accelerate, forget_fast_weights

    if is_quantized(model):
        return model
    if next(model.parameters()).device.type != "cpu":
        raise ConfigError("int8 decoding runs on the CPU only: load the model with --device cpu")
    accelerate(model).eval().requires_grad_(False)
    forget_fast_weights(model)
    projection = Int8Linear(model.output_weight(), model.logits_bias)
    for attention in list(model.modules()):
        if type(attention) is FastMultiHeadAttention:
            fused = Int8Linear(*stacked_qkv(attention))
            attention.__class__ = Int8MultiHeadAttention
            attention.qkv = fused
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear(child.weight, child.bias))
    model.__class__ = _INT8_FAMILIES[_family(model)]
    model.int8_projection = projection
    return model


def _family(model: TransformerBase) -> type[TransformerBase]:
    """The family's own class among ``model``'s (accelerate swaps in a subclass of it)."""
    return next(cls for cls in type(model).__mro__ if cls in _INT8_FAMILIES)


def is_quantized(model: nn.Module) -> bool:
    return isinstance(model, Int8Model)
