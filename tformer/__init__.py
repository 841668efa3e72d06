"""tformer: train, sample and inspect an encoder-decoder Transformer.

The command line is a thin layer over this API::

    from tformer import ModelConfig, TrainConfig, preset, train, load_checkpoint, generate

    result = train(preset("tiny"), TrainConfig(max_steps=2000), out=Path("checkpoints/dates"))
    ckpt = load_checkpoint(result.run_dir)
    print(generate(ckpt, ["6 March 2025"]))
"""

from __future__ import annotations

from tformer.analysis.attention import AttentionResult, AttentionSelection, inspect_attention
from tformer.analysis.attention_files import load_attention, save_attention
from tformer.analysis.evaluate import Evaluation, corpus_scores, evaluate
from tformer.analysis.head_stats import HeadStats, head_statistics
from tformer.checkpoint import (
    Checkpoint,
    Tokenizers,
    average_checkpoints,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from tformer.config import PRESETS, RECIPES, ModelConfig, TrainConfig, preset
from tformer.data.tokenizer import Tokenizer, train_tokenizer
from tformer.decoding.sampling import (
    DecodingConfig,
    Hypothesis,
    decode_texts,
    explain,
    stream_tokens,
)
from tformer.errors import CheckpointError, ConfigError, DataError, DeviceError, TformerError
from tformer.model import AttentionMaps, Transformer
from tformer.training.dryrun import DryRunReport, measure_batch_limits
from tformer.training.run import TrainResult, train
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
    "RECIPES",
    "AttentionMaps",
    "AttentionResult",
    "AttentionSelection",
    "Checkpoint",
    "CheckpointError",
    "ConfigError",
    "DataError",
    "DecodingConfig",
    "DeviceError",
    "DryRunReport",
    "Evaluation",
    "HeadStats",
    "Hypothesis",
    "ModelConfig",
    "TformerError",
    "Tokenizer",
    "Tokenizers",
    "TrainConfig",
    "TrainResult",
    "Transformer",
    "__version__",
    "average_checkpoints",
    "corpus_scores",
    "decode_texts",
    "evaluate",
    "explain",
    "generate",
    "head_statistics",
    "inspect_attention",
    "load_attention",
    "load_checkpoint",
    "measure_batch_limits",
    "preset",
    "save_attention",
    "save_checkpoint",
    "stream_tokens",
    "train",
    "train_tokenizer",
    "verify_checkpoint",
]
