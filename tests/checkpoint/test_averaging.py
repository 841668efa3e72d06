"""Averaging refuses checkpoints that do not share a model configuration and both tokenizers."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tformer.checkpoint import Tokenizers, average_checkpoints, save_checkpoint
from tformer.cli.commands import app
from tformer.config import ModelConfig, TrainConfig
from tformer.data.tokenizer import Tokenizer, train_tokenizer
from tformer.errors import CheckpointError
from tformer.model import Transformer

SOURCE_TEXTS = ["the cat sat", "on the mat", "3 1 4 1 5"] * 20


def _target_tokenizer(texts: list[str]) -> Tokenizer:
    return train_tokenizer(texts * 20, vocab_size=30, min_frequency=1)


def _save(run: Path, tokenizers: Tokenizers, d_ff: int = 32) -> Path:
    config = ModelConfig(
        src_vocab_size=tokenizers.source.vocab_size,
        tgt_vocab_size=tokenizers.target.vocab_size,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=d_ff,
        max_len=16,
        share_embeddings=False,
    )
    model = Transformer(config).eval()
    return save_checkpoint(
        run, model=model, train_config=TrainConfig(), tokenizers=tokenizers, step=1
    )


@pytest.fixture(scope="module")
def source() -> Tokenizer:
    return train_tokenizer(SOURCE_TEXTS, vocab_size=40)


def test_separate_vocab_runs_with_different_target_tokenizers_are_refused(
    tmp_path: Path, source: Tokenizer
) -> None:
    one = _target_tokenizer(["alpha beta gamma", "delta epsilon"])
    two = _target_tokenizer(["zeta eta theta", "iota kappa"])
    # Same sizes, so only the tokenizers themselves tell the checkpoints apart.
    assert one.vocab_size == two.vocab_size and one.sha256() != two.sha256()
    a = _save(tmp_path / "a", Tokenizers(source, one))
    b = _save(tmp_path / "b", Tokenizers(source, two))
    result = CliRunner().invoke(app, ["average", str(a), str(b), "--out", str(tmp_path / "avg")])
    assert result.exit_code == 4, result.output
    message = " ".join(result.stderr.split())
    assert str(a) in message and str(b) in message
    assert "the target tokenizer differs" in message  # (the source one is the same)
    assert not (tmp_path / "avg").exists()


def test_different_model_configurations_are_refused_naming_the_field(
    tmp_path: Path, source: Tokenizer
) -> None:
    target = _target_tokenizer(["alpha beta gamma", "delta epsilon"])
    a = _save(tmp_path / "a", Tokenizers(source, target), d_ff=32)
    b = _save(tmp_path / "b", Tokenizers(source, target), d_ff=64)
    with pytest.raises(
        CheckpointError, match=r"model configuration differs \(d_ff 64 vs 32\)"
    ) as info:
        average_checkpoints([a, b], tmp_path / "avg")
    assert str(a) in str(info.value) and str(b) in str(info.value)


def test_checkpoints_sharing_model_and_tokenizers_are_averaged(
    tmp_path: Path, source: Tokenizer
) -> None:
    target = _target_tokenizer(["alpha beta gamma", "delta epsilon"])
    a = _save(tmp_path / "a", Tokenizers(source, target))
    b = _save(tmp_path / "b", Tokenizers(source, target))
    assert average_checkpoints([a, b], tmp_path / "avg").is_dir()
