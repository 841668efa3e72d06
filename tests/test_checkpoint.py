"""Checkpoint round trips (safetensors + JSON + tokenizer) and clear errors for bad folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tformer.checkpoint import (
    CONFIG,
    LATEST,
    WEIGHTS,
    Tokenizers,
    load_checkpoint,
    resolve,
    save_checkpoint,
)
from tformer.config import ModelConfig, TrainConfig
from tformer.errors import CheckpointError
from tformer.model import Transformer
from tformer.tokenizer import train_tokenizer
from tformer.train import TrainResult


def test_run_folder_layout(trained: TrainResult) -> None:
    run = trained.run_dir
    latest = (run / LATEST).read_text().strip()
    assert latest == f"step-{trained.step:06d}"
    folder = run / latest
    names = {p.name for p in folder.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "optimizer.safetensors",
        "trainer_state.json",
    } <= names
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no temporaries left
    config = json.loads((folder / CONFIG).read_text())
    assert config["format_version"] == 1
    assert config["model"]["d_model"] == 64 and config["train"]["max_steps"] == 600
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("val_loss" in r for r in records) and any("loss" in r for r in records)
    assert not list(run.rglob("*.pt")) and not list(run.rglob("*.bin"))  # no pickle files


def _model_and_tokenizers(share: bool = True) -> tuple[Transformer, Tokenizers]:
    texts = ["the cat sat", "on the mat", "3 1 4 1 5"] * 20
    tok = train_tokenizer(texts, vocab_size=40)
    other = tok if share else train_tokenizer(texts + ["zz yy"] * 5, vocab_size=45)
    config = ModelConfig(
        src_vocab_size=tok.vocab_size,
        tgt_vocab_size=other.vocab_size,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=32,
        max_len=16,
        share_embeddings=share,
    )
    return Transformer(config).eval(), Tokenizers(tok, other)


@pytest.mark.parametrize("share", [True, False])
def test_round_trip_gives_identical_logits(tmp_path: Path, share: bool) -> None:
    model, toks = _model_and_tokenizers(share)
    folder = save_checkpoint(
        tmp_path / "run", model=model, train_config=TrainConfig(), tokenizers=toks, step=3
    )
    loaded = load_checkpoint(tmp_path / "run")
    assert loaded.path == folder and loaded.step == 3
    assert loaded.model_config == model.config
    assert loaded.tokenizers.shared == share
    src = torch.tensor([[4, 5, 6, 7]])
    tgt = torch.tensor([[1, 8, 9]])
    torch.testing.assert_close(
        loaded.model(src, tgt).logits, model(src, tgt).logits, rtol=0, atol=0
    )
    if share:  # tied weights stay tied after loading
        assert loaded.model.encoder.embedding is loaded.model.decoder.embedding


def test_keep_last_prunes_old_checkpoints(tmp_path: Path) -> None:
    model, toks = _model_and_tokenizers()
    for step in (1, 2, 3):
        save_checkpoint(
            tmp_path,
            model=model,
            train_config=TrainConfig(),
            tokenizers=toks,
            step=step,
            keep_last=2,
        )
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000002", "step-000003"]
    assert resolve(tmp_path).name == "step-000003"


def test_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="not a tformer checkpoint"):
        load_checkpoint(tmp_path / "empty")

    model, toks = _model_and_tokenizers()
    folder = save_checkpoint(
        tmp_path / "run", model=model, train_config=TrainConfig(), tokenizers=toks, step=1
    )
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    data = (broken / WEIGHTS).read_bytes()
    (broken / WEIGHTS).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(broken)

    foreign = tmp_path / "foreign"
    shutil.copytree(folder, foreign)
    other = train_tokenizer(["completely different text here"] * 10, vocab_size=30)
    other.save(foreign / "tokenizer.json")
    with pytest.raises(CheckpointError, match="does not match the tokenizer"):
        load_checkpoint(foreign)
