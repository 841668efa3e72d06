"""Configuration: presets, validation messages naming flags, strict dict round trips."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tformer.config import (
    PRESETS,
    RECIPES,
    ModelConfig,
    TrainConfig,
    parse_duration,
    preset,
)
from tformer.errors import ConfigError


def test_base_preset_is_the_papers_base_model() -> None:
    base = preset("base")
    assert (base.d_model, base.n_heads, base.n_encoder_layers, base.n_decoder_layers,
            base.d_ff, base.dropout, base.norm) == (512, 8, 6, 6, 2048, 0.1, "post")
    assert base.d_head == 64
    assert set(PRESETS) >= {"tiny", "small", "base"}


def test_overrides_and_frozen() -> None:
    config = preset("tiny", d_model=128, n_heads=None)
    assert config.d_model == 128 and config.n_heads == PRESETS["tiny"]["n_heads"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"d_model": 512, "n_heads": 6}, "--n-heads 6 must divide --d-model 512"),
        ({"dropout": 1.0}, "--dropout 1.0"),
        ({"norm": "sandwich"}, "--norm 'sandwich'"),
        ({"activation": "tanh"}, "--activation 'tanh'"),
        ({"n_encoder_layers": 0}, "--n-encoder-layers 0"),
        ({"src_vocab_size": 10, "tgt_vocab_size": 12}, "leave out --separate-vocab"),
    ],
)
def test_model_config_errors_name_the_flag(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        ModelConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [({"max_tokens": 0}, "--max-tokens"), ({"lr": -1.0}, "--lr"), ({"schedule": "step"},
     "--schedule"), ({"label_smoothing": 1.0}, "--label-smoothing"), ({"device": "tpu"},
     "--device"), ({"max_steps": 0}, "--max-steps"), ({"time_budget": -1.0}, "--time-budget")],
)
def test_train_config_errors_name_the_flag(kwargs: dict, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        TrainConfig(**kwargs)


def test_unknown_preset_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match="tiny, small, base"):
        preset("huge")


def test_json_round_trip_is_exact_and_strict() -> None:
    model = preset("small", src_vocab_size=1234, tgt_vocab_size=1234, norm="pre")
    train = TrainConfig(data="x.jsonl", lr=1e-3, time_budget=90.0, schedule="cosine")
    assert ModelConfig.from_dict(json.loads(json.dumps(model.to_dict()))) == model
    assert TrainConfig.from_dict(json.loads(json.dumps(train.to_dict()))) == train
    with pytest.raises(ConfigError, match="unknown ModelConfig keys"):
        ModelConfig.from_dict({**model.to_dict(), "n_experts": 8})
    partial = model.to_dict()
    del partial["d_ff"]
    with pytest.raises(ConfigError, match="missing ModelConfig keys"):
        ModelConfig.from_dict(partial)


def test_recipes_build_valid_configs() -> None:
    for recipe in RECIPES.values():
        ModelConfig(**recipe["model"])
        TrainConfig(**recipe["train"])


@pytest.mark.parametrize(("text", "seconds"),
                         [("90", 90), ("90s", 90), ("3m", 180), ("1.5h", 5400), ("2 min", 120),
                          ("4m30s", 270), ("1h 30m", 5400), ("1d2h", 93600), ("2m 0.5s", 120.5)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "0", "-3m", "3 weeks", "4m30", "3m3m", "1h x", "0m0s",
                                  "m30s", "4ms"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ConfigError, match="--time-budget"):
        parse_duration(text)
