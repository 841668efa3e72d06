"""Options shared by several commands, defined once. Defaults come from the config classes."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import typer

from tformer.config import TrainConfig
from tformer.decoding.sampling import DecodingConfig
from tformer.errors import ConfigError, DataError


def default(cls: type, name: str) -> Any:
    """A dataclass field's default, so ``--help`` always shows what the library uses."""
    return {f.name: f.default for f in dataclasses.fields(cls)}[name]


CHECKPOINT = typer.Argument(
    ...,
    help="A run folder written by `tformer train` (its latest checkpoint is used) "
    "or one checkpoint folder.",
    show_default=False,
)
DEVICE = typer.Option(default(TrainConfig, "device"), "--device", help="auto, cpu, cuda[:N], mps.")
DATA = typer.Option(
    None,
    "--data",
    help="A folder with train/validation/test .jsonl (or .csv, .tsv, .parquet), one such "
    "file, or a Hugging Face dataset name. Default: the bundled date set in data/.",
    show_default=False,
)
SOURCE_FIELD = typer.Option(
    default(TrainConfig, "source_field"),
    "--source-field",
    "--src-lang",
    help="Source column; for paired text files (train.en + train.de) or translation records, "
    "the source language.",
)
TARGET_FIELD = typer.Option(
    default(TrainConfig, "target_field"),
    "--target-field",
    "--tgt-lang",
    help="Target column, or the target language.",
)
TEMPERATURE = typer.Option(
    default(DecodingConfig, "temperature"),
    "--temperature",
    "-t",
    help="Sample from softmax(z / T); 0 means greedy (always the most likely token).",
)
TOP_K = typer.Option(
    default(DecodingConfig, "top_k"),
    "--top-k",
    help="Sample among the k most likely tokens only; 0 = off.",
)
TOP_P = typer.Option(
    default(DecodingConfig, "top_p"),
    "--top-p",
    help="Nucleus sampling: the smallest set of tokens with this much probability; 1 = off.",
)
MAX_NEW_TOKENS = typer.Option(default(DecodingConfig, "max_new_tokens"), "--max-new-tokens")
SEED = typer.Option(None, "--seed", help="Random seed: the same seed gives the same output.")


TEXTS = typer.Argument(
    None, help="Inputs (default: --input-file or stdin, one a line).", show_default=False
)
INPUT_FILE = typer.Option(
    None, "--input-file", "-i", help="Inputs, one a line.", show_default=False
)
BATCH_SIZE = typer.Option(64, "--batch-size", help="Rows decoded together.")


def existing_file(path: Path | None, option: str) -> Path | None:
    """Refuse a missing file with a message naming the option."""
    if path is not None and not path.is_file():
        raise ConfigError(f"{option} {path}: no such file")
    return path


MIN_P = typer.Option(
    default(DecodingConfig, "min_p"),
    "--min-p",
    help="Sample only tokens at least this fraction as likely as the most likely one; 0 = off.",
)
REPETITION_PENALTY = typer.Option(
    default(DecodingConfig, "repetition_penalty"),
    "--repetition-penalty",
    help="Divide a seen token's positive logit by this (multiply a negative one); 1 = off.",
)
NO_REPEAT_NGRAM_SIZE = typer.Option(
    default(DecodingConfig, "no_repeat_ngram_size"),
    "--no-repeat-ngram-size",
    help="Never repeat an n-gram of the output of this size; 0 = off.",
)
BEAM_SIZE = typer.Option(
    default(DecodingConfig, "beam_size"),
    "--beam-size",
    "-b",
    help="Beam search with this many beams; 1 = greedy / sampling.",
)
LENGTH_PENALTY = typer.Option(
    default(DecodingConfig, "length_penalty"),
    "--length-penalty",
    help="Beam score = sum log p / length ** this (length counts <eos>); 0 favours short "
    "outputs, 1 is the mean log-probability per token, more favours long ones.",
)
N_BEST = typer.Option(
    default(DecodingConfig, "n_best"), "--n-best", help="Beam search outputs per input."
)
MIN_NEW_TOKENS = typer.Option(
    default(DecodingConfig, "min_new_tokens"),
    "--min-new-tokens",
    help="Forbid <eos> until this many tokens are generated.",
)


def decoding_config(params: dict[str, Any]) -> DecodingConfig:
    """The ``DecodingConfig`` of a command's decoding flags (its parameters named like the
    config's fields), so every command that decodes takes the same flags the same way."""
    names = {f.name for f in dataclasses.fields(DecodingConfig)}
    return DecodingConfig(**{k: v for k, v in params.items() if k in names})


def read_inputs(texts: list[str] | None, input_file: Path | None) -> list[str]:
    """Inputs from arguments, else ``--input-file``, else stdin; one input a line."""
    if texts and input_file is not None:
        raise ConfigError("give inputs as arguments or with --input-file, not both")
    if texts:
        return list(texts)
    if input_file is not None:
        existing_file(input_file, "--input-file")
        try:
            return input_file.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as error:
            raise DataError(f"--input-file {input_file}: not UTF-8 text ({error})") from error
    if sys.stdin is None or sys.stdin.isatty():
        raise ConfigError(
            "no input: give TEXT arguments, --input-file FILE, pipe lines in, or use --interactive"
        )
    return sys.stdin.read().splitlines()
