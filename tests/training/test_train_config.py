"""`tformer train` settings: options derived from the configs, recipes, --config, --print-config."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from tformer.cli.commands import app
from tformer.cli.train import MODEL_OPTIONS, TRAIN_OPTIONS
from tformer.config import RECIPES, ModelConfig, TrainConfig, family_record, flag
from tformer.errors import ConfigError
from tformer.training.configs import Settings, read_config_file, resolve
from tformer.training.run import train

runner = CliRunner()
TINY = ["--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--d-ff", "64", "--max-len", "48",
        "--log-every", "2", "--eval-every", "5", "--save-every", "5", "--warmup-steps", "3",
        "--lr", "3e-3", "--max-steps", "8", "--vocab-size", "60", "--no-cache"]  # fmt: skip


def invoke(*args: str) -> Any:
    return runner.invoke(app, list(args), catch_exceptions=False)


def _options() -> dict[str, Any]:
    """The train command's options (Typer may carry its own copy of click's classes)."""
    command = typer.main.get_command(app).commands["train"]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params if p.param_type_name == "option"}


def test_every_config_option_has_the_fields_default_and_help() -> None:
    options = _options()
    for cls, names in ((ModelConfig, MODEL_OPTIONS), (TrainConfig, TRAIN_OPTIONS)):
        for spec in dataclasses.fields(cls):
            if spec.name not in names:
                continue
            option = options[spec.name]
            assert option.help == spec.metadata["help"], spec.name
            assert flag(spec.name) in option.opts, spec.name
            if spec.name != "time_budget":  # given as a duration (90s, 3m), the field in seconds
                assert option.default == spec.default, spec.name
    # Every field a user chooses is an option; the vocabulary sizes come from the tokenizer.
    chosen = {f.name for f in dataclasses.fields(ModelConfig)} - {
        "src_vocab_size", "tgt_vocab_size", "share_embeddings"}  # fmt: skip
    assert chosen <= set(MODEL_OPTIONS)
    assert {f.name for f in dataclasses.fields(TrainConfig)} - {"beta1", "beta2", "eps"} <= set(
        TRAIN_OPTIONS
    )


def test_share_embeddings_message_names_a_real_flag() -> None:
    with pytest.raises(ConfigError) as error:
        ModelConfig(src_vocab_size=10, tgt_vocab_size=12)
    assert "--no-share-embeddings" not in str(error.value)
    assert "--separate-vocab" in str(error.value)
    assert "separate_vocab" in _options()


def test_precedence_defaults_recipe_file_flags(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("train:\n  lr: 0.004\n  max_tokens: 700\nmodel:\n  d_ff: 384\n")
    resolved = resolve(Settings(config_file=config, values={"max_tokens": 900}))
    dates = RECIPES["dates"]
    assert resolved.train.lr == 0.004  # the file beats the recipe
    assert resolved.train.max_tokens == 900  # a flag beats the file
    # The recipe beats the defaults.
    assert resolved.train.warmup_steps == dates["train"]["warmup_steps"]
    assert resolved.model.d_ff == 384 and resolved.model.d_model == dates["model"]["d_model"]
    assert resolved.train.beta2 == TrainConfig().beta2
    # A stopping rule given later replaces the recipe's as a whole.
    stopped = resolve(Settings(values={"max_steps": 10}))
    assert stopped.train.max_steps == 10 and stopped.train.time_budget is None


@pytest.mark.parametrize(
    ("arch", "smoothing"),
    [("encoder-decoder", 0.1), ("decoder-only", 0.0), ("encoder-only", 0.0)],
)
def test_each_family_trains_its_own_data_with_its_own_defaults(
    arch: str, smoothing: float, tmp_path: Path
) -> None:
    """A language model on the user's data (no recipe) is not label-smoothed, as on the
    bundled text; the translation model keeps the paper's 0.1. A file or a flag still wins."""
    data = str(tmp_path / "data")
    assert family_record(arch).train_defaults.get("label_smoothing", 0.1) == smoothing
    resolved = resolve(Settings(values={"arch": arch, "data": data}))
    assert resolved.train.label_smoothing == smoothing
    assert resolved.train.lr == TrainConfig().lr  # nothing else moves
    config = tmp_path / "run.yaml"
    config.write_text("train:\n  label_smoothing: 0.2\n")
    from_file = resolve(Settings(config_file=config, values={"arch": arch, "data": data}))
    assert from_file.train.label_smoothing == 0.2
    flagged = resolve(Settings(values={"arch": arch, "data": data, "label_smoothing": 0.05}))
    assert flagged.train.label_smoothing == 0.05
    shown = runner.invoke(app, ["train", "--arch", arch, "--data", data, "--print-config"])
    assert shown.exit_code == 0 and f"label_smoothing: {smoothing}" in shown.output


@pytest.mark.parametrize(
    ("text", "key"), [("train:\n  lrate: 1\n", "train.lrate"), ("optimizer: {}\n", "optimizer")]
)
def test_unknown_config_keys_are_one_clear_error(tmp_path: Path, text: str, key: str) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=rf"--config {config}: unknown key '{key}'"):
        read_config_file(config)
    result = runner.invoke(app, ["train", "--config", str(config)])
    assert result.exit_code != 0 and f"unknown key '{key}'" in result.output
    assert "Traceback" not in result.output


def _losses(run: Path) -> list[float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


@pytest.mark.slow
def test_print_config_then_config_reproduces_the_run(toy_data: Path, tmp_path: Path) -> None:
    flags = ["--data", str(toy_data), *TINY]
    printed = invoke("train", *flags, "--print-config")
    assert printed.exit_code == 0, printed.output
    config = tmp_path / "run.yaml"
    config.write_text(printed.stdout)
    assert yaml.safe_load(printed.stdout)["train"]["max_steps"] == 8
    assert not (tmp_path / "a").exists()
    first = invoke("train", *flags, "--out", str(tmp_path / "a"))
    assert first.exit_code == 0, first.output
    again = invoke("train", "--config", str(config), "--no-cache", "--out", str(tmp_path / "b"))
    assert again.exit_code == 0, again.output
    assert len(_losses(tmp_path / "a")) >= 4
    assert _losses(tmp_path / "b") == _losses(tmp_path / "a")
    # The library call with the same settings is the same run too.
    settings = Settings(config_file=config)
    train(settings=settings, out=tmp_path / "c")
    assert _losses(tmp_path / "c") == _losses(tmp_path / "a")
    # The printed config of the resolved config is itself.
    reprinted = invoke("train", "--config", str(config), "--print-config")
    assert reprinted.stdout == printed.stdout


def test_training_ends_with_validation_figures_only(toy_data: Path, tmp_path: Path) -> None:
    result = invoke("train", "--data", str(toy_data), *TINY, "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert "exact match on validation" in result.stdout
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
               .splitlines()]  # fmt: skip
    assert any("validation_exact_match" in r for r in records)
    assert not any(k.startswith("test") for r in records for k in r)
