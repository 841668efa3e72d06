"""`tformer train --init-from CKPT`: fine-tuning from a trained checkpoint.

The new run starts from the checkpoint's weights and tokenizer (its first logged loss is the
checkpoint model's loss on the first batch), with a fresh optimizer, schedule and step count;
it is an ordinary run that resumes exactly. Contradicting architecture or tokenizer settings,
another tokenizer and --resume with it are refused in one line, and nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from typer.testing import CliRunner

import tformer
from tformer import checkpoint as ckpt
from tformer.cli.commands import app
from tformer.config import PAD_ID, RECIPES, TrainConfig
from tformer.data.batching import BatchPlan, collate
from tformer.data.sources import load_text_pairs
from tformer.data.tokenizer import train_tokenizer
from tformer.errors import ConfigError
from tformer.training.inputs import encode_splits
from tformer.training.optim import lr_at

runner = CliRunner()
ARCH = ["--preset", "tiny", "--n-layers", "1", "--d-ff", "64", "--max-len", "48",
        "--vocab-size", "60", "--dropout", "0", "--attention-dropout", "0"]  # fmt: skip
COMMON = ["--precision", "fp32", "--no-cache", "--warmup-steps", "2", "--val-bleu", "0"]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha(p) for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def base(toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model trained for a few steps: the checkpoint the tests fine-tune."""
    out = tmp_path_factory.mktemp("init-from") / "base"
    result = runner.invoke(
        app, ["train", "--data", str(toy_data), "--out", str(out), "--max-steps", "6",
              "--log-every", "3", "--eval-every", "6", "--save-every", "6",
              *ARCH, *COMMON]  # fmt: skip
    )
    assert result.exit_code == 0, result.output
    return out


def fine_tune(base: Path, data: Path, out: Path, *args: str) -> None:
    result = runner.invoke(
        app, ["train", "--init-from", str(base), "--data", str(data), "--out", str(out),
              "--log-every", "1", "--eval-every", "100", "--lr", "1e-3", "--seed", "5",
              "--label-smoothing", "0.1", *COMMON, *args]  # fmt: skip
    )
    assert result.exit_code == 0, result.output


def first_batch_loss(checkpoint: Path, data: Path, cfg: TrainConfig) -> float:
    """The loss of the checkpoint's model on the first batch a run over ``data`` takes,
    computed here with torch's own label-smoothed cross-entropy."""
    start = ckpt.load_checkpoint(checkpoint)
    texts = load_text_pairs(str(data), source_field=cfg.source_field, target_field=cfg.target_field)
    max_len = start.model_config.max_len
    splits = encode_splits(texts, start.tokenizers, max_len, str(data), strict=False)
    plan = BatchPlan(splits["train"].pairs, cfg.max_tokens, cfg.seed)
    batch = collate([plan.pairs[i] for i in plan.epoch(0)[0]])
    with torch.no_grad():
        logits = start.model(batch.src, batch.tgt_in).logits
    loss = F.cross_entropy(
        logits.flatten(0, 1).double(),
        batch.tgt_out.flatten(),
        ignore_index=PAD_ID,
        label_smoothing=cfg.label_smoothing,
        reduction="sum",
    )
    return float(loss) / batch.n_target_tokens


@pytest.mark.slow
def test_fine_tuning_starts_from_the_checkpoint_with_a_fresh_optimizer(
    base: Path, toy_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "tuned"
    fine_tune(base, toy_data, out, "--max-steps", "3", "--save-every", "3")
    records = [r for r in ckpt.read_metrics(out) if "loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3]  # a fresh step count
    saved = ckpt.load_checkpoint(out)
    cfg = saved.train_config
    assert saved.step == 3 and saved.model_config == ckpt.load_checkpoint(base).model_config
    # The first step's loss is the checkpoint model's loss on that batch.
    assert records[0]["loss"] == pytest.approx(first_batch_loss(base, toy_data, cfg), rel=1e-5)
    # A fresh schedule: the learning rate of step 1 of this run's own schedule.
    assert records[0]["lr"] == pytest.approx(lr_at(1, saved.model_config, cfg, 3, None))
    # A fresh optimizer: Adam has taken 3 steps, not the base run's 6 + 3.
    state = json.loads((saved.path / "trainer_state.json").read_text())
    tensors = load_file(str(saved.path / "optimizer.safetensors"))
    adam_steps = {float(v) for k, v in tensors.items() if k.endswith(".step")}
    assert adam_steps == {3.0}
    assert state["position"]["step"] == 3
    # Where it started is recorded (and shown by `tformer info`).
    start = ckpt.resolve(base)
    assert state["init_from"] == {
        "path": str(start.resolve()),
        "step": 6,
        "weights_sha256": sha(start / "model.safetensors"),
    }
    shown = runner.invoke(app, ["info", str(out)])
    assert shown.exit_code == 0 and f"fine-tuned from {start.resolve()} (step 6" in shown.stdout
    # The tokenizer is the checkpoint's, file for file.
    assert sha(saved.path / "tokenizer.json") == sha(start / "tokenizer.json")


@pytest.mark.slow
def test_a_fine_tuned_run_resumes_exactly(base: Path, toy_data: Path, tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    fine_tune(base, toy_data, whole, "--max-steps", "5", "--save-every", "3")
    cut = tmp_path / "cut"
    shutil.copytree(whole, cut)
    result = runner.invoke(app, ["train", "--resume", str(cut / "step-000003"), "--no-cache"])
    assert result.exit_code == 0, result.output
    # Tensor for tensor (the file's header order is not fixed, so its bytes may differ).
    got = load_file(str(cut / "step-000005" / "model.safetensors"))
    want = load_file(str(whole / "step-000005" / "model.safetensors"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert measured(cut) == measured(whole)
    state = json.loads((cut / "step-000005" / "trainer_state.json").read_text())
    assert state["init_from"]["step"] == 6  # still recorded after the resume


def measured(run: Path) -> list[dict[str, object]]:
    """metrics.jsonl without the timings, which differ from one run to the next."""
    timings = ("elapsed", "tokens_per_s")
    return [{k: v for k, v in r.items() if k not in timings} for r in ckpt.read_metrics(run)]


def refused(args: list[str], code: int, tmp_path: Path) -> str:
    before = snapshot(tmp_path)
    result = runner.invoke(app, ["train", *args])
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert snapshot(tmp_path) == before  # nothing written
    return lines[0]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--d-model", "32"], "--d-model 32 (saved: 64)"),
        (["--n-heads", "2"], "--n-heads 2 (saved: 4)"),
        (["--preset", "small"], "--preset small (d_model 256 (saved: 64)"),
        (["--vocab-size", "300"], "--vocab-size 300 (saved: 60)"),
        (["--tokenizer-kind", "unigram"], "--tokenizer-kind 'unigram' (saved: 'bpe')"),
        (["--separate-vocab"], "--separate-vocab (saved: one shared vocabulary)"),
    ],
)
def test_contradicting_architecture_flags_are_refused(
    base: Path, toy_data: Path, tmp_path: Path, args: list[str], named: str
) -> None:
    line = refused(
        ["--init-from", str(base), "--data", str(toy_data), "--out", str(tmp_path / "t"), *args],
        2,
        tmp_path,
    )
    assert line.startswith(f"error: --init-from {ckpt.resolve(base)}") and named in line
    assert "fine-tuned from" in line


@pytest.mark.slow
def test_a_recipe_gives_a_fine_tuned_run_its_training_settings_only(
    base: Path, toy_data: Path, tmp_path: Path
) -> None:
    """The dates recipe's architecture (d_model 128, 2 + 2 layers) is not the checkpoint's:
    the run keeps the checkpoint's and takes the recipe's training settings."""
    out = tmp_path / "tuned"
    fine_tune(base, toy_data, out, "--recipe", "dates", "--max-steps", "1", "--save-every", "1")
    saved = ckpt.load_checkpoint(out)
    assert saved.model_config == ckpt.load_checkpoint(base).model_config
    dates = RECIPES["dates"]["train"]
    # The only setting of the recipe's that the test's flags leave to it (--max-steps ends it).
    assert dates["max_tokens"] != TrainConfig().max_tokens
    assert saved.train_config.max_tokens == dates["max_tokens"]


def test_a_contradicting_config_file_is_refused(
    base: Path, toy_data: Path, tmp_path: Path
) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("model:\n  d_ff: 128\n")
    line = refused(
        ["--init-from", str(base), "--data", str(toy_data), "--config", str(config),
         "--out", str(tmp_path / "t")],  # fmt: skip
        2,
        tmp_path,
    )
    assert "model.d_ff 128 (saved: 64)" in line


def test_another_tokenizer_is_refused(base: Path, toy_data: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    train_tokenizer(["a b c", "d e f"] * 50, kind="bpe", vocab_size=40).save(other)
    line = refused(
        ["--init-from", str(base), "--data", str(toy_data), "--tokenizer", str(other),
         "--out", str(tmp_path / "t")],  # fmt: skip
        4,
        tmp_path,
    )
    assert f"--tokenizer {other} differs from" in line and "drop --tokenizer" in line


def test_resume_with_init_from_is_refused(base: Path, toy_data: Path, tmp_path: Path) -> None:
    line = refused(
        ["--init-from", str(base), "--resume", str(base), "--data", str(toy_data)], 2, tmp_path
    )
    assert "--init-from" in line and "--resume" in line and "give one" in line


def test_agreeing_settings_and_the_own_tokenizer_are_accepted(
    base: Path, toy_data: Path, tmp_path: Path
) -> None:
    own = ckpt.resolve(base) / "tokenizer.json"
    # The command line that made the checkpoint, given again, is accepted.
    fine_tune(
        base, toy_data, tmp_path / "t", "--max-steps", "1", *ARCH, "--d-model", "64",
        "--tokenizer", str(own),
    )  # fmt: skip
    assert ckpt.load_checkpoint(tmp_path / "t").step == 1


def test_python_api(base: Path, toy_data: Path, tmp_path: Path) -> None:
    cfg = TrainConfig(data=str(toy_data), max_steps=1, warmup_steps=1, precision="fp32")
    result = tformer.train(None, cfg, init_from=base, out=tmp_path / "api", tokenized_cache=None)
    assert result.step == 1
    saved = ckpt.load_checkpoint(tmp_path / "api")
    assert saved.model_config == ckpt.load_checkpoint(base).model_config
    wider = tformer.preset("tiny", d_model=128)
    with pytest.raises(ConfigError, match="d_model 128 .saved: 64.*--init-from"):
        tformer.train(wider, cfg, init_from=base, out=tmp_path / "api2")
    assert not (tmp_path / "api2").exists()
