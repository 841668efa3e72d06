"""One rank of a data-parallel test run, started by torchrun (see test_distributed.py).

Trains the tiny model of the tests with ``tformer.training.run.train`` and then writes this rank's
final weights to ``DUMP/rank<R>.safetensors`` so the test can compare the ranks.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from safetensors.torch import save_file  # noqa: E402

from tformer.config import ModelConfig, TrainConfig, preset  # noqa: E402
from tformer.training.run import train  # noqa: E402


def model_config() -> ModelConfig:
    return preset("tiny", d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                  d_ff=64, dropout=0.0, max_len=48)  # fmt: skip


def train_config(data: str, steps: int, accumulate: int) -> TrainConfig:
    return TrainConfig(
        data=data, max_tokens=256, accumulate=accumulate, lr=3e-3, warmup_steps=5,
        max_steps=steps, log_every=1, eval_every=4, save_every=4, label_smoothing=0.0, seed=0,
        device="cpu",  # gloo on CPU, also on a machine with a GPU (test_cuda covers CUDA)
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dump", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--accumulate", type=int, default=1)
    args = parser.parse_args()
    result = train(
        model_config(), train_config(args.data, args.steps, args.accumulate), out=Path(args.out),
        vocab_size=60,
    )  # fmt: skip
    assert result.model is not None
    state = {k: v.detach().clone().contiguous() for k, v in result.model.state_dict().items()}
    Path(args.dump).mkdir(parents=True, exist_ok=True)
    save_file(state, str(Path(args.dump) / f"rank{os.environ.get('RANK', '0')}.safetensors"))


if __name__ == "__main__":
    main()
