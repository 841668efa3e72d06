"""int8 decoding: each product within its quantisation error, a trained model still right."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from tests.conftest import refusal_lines
from tformer import load_checkpoint, quantize_int8, translate
from tformer.cli.commands import app
from tformer.config import BOS_ID
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.steppers import CachedStepper, RecomputeStepper
from tformer.errors import ConfigError
from tformer.fast.int8 import (
    Int8Linear,
    Int8MultiHeadAttention,
    Int8Transformer,
    _reduce_range,
    check_quantize,
)
from tformer.fast.step import FastTransformer
from tformer.model.attention import MultiHeadAttention
from tformer.training.run import TrainResult


def test_each_output_is_within_the_quantisation_error_computed_by_hand() -> None:
    torch.manual_seed(0)
    weight, bias = torch.randn(48, 32) * 0.1, torch.randn(48)
    x = torch.randn(5, 7, 32)
    got = Int8Linear(weight, bias)(x)
    want = F.linear(x, weight, bias)
    assert got.shape == want.shape == (5, 7, 48)
    # Weights: symmetric per row, step s_w = max|w_row| / 127, so each is off by <= s_w / 2.
    # Inputs: one affine uint8 grid over the call (7 bits without VNNI), off by <= s_x / 2.
    s_w = weight.abs().amax(dim=1) / 127
    levels = 127 if _reduce_range() else 255
    s_x = (x.max().clamp(min=0) - x.min().clamp(max=0)) / levels
    bound = (x.abs().sum(-1, keepdim=True) * s_w / 2
             + s_x / 2 * weight.abs().sum(1)
             + 32 * s_x / 2 * s_w / 2)  # fmt: skip
    assert ((got - want).abs() <= bound * 1.01 + 1e-5).all()
    assert (got - want).abs().max() > 0  # it really is int8


def test_every_linear_product_and_the_projection_become_int8(trained: TrainResult) -> None:
    model = load_checkpoint(trained.run_dir).model
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    n_attention = sum(type(m) is MultiHeadAttention for m in model.modules())
    quantized = quantize_int8(model)
    assert isinstance(quantized, Int8Transformer) and not quantized.training
    assert sum(isinstance(m, torch.nn.Linear) for m in quantized.modules()) == 0
    # Each linear layer, the projection, and each attention's stacked W^Q, W^K, W^V.
    assert sum(isinstance(m, Int8Linear) for m in quantized.modules()) == (
        n_linear + 1 + n_attention
    )
    assert quantize_int8(quantized) is quantized  # once is enough


def test_the_lean_int8_step_is_as_close_to_float32_as_the_int8_forward(
    trained: TrainResult,
) -> None:
    """Cached lean steps (stacked W^Q W^K W^V, folded cross-attention) against the int8
    model's own uncached decode over the whole prefix. The two quantise different
    activations, so they differ by quantisation noise: each is held to the float32 model,
    the lean step within 1.5x the forward's own error."""
    loaded = load_checkpoint(trained.run_dir)
    reference = loaded.model.eval()
    model = quantize_int8(load_checkpoint(trained.run_dir).model)
    assert isinstance(model, FastTransformer)  # decoding takes the lean step
    for sources in (["2021-03-04"], ["2021-03-04", "1999-12-31 and more"]):
        ids = [torch.tensor(loaded.tokenizers.source.encode(s)) for s in sources]
        src = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True)
        errors = {"lean": 0.0, "forward": 0.0}
        with torch.inference_mode():
            encoded = model.encode(src)
            lean, forward = CachedStepper(model, encoded), RecomputeStepper(model, encoded)
            exact = RecomputeStepper(reference, reference.encode(src))
            tokens = torch.full((len(sources),), BOS_ID)
            for _ in range(6):
                want = exact.step(tokens)
                for name, stepper in (("lean", lean), ("forward", forward)):
                    error = float((stepper.step(tokens) - want).abs().max())
                    errors[name] = max(errors[name], error)
                tokens = want.argmax(-1)
        assert 0 < errors["lean"] <= 1.5 * errors["forward"], errors
        # One source is folded; two are not: both paths were held to the reference.
        folded = [layer.cross_attn.folded is not None for layer in lean.cache.layers]
        assert folded == [len(sources) == 1] * len(folded)
    layers = model.decoder.layers
    assert all(isinstance(layer.self_attn, Int8MultiHeadAttention) for layer in layers)


@pytest.mark.slow
def test_a_trained_model_keeps_its_exact_match(trained: TrainResult, toy_data: Path) -> None:
    pairs = [json.loads(line) for line in (toy_data / "test.jsonl").read_text().splitlines()]
    sources = [p["source"] for p in pairs]
    targets = [p["target"] for p in pairs]

    def exact(model: torch.nn.Module, config: DecodingConfig) -> float:
        outputs = translate(model, loaded.tokenizers, sources, config)  # type: ignore[arg-type]
        return sum(o[0].text == t for o, t in zip(outputs, targets, strict=True)) / len(targets)

    loaded = load_checkpoint(trained.run_dir)
    fp32 = {b: exact(loaded.model, DecodingConfig(beam_size=b)) for b in (1, 4)}
    int8_model = quantize_int8(load_checkpoint(trained.run_dir).model)
    int8 = {b: exact(int8_model, DecodingConfig(beam_size=b)) for b in (1, 4)}
    assert fp32[1] > 0.9  # the model learnt the task
    for beams in (1, 4):
        assert int8[beams] >= fp32[beams] - 0.01, (beams, int8, fp32)


def test_only_on_the_cpu_and_only_known_choices() -> None:
    assert check_quantize("int8", torch.device("cpu")) is True
    assert check_quantize("none", torch.device("cuda")) is False
    with pytest.raises(ConfigError, match="--quantize int8 runs on the CPU only"):
        check_quantize("int8", torch.device("cuda"))
    with pytest.raises(ConfigError, match="--quantize 'int4' is not supported"):
        check_quantize("int4", torch.device("cpu"))


def tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def test_the_commands_decode_in_int8_and_leave_the_checkpoint_as_it_was(
    trained: TrainResult, toy_data: Path, tmp_path: Path
) -> None:
    run = str(trained.run_dir)
    before = tree(trained.run_dir)
    runner = CliRunner()
    plain = runner.invoke(app, ["generate", run, "3 1 4", "1 5 9 2"])
    int8 = runner.invoke(app, ["generate", run, "3 1 4", "1 5 9 2", "--quantize", "int8"])
    assert plain.exit_code == int8.exit_code == 0, int8.output
    assert int8.stdout == plain.stdout == "three one four\none five nine two\n"
    compared = runner.invoke(app, ["compare", run, "3 1 4", "--json", "--quantize", "int8"])
    assert compared.exit_code == 0, compared.output
    out = tmp_path / "eval"
    evaluated = runner.invoke(
        app, ["evaluate", run, "--data", str(toy_data), "--quantize", "int8",
              "--limit", "20", "--out", str(out)]
    )  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads((out / "result.json").read_text())["decoding"]["quantize"] == "int8"
    bad = runner.invoke(app, ["generate", run, "3", "--quantize", "int4"])
    assert bad.exit_code == 2 and len(refusal_lines(bad.stderr)) == 1, bad.output
    assert tree(trained.run_dir) == before
