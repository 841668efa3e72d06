"""Tiny models trained for real in each architecture variant an export must carry, and the
inputs the exported models are held to tformer on."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import tiny_model
from tformer.config import ModelConfig, TrainConfig
from tformer.model import Transformer
from tformer.training.reporting import TrainResult
from tformer.training.run import train

VARIANT_STEPS = 200
# name -> (ModelConfig changes, shared vocabulary). "post-relu-shared-tied" is the session's
# ``trained`` model (tests/conftest.py).
VARIANTS: dict[str, tuple[dict[str, Any], bool]] = {
    "post-relu-shared-tied": ({}, True),
    "pre-gelu-shared-untied": (
        {"norm": "pre", "activation": "gelu", "tie_embeddings": False},
        True,
    ),
    "post-gelu-separate-tied": ({"activation": "gelu"}, False),
    "post-relu-separate-untied": ({"tie_embeddings": False}, False),
}
POST_NORM = [name for name in VARIANTS if name.startswith("post")]


@pytest.fixture(scope="session")
def trained_variant(
    toy_data: Path, tmp_path_factory: pytest.TempPathFactory, trained: TrainResult
) -> Callable[[str], Path]:
    """name -> the checkpoint folder of a tiny model of that variant (trained once)."""
    done: dict[str, Path] = {"post-relu-shared-tied": trained.checkpoint}

    def get(name: str) -> Path:
        if name not in done:
            changes, shared = VARIANTS[name]
            config = TrainConfig(
                data=str(toy_data),
                max_tokens=1024,
                lr=3e-3,
                warmup_steps=50,
                max_steps=VARIANT_STEPS,
                eval_every=VARIANT_STEPS,
                log_every=100,
                save_every=VARIANT_STEPS,
                label_smoothing=0.0,
                seed=0,
            )
            out = tmp_path_factory.mktemp("export-runs") / name
            model = dataclasses.replace(tiny_model(), **changes)
            done[name] = train(
                model, config, out=out, vocab_size=64, shared_vocab=shared
            ).checkpoint
        return done[name]

    return get


TEST_SPLIT_INPUTS = 40


@pytest.fixture(scope="session")
def inputs(toy_data: Path) -> list[str]:
    """``TEST_SPLIT_INPUTS`` test sources of the digit task, then an empty one, a long one
    and one with characters the tokenizer never saw."""
    with open(toy_data / "test.jsonl", encoding="utf-8") as handle:
        sources = [json.loads(line)["source"] for line in handle][:TEST_SPLIT_INPUTS]
    return [*sources, "", " ".join("9876543210" * 3), "x y z 4 ?"]


def random_model(changes: dict[str, Any], *, shared: bool = True, seed: int = 0) -> Transformer:
    """An untrained model of one variant, for exact checks of the weight mapping."""
    torch.manual_seed(seed)
    vocab = {"src_vocab_size": 48, "tgt_vocab_size": 48 if shared else 40}
    config = ModelConfig(
        d_model=32,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=64,
        dropout=0.0,
        max_len=32,
        share_embeddings=shared,
        **vocab,
        **changes,
    )
    model = Transformer(config).eval()
    with torch.no_grad():  # LayerNorm and biases away from their 1 / 0 start: all must map
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias") or "positions" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model
