"""tformer: train, sample and inspect an encoder-decoder Transformer.

The command line is a thin layer over this API::

    from tformer import ModelConfig, TrainConfig, preset, train, load_checkpoint, generate

    result = train(preset("tiny"), TrainConfig(max_steps=2000), out=Path("checkpoints/dates"))
    ckpt = load_checkpoint(result.run_dir)
    print(generate(ckpt, ["6 March 2025"]))

Importing tformer changes nothing in the process and loads nothing heavy: each name below is
imported from its module on first use. Process-wide settings (huge pages, the allocator) are
applied by ``configure_process()``, which the command line calls.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tformer.version import __version__

# Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "Alignment": "tformer.analysis.align",
    "AlignmentScores": "tformer.analysis.aer",
    "Ablation": "tformer.analysis.ablate",
    "AttentionMaps": "tformer.model",
    "AttentionResult": "tformer.analysis.attention",
    "AttentionSelection": "tformer.analysis.attention",
    "Checkpoint": "tformer.checkpoint",
    "Comparison": "tformer.analysis.runs",
    "CheckpointError": "tformer.errors",
    "ConfigError": "tformer.errors",
    "DataError": "tformer.errors",
    "DecodingConfig": "tformer.decoding.settings",
    "DeviceError": "tformer.errors",
    "DryRunReport": "tformer.training.dryrun",
    "PairedSignificance": "tformer.analysis.significance",
    "Evaluation": "tformer.analysis.evaluate",
    "Generation": "tformer.decoding.text",
    "HeadName": "tformer.model.heads",
    "HeadStats": "tformer.analysis.head_stats",
    "Hypothesis": "tformer.decoding.settings",
    "ModelConfig": "tformer.config",
    "PairScore": "tformer.analysis.score",
    "PRESETS": "tformer.config",
    "RECIPES": "tformer.config",
    "RunSummary": "tformer.analysis.runs",
    "Settings": "tformer.training.configs",
    "StepExplanation": "tformer.analysis.explain",
    "TformerError": "tformer.errors",
    "Tokenizer": "tformer.data.tokenizer",
    "Tokenizers": "tformer.checkpoint",
    "TrainConfig": "tformer.config",
    "TrainResult": "tformer.training.reporting",
    "Transformer": "tformer.model",
    "ablate": "tformer.analysis.measures",
    "accelerate": "tformer.fast.accelerate",
    "quantize_int8": "tformer.fast.int8",
    "score_pair": "tformer.analysis.score",
    "score_pairs": "tformer.analysis.score",
    "align": "tformer.analysis.align",
    "average_checkpoints": "tformer.checkpoint",
    "compare_runs": "tformer.analysis.runs",
    "compare_systems": "tformer.analysis.significance",
    "paired_significance": "tformer.analysis.significance",
    "configure_process": "tformer.fast.process",
    "corpus_scores": "tformer.metrics",
    "decode_texts": "tformer.decoding.api",
    "evaluate": "tformer.analysis.measures",
    "score": "tformer.analysis.measures",
    "explain": "tformer.analysis.explain",
    "export_checkpoint": "tformer.export",
    "generate": "tformer.decoding.text",
    "import_model": "tformer.imports",
    "head_statistics": "tformer.analysis.head_stats",
    "heads_masked": "tformer.model.heads",
    "inspect_attention": "tformer.analysis.attention",
    "load_attention": "tformer.analysis.attention_files",
    "load_checkpoint": "tformer.checkpoint",
    "mask_heads": "tformer.model.heads",
    "measure_batch_limits": "tformer.training.dryrun",
    "parse_heads": "tformer.model.heads",
    "plan_job": "tformer.training.run",
    "preset": "tformer.config",
    "read_pharaoh": "tformer.analysis.aer",
    "save_attention": "tformer.analysis.attention_files",
    "save_checkpoint": "tformer.checkpoint",
    "score_alignments": "tformer.analysis.aer",
    "stream_tokens": "tformer.decoding.api",
    "train": "tformer.training.run",
    "train_tokenizer": "tformer.data.tokenizer",
    "translate": "tformer.decoding.text",
    "verify_checkpoint": "tformer.checkpoint",
    "DecoderOnlyTransformer": "tformer.model",
    "EncoderOnlyTransformer": "tformer.model",
    "TransformerBase": "tformer.model",
    "FilledMask": "tformer.analysis.language",
    "LanguageEvaluation": "tformer.analysis.language",
    "build_model": "tformer.model",
    "evaluate_language": "tformer.analysis.language",
    "fill_mask": "tformer.analysis.language",
    "load_texts": "tformer.data.lm",
}

if TYPE_CHECKING:
    from tformer.analysis.ablate import Ablation
    from tformer.analysis.aer import AlignmentScores, read_pharaoh, score_alignments
    from tformer.analysis.align import Alignment, align
    from tformer.analysis.attention import AttentionResult, AttentionSelection, inspect_attention
    from tformer.analysis.attention_files import load_attention, save_attention
    from tformer.analysis.evaluate import Evaluation
    from tformer.analysis.explain import StepExplanation, explain
    from tformer.analysis.head_stats import HeadStats, head_statistics
    from tformer.analysis.language import (
        FilledMask,
        LanguageEvaluation,
        evaluate_language,
        fill_mask,
    )
    from tformer.analysis.measures import ablate, evaluate, score
    from tformer.analysis.runs import Comparison, RunSummary, compare_runs
    from tformer.analysis.score import PairScore, score_pair, score_pairs
    from tformer.analysis.significance import (
        PairedSignificance,
        compare_systems,
        paired_significance,
    )
    from tformer.checkpoint import (
        Checkpoint,
        Tokenizers,
        average_checkpoints,
        load_checkpoint,
        save_checkpoint,
        verify_checkpoint,
    )
    from tformer.config import PRESETS, RECIPES, ModelConfig, TrainConfig, preset
    from tformer.data.lm import load_texts
    from tformer.data.tokenizer import Tokenizer, train_tokenizer
    from tformer.decoding.api import decode_texts, stream_tokens
    from tformer.decoding.settings import DecodingConfig, Hypothesis
    from tformer.decoding.text import Generation, generate, translate
    from tformer.errors import CheckpointError, ConfigError, DataError, DeviceError, TformerError
    from tformer.export import export_checkpoint
    from tformer.fast.accelerate import accelerate
    from tformer.fast.int8 import quantize_int8
    from tformer.fast.process import configure_process
    from tformer.imports import import_model
    from tformer.metrics import corpus_scores
    from tformer.model import (
        AttentionMaps,
        DecoderOnlyTransformer,
        EncoderOnlyTransformer,
        Transformer,
        TransformerBase,
        build_model,
    )
    from tformer.model.heads import HeadName, heads_masked, mask_heads, parse_heads
    from tformer.training.configs import Settings
    from tformer.training.dryrun import DryRunReport, measure_batch_limits
    from tformer.training.reporting import TrainResult
    from tformer.training.run import plan_job, train


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    """The public API only (not this module's own imports, such as ``importlib``)."""
    return sorted(__all__)


__all__ = [
    "Ablation",
    "Alignment",
    "AlignmentScores",
    "AttentionMaps",
    "AttentionResult",
    "AttentionSelection",
    "Checkpoint",
    "CheckpointError",
    "Comparison",
    "ConfigError",
    "DataError",
    "DecoderOnlyTransformer",
    "DecodingConfig",
    "DeviceError",
    "DryRunReport",
    "EncoderOnlyTransformer",
    "Evaluation",
    "FilledMask",
    "Generation",
    "HeadName",
    "HeadStats",
    "Hypothesis",
    "LanguageEvaluation",
    "ModelConfig",
    "PRESETS",
    "PairScore",
    "PairedSignificance",
    "RECIPES",
    "RunSummary",
    "Settings",
    "StepExplanation",
    "TformerError",
    "Tokenizer",
    "Tokenizers",
    "TrainConfig",
    "TrainResult",
    "Transformer",
    "TransformerBase",
    "__version__",
    "ablate",
    "accelerate",
    "align",
    "average_checkpoints",
    "build_model",
    "compare_runs",
    "compare_systems",
    "configure_process",
    "corpus_scores",
    "decode_texts",
    "evaluate",
    "evaluate_language",
    "explain",
    "export_checkpoint",
    "fill_mask",
    "generate",
    "head_statistics",
    "heads_masked",
    "import_model",
    "inspect_attention",
    "load_attention",
    "load_checkpoint",
    "load_texts",
    "mask_heads",
    "measure_batch_limits",
    "paired_significance",
    "parse_heads",
    "plan_job",
    "preset",
    "quantize_int8",
    "read_pharaoh",
    "save_attention",
    "save_checkpoint",
    "score",
    "score_alignments",
    "score_pair",
    "score_pairs",
    "stream_tokens",
    "train",
    "train_tokenizer",
    "translate",
    "verify_checkpoint",
]
