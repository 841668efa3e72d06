"""Mixed precision, torch.compile and --dry-run: the fast paths against the fp32 reference.

Tolerances: bf16 keeps 8 bits of mantissa (relative error ~4e-3 per rounding), so a forward
pass through a few layers agrees with fp32 to a few hundredths; training losses over a few
steps agree to a few percent. Compiled fp32 agrees with eager fp32 to float rounding (1e-4).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from tests.conftest import spoil_training_loss, tiny_model
from tformer.checkpoint.files import WEIGHTS
from tformer.checkpoint.run_dir import resolve
from tformer.checkpoint.store import load_checkpoint
from tformer.cli.commands import app
from tformer.config import ModelConfig, TrainConfig, preset
from tformer.errors import ConfigError
from tformer.model import Transformer
from tformer.training import precision as precision_module
from tformer.training.precision import resolve_precision
from tformer.training.run import train

CPU = torch.device("cpu")


def test_auto_precision_follows_the_cpu_and_the_model_width(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wide, narrow = preset("small"), preset("tiny")
    monkeypatch.setattr(precision_module, "cpu_has_bf16", lambda: True)
    assert resolve_precision("auto", CPU, wide).name == "bf16"
    assert resolve_precision("auto", CPU, narrow).name == "fp32"  # casts would cost more
    monkeypatch.setattr(precision_module, "cpu_has_bf16", lambda: False)
    assert resolve_precision("auto", CPU, wide).name == "fp32"
    assert resolve_precision("fp32", CPU, wide).dtype is None
    assert resolve_precision("bf16", CPU, narrow).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("vendor", "flags", "faster"),
    [
        ("GenuineIntel", "avx2 avx512f avx512_bf16 amx_bf16 amx_tile", True),
        ("GenuineIntel", "avx2 avx512f avx512_bf16 avx512_fp16", False),  # AMX hidden
        ("AuthenticAMD", "avx2 avx512f avx512_bf16", True),  # Zen 4 and later
        ("AuthenticAMD", "avx2 fma", False),
        ("GenuineIntel", "avx2 fma", False),
    ],
)
def test_cpu_bf16_is_chosen_where_its_products_are_faster(
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    vendor: str,
    flags: str,
    faster: bool,
) -> None:
    info = {"vendor_id": vendor, "flags": f"fpu sse sse2 {flags}"}
    monkeypatch.setattr(precision_module, "cpuinfo", lambda: info)
    precision_module.cpu_has_bf16.cache_clear()  # read once per process; this CPU's afterwards
    request.addfinalizer(precision_module.cpu_has_bf16.cache_clear)
    assert precision_module.cpu_has_bf16() is faster
    expected = "bf16" if faster else "fp32"
    assert resolve_precision("auto", CPU, preset("small")).name == expected


def test_impossible_precisions_are_refused() -> None:
    with pytest.raises(ConfigError, match="--precision fp16 needs a CUDA GPU"):
        resolve_precision("fp16", CPU)
    with pytest.raises(ConfigError, match="must be one of auto, fp32, bf16, fp16"):
        resolve_precision("fp8", CPU)
    with pytest.raises(ConfigError, match="--precision 'half'"):
        TrainConfig(precision="half")  # type: ignore[arg-type]


def test_cli_refuses_fp16_on_a_cpu_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["train", "--preset", "tiny", "--precision", "fp16", "--device", "cpu",
         "--out", str(tmp_path / "r")],
    )
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: --precision fp16 needs a CUDA GPU (this run is on cpu); use bf16 or fp32"
    ]
    assert not (tmp_path / "r").exists()


def test_bf16_autocast_forward_matches_fp32() -> None:
    torch.manual_seed(0)
    config = ModelConfig(
        src_vocab_size=300, tgt_vocab_size=300, d_model=64, n_heads=4, n_encoder_layers=2,
        n_decoder_layers=2, d_ff=128, dropout=0.0,
    )  # fmt: skip
    model = Transformer(config).eval()
    src = torch.randint(4, 300, (3, 11))
    tgt = torch.randint(4, 300, (3, 9))
    with torch.no_grad():
        reference = model(src, tgt).logits
        with resolve_precision("bf16", CPU).autocast():
            fast = model(src, tgt).logits
    assert fast.dtype == torch.bfloat16  # it really ran in bf16
    torch.testing.assert_close(fast.float(), reference, atol=0.08, rtol=0.05)
    # The prediction itself barely moves: the arg-max agrees almost everywhere.
    assert (fast.argmax(-1) == reference.argmax(-1)).float().mean() > 0.95


def _train(data: Path, out: Path, **overrides: object) -> list[float]:
    config = TrainConfig(
        data=str(data), max_tokens=512, lr=3e-3, warmup_steps=5, max_steps=12, log_every=3,
        eval_every=100, save_every=100, label_smoothing=0.0, seed=0, **overrides,
    )  # fmt: skip
    train(tiny_model(), config, out=out, vocab_size=64)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


def test_bf16_training_follows_the_fp32_trajectory(toy_data: Path, tmp_path: Path) -> None:
    fp32 = _train(toy_data, tmp_path / "fp32", precision="fp32")
    bf16 = _train(toy_data, tmp_path / "bf16", precision="bf16")
    assert len(fp32) == len(bf16) == 4
    assert bf16[-1] < bf16[0] * 0.8  # it learns
    for a, b in zip(fp32, bf16, strict=True):
        assert abs(a - b) / a < 0.03, (fp32, bf16)
    records = (tmp_path / "bf16" / "metrics.jsonl").read_text()
    assert '"skipped_steps": 0' in records
    # Weights stay fp32 whatever the compute precision.
    with safe_open(str(resolve(tmp_path / "bf16") / WEIGHTS), "pt") as handle:
        assert {handle.get_tensor(k).dtype for k in handle.keys()} == {torch.float32}


def test_mixed_precision_skips_and_counts_an_overflowed_step(
    toy_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp32 stops on a non-finite step (test_reliability); mixed precision skips it."""
    spoil_training_loss(monkeypatch, {4, 5}, float("inf"))
    _train(toy_data, tmp_path / "run", precision="bf16")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
               .splitlines()]  # fmt: skip
    skipped = [r["skipped_steps"] for r in records if "skipped_steps" in r]
    assert skipped == [0, 2, 2, 2]  # steps 4 and 5 skipped, logged at step 6
    weights = load_checkpoint(tmp_path / "run").model.state_dict()
    assert all(torch.isfinite(w).all() for w in weights.values())


@pytest.mark.slow
def test_compiled_training_matches_eager_and_saves_plain_names(
    toy_data: Path, tmp_path: Path
) -> None:
    pytest.importorskip("torch._inductor")
    eager = _train(toy_data, tmp_path / "eager", precision="fp32")
    compiled = _train(toy_data, tmp_path / "compiled", precision="fp32", compile=True)
    for a, b in zip(eager, compiled, strict=True):
        assert abs(a - b) < 1e-3 * a, (eager, compiled)
    with safe_open(str(resolve(tmp_path / "compiled") / WEIGHTS), "pt") as handle:
        names = list(handle.keys())
    assert names and not any("_orig_mod" in n or n.startswith("module.") for n in names)
    load_checkpoint(tmp_path / "compiled")  # loads into a plain model


def test_dry_run_reports_speed_memory_and_the_largest_batch(tmp_path: Path) -> None:
    out = tmp_path / "never"
    result = CliRunner().invoke(
        app,
        ["train", "--dry-run", "--preset", "tiny", "--max-len", "32", "--max-tokens", "512",
         "--vocab-size", "200", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "16 x 32 = 512 tokens" in text
    assert "target tokens/s" in text and "peak memory" in text
    assert "largest --max-tokens (estimate)" in text
    assert "512 (fits)" in text
    assert not out.exists()  # a dry run writes nothing


# Each measurement runs in a fresh process: resident memory in a long-lived one depends on
# what earlier work left mapped, which can hide a batch's growth.
DRY_RUN_PROBE = """
import json, sys
from tformer.config import TrainConfig, preset
from tformer.fast.malloc import keep_freed_memory
keep_freed_memory()  # as the command line does: freed memory stays in the process
from tformer.training.dryrun import measure_batch_limits
model = preset("tiny", d_model=64, n_heads=4, n_encoder_layers=1, n_decoder_layers=1,
               d_ff=128, dropout=0.0, max_len=64)
r = measure_batch_limits(model, TrainConfig(max_tokens=int(sys.argv[1])), vocab_size=200, steps=2)
print(json.dumps({"rows": r.rows, "grown": r.peak_bytes - r.baseline_bytes,
                  "tokens_per_s": r.tokens_per_s, "fit": r.max_tokens_fit}))
"""


@pytest.mark.slow
def test_dry_run_measures_memory_that_grows_with_the_batch() -> None:
    def measure(max_tokens: int) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", DRY_RUN_PROBE, str(max_tokens)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return json.loads(out.strip().splitlines()[-1])

    small, large = measure(256), measure(8192)
    assert (small["rows"], large["rows"]) == (4, 128)
    # 32 times the rows: many times the memory (the warm-up's freed batch is not counted as
    # already there), and so about the same memory per token, whichever batch measured it.
    assert large["grown"] > 8 * small["grown"] > 0
    assert large["fit"] is not None and small["fit"] is not None
    assert 1 / 1.5 < large["fit"] / small["fit"] < 1.5, (small, large)
    assert large["tokens_per_s"] > 0
