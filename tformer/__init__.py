"""tformer: train, sample and inspect an encoder-decoder Transformer.

The command line is a thin layer over this API::

    from tformer import ModelConfig, TrainConfig, preset, train, load_checkpoint, generate

    result = train(preset("tiny"), TrainConfig(max_steps=2000), out=Path("checkpoints/dates"))
    ckpt = load_checkpoint(result.run_dir)
    print(generate(ckpt, ["6 March 2025"]))
"""

from __future__ import annotations

from tformer.checkpoint import Checkpoint, Tokenizers, load_checkpoint, save_checkpoint
from tformer.config import PRESETS, ModelConfig, TrainConfig, preset
from tformer.decoding import DecodingConfig, Hypothesis, decode_texts
from tformer.errors import CheckpointError, ConfigError, DataError, DeviceError, TformerError
from tformer.inspection import AttentionResult, inspect_attention
from tformer.model import AttentionMaps, Transformer
from tformer.tokenizer import Tokenizer, train_tokenizer
from tformer.train import TrainResult, train
from tformer.version import __version__


def generate(
    checkpoint: Checkpoint, texts: list[str], config: DecodingConfig | None = None
) -> list[list[str]]:
    """Decode ``texts`` with a loaded checkpoint; ``num_samples`` strings per input."""
    config = config or DecodingConfig()
    src = [checkpoint.tokenizers.source.encode(t) for t in texts]
    hyps = decode_texts(checkpoint.model, src, config)
    target = checkpoint.tokenizers.target
    return [[target.decode(h.ids) for h in per_input] for per_input in hyps]


__all__ = [
    "PRESETS",
    "AttentionMaps",
    "AttentionResult",
    "Checkpoint",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "DecodingConfig",
    "DeviceError",
    "Hypothesis",
    "ModelConfig",
    "TformerError",
    "Tokenizer",
    "Tokenizers",
    "TrainConfig",
    "TrainResult",
    "Transformer",
    "__version__",
    "decode_texts",
    "generate",
    "inspect_attention",
    "load_checkpoint",
    "preset",
    "save_checkpoint",
    "train",
    "train_tokenizer",
]
