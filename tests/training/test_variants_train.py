"""Every architecture option trained for real, a few steps each (not the full product): exact
resume, save / load equality, cached equals uncached decoding, beam search and averaging."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_model
from tformer.checkpoint.averaging import average_checkpoints
from tformer.checkpoint.store import load_checkpoint
from tformer.config import TrainConfig
from tformer.decoding.api import decode
from tformer.decoding.settings import DecodingConfig
from tformer.fast.accelerate import accelerate
from tformer.training.run import train

OPTIONS = {
    "learned": dict(positions="learned"),
    "rope": dict(positions="rope"),
    "gqa": dict(kv_heads=2),
    "mqa-swiglu": dict(kv_heads=1, activation="swiglu"),
    "geglu": dict(activation="geglu"),
    "geglu-tanh": dict(activation="geglu_tanh"),  # T5 v1.1's
    "rmsnorm": dict(normalization="rmsnorm"),
    "all-pre": dict(positions="rope", kv_heads=2, activation="geglu",
                    normalization="rmsnorm", norm="pre"),
    # GPT-2's and BERT's (tformer import sets them), on the paper's encoder-decoder
    "gpt2-bert": dict(activation="gelu_tanh", embedding_scale=False, norm_eps=1e-12,
                      embedding_norm=True, segment_embedding=True, output_bias=True),
    # T5's (Raffel et al. 2020)
    "t5": dict(positions="relative", relative_buckets=8, relative_max_distance=16,
               attention_scale=False, linear_bias=False, normalization="rmsnorm", norm="pre",
               embedding_scale=False, output_scale=True),
}  # fmt: skip
STEPS = 8


def train_config(data: Path, max_steps: int) -> TrainConfig:
    return TrainConfig(data=str(data), max_tokens=512, lr=2e-3, warmup_steps=4,
                       max_steps=max_steps, log_every=2, eval_every=100, save_every=4,
                       keep_last=3, seed=3)  # fmt: skip


def losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.mark.slow
@pytest.mark.parametrize("name", OPTIONS)
def test_each_option_trains_resumes_saves_and_decodes_exactly(
    name: str, toy_data: Path, tmp_path: Path
) -> None:
    # Dropout on, so the resumed RNG streams matter as much as the data position.
    model_config = dataclasses.replace(tiny_model(), dropout=0.1, **OPTIONS[name])
    straight = train(model_config, train_config(toy_data, STEPS), out=tmp_path / "straight",
                     vocab_size=64)  # fmt: skip
    train(model_config, train_config(toy_data, STEPS // 2), out=tmp_path / "split",
          vocab_size=64)  # fmt: skip
    resumed = train(None, train_config(toy_data, STEPS), out=tmp_path / "split", resume=True)
    assert resumed.step == STEPS
    assert sorted(losses(tmp_path / "straight")) == [2, 4, 6, 8]
    assert losses(tmp_path / "straight") == losses(tmp_path / "split")  # bit for bit on CPU

    loaded = load_checkpoint(straight.run_dir)
    recorded = json.loads((loaded.path / "config.json").read_text())["model"]
    assert {k: recorded[k] for k in OPTIONS[name]} == OPTIONS[name]
    again = load_checkpoint(resumed.run_dir).model.state_dict()
    saved = loaded.model.state_dict()
    assert saved.keys() == again.keys()
    assert all(torch.equal(saved[k], again[k]) for k in saved)
    assert straight.model is not None  # the weights in memory are the weights saved
    memory = straight.model.state_dict()
    assert all(torch.equal(saved[k], memory[k].cpu()) for k in saved)

    model = loaded.model.eval()
    src = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(loaded.tokenizers.source.encode(s)) for s in ("3 1 4", "2 7 1 8 2")],
        batch_first=True,
    )
    cached = decode(model, src, DecodingConfig(max_new_tokens=12))
    uncached = decode(model, src, DecodingConfig(max_new_tokens=12, use_cache=False))
    assert [r[0].ids for r in cached] == [r[0].ids for r in uncached]
    for c, u in zip(cached, uncached, strict=True):
        assert c[0].token_logprobs == pytest.approx(u[0].token_logprobs, abs=1e-4)
    beam = decode(model, src, DecodingConfig(beam_size=3, max_new_tokens=12))
    fast_beam = decode(accelerate(model), src, DecodingConfig(beam_size=3, max_new_tokens=12))
    assert [r[0].ids for r in beam] == [r[0].ids for r in fast_beam]

    steps = sorted(p for p in straight.run_dir.glob("step-*") if p.is_dir())
    averaged = average_checkpoints(steps[-2:], tmp_path / "avg")
    mean = load_checkpoint(averaged).model.state_dict()
    parts = [load_checkpoint(p).model.state_dict() for p in steps[-2:]]
    for key in mean:
        torch.testing.assert_close(mean[key], (parts[0][key] + parts[1][key]) / 2)
