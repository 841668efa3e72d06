"""`tformer train --log-to tensorboard|wandb|mlflow`.

The TensorBoard event files are read back with tensorboard's own reader and hold the values of
metrics.jsonl (same steps, float32 rounding), plus the attention entropy of every layer at each
evaluation, equal to what tformer.analysis.head_statistics measures pair by pair. A missing
package is one line naming the extra, before anything is written; importing tformer loads none.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tformer import checkpoint as ckpt
from tformer.analysis.head_stats import head_statistics
from tformer.cli.commands import app
from tformer.config import BOS_ID
from tformer.data.sources import load_text_pairs
from tformer.training.inputs import encode_splits
from tformer.training.loggers import ENTROPY_PAIRS, log_targets, scalar_name

runner = CliRunner()
ARCH = ["--preset", "tiny", "--n-layers", "2", "--d-ff", "64", "--max-len", "48",
        "--vocab-size", "60"]  # fmt: skip
LOOP = ["--max-steps", "4", "--log-every", "1", "--eval-every", "2", "--save-every", "4",
        "--val-bleu", "8", "--warmup-steps", "2", "--precision", "fp32", "--no-cache"]  # fmt: skip


@pytest.fixture(scope="module")
def logged_run(toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    out = tmp_path_factory.mktemp("loggers") / "run"
    result = runner.invoke(
        app, ["train", "--data", str(toy_data), "--out", str(out), "--log-to", "tensorboard",
              *ARCH, *LOOP]  # fmt: skip
    )
    assert result.exit_code == 0, result.output
    return out


def events(run: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(run / "tensorboard"))
    reader.Reload()
    return {
        tag: {event.step: event.value for event in reader.Scalars(tag)}
        for tag in reader.Tags()["scalars"]
    }


def assert_events_equal_metrics(run: Path) -> dict[str, dict[int, float]]:
    """Every value of metrics.jsonl is in the event files, at its step, and no other."""
    scalars = events(run)
    records = ckpt.read_metrics(run)
    expected: dict[str, dict[int, float]] = {}
    for record in records:
        for key, value in record.items():
            if key in ("step", "total_steps", "time_budget", "best") or value is None:
                continue
            expected.setdefault(scalar_name(key), {})[record["step"]] = float(value)
    for must in ("train/loss", "train/lr", "train/tokens_per_s", "validation/loss",
                 "validation/bleu", "validation/chrf", "validation/exact_match"):  # fmt: skip
        assert must in expected, must
    for tag, by_step in expected.items():
        assert set(scalars[tag]) == set(by_step), tag
        for step, value in by_step.items():
            assert scalars[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-30), (tag, step)
    return scalars


@pytest.mark.slow
def test_event_files_hold_the_metrics_jsonl_values(logged_run: Path) -> None:
    scalars = assert_events_equal_metrics(logged_run)
    assert sorted(scalars["train/loss"]) == [1, 2, 3, 4]
    assert sorted(scalars["validation/loss"]) == [2, 4]


@pytest.mark.slow
def test_a_resumed_run_drops_what_the_interrupted_one_logged_after_its_checkpoint(
    toy_data: Path, tmp_path: Path
) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    out = tmp_path / "run"
    args = ["--log-to", "tensorboard", *ARCH, *LOOP, "--save-every", "2"]
    first = runner.invoke(app, ["train", "--data", str(toy_data), "--out", str(out), *args])
    assert first.exit_code == 0, first.output
    before = events(out)["train/loss"]
    again = runner.invoke(
        app, ["train", "--resume", str(out / "step-000002"), "--log-to", "tensorboard",
              "--no-cache"]  # fmt: skip
    )
    assert again.exit_code == 0, again.output
    scalars = assert_events_equal_metrics(out)
    assert sorted(scalars["train/loss"]) == [1, 2, 3, 4]
    assert scalars["train/loss"] == pytest.approx(before)  # resumed exactly


def test_attention_entropy_per_layer_equals_head_statistics(
    logged_run: Path, toy_data: Path
) -> None:
    scalars = events(logged_run)
    saved = ckpt.load_checkpoint(logged_run)  # step 4: the model of the evaluation at step 4
    cfg = saved.train_config
    texts = load_text_pairs(str(toy_data), source_field=cfg.source_field,
                            target_field=cfg.target_field)  # fmt: skip
    split = encode_splits(
        texts, saved.tokenizers, saved.model_config.max_len, str(toy_data), strict=False
    )["validation"]
    per_pair: dict[str, list[float]] = {}
    for src, tgt in split.pairs[:ENTROPY_PAIRS]:
        with torch.no_grad():
            maps = saved.model(
                torch.tensor([src]), torch.tensor([[BOS_ID, *tgt]]), need_weights=True
            ).attentions
        assert maps is not None
        for kind, layers in (("encoder", maps.encoder), ("decoder", maps.decoder),
                             ("cross", maps.cross)):  # fmt: skip
            stacked = torch.stack([m[0] for m in layers])  # (L, H, R, C)
            stats = head_statistics(stacked, causal=kind == "decoder")
            for layer in range(stacked.shape[0]):
                heads = [s.entropy for s in stats if s.layer == layer]
                tag = f"attention_entropy/{kind}/layer_{layer}"
                per_pair.setdefault(tag, []).append(sum(heads) / len(heads))
    assert len(per_pair) == 6  # 2 layers of each kind
    for tag, values in per_pair.items():
        assert sorted(scalars[tag]) == [2, 4], tag
        assert scalars[tag][4] == pytest.approx(sum(values) / len(values), rel=1e-5), tag
        assert scalars[tag][4] > 0


def test_log_to_is_repeatable_and_comma_separated() -> None:
    assert log_targets(["tensorboard,wandb", "mlflow", "wandb"]) == (
        "tensorboard",
        "wandb",
        "mlflow",
    )
    result = runner.invoke(app, ["train", "--log-to", "neptune", "--max-steps", "1"])
    assert result.exit_code == 2
    assert "--log-to 'neptune' is unknown; choose from tensorboard, wandb, mlflow" in (
        result.stderr
    )


@pytest.mark.parametrize("target", ["tensorboard", "wandb", "mlflow"])
def test_a_missing_package_is_one_line_naming_the_extra(
    target: str, toy_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, target, None)  # import fails as if it were absent
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["train", "--data", str(toy_data), "--out", str(out), "--log-to", target, *ARCH,
              *LOOP]  # fmt: skip
    )
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert f"--log-to {target} needs the {target} package" in lines[0]
    assert f'pip install "tformer[{target}]"' in lines[0]
    assert not out.exists()  # refused before anything was written


@pytest.mark.slow
def test_importing_tformer_loads_no_logging_package() -> None:
    code = (
        "import sys, tformer, tformer.cli.commands, tformer.training.run, "
        "tformer.training.loggers; "
        "print(sorted({'tensorboard', 'torch.utils.tensorboard', 'wandb', 'mlflow'} "
        "& set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
