"""``tformer train``: train a model (the whole job), with a Rich progress display.

The options for config fields are derived from ``ModelConfig`` / ``TrainConfig`` (flag,
default and help); only the options given on the command line reach the library, which
resolves them over the recipe and the ``--config`` file (tformer.training.configs).
"""

from __future__ import annotations

import os
from typing import Any

import typer

from tformer.cli.app import app
from tformer.cli.options import (
    config_parameter,
    dataclass_parameters,
    existing_file,
    in_panels,
    with_parameters,
)
from tformer.cli.progress import RichReporter, show_dry_run
from tformer.cli.train_flags import TRAIN_FLAGS, TrainFlags
from tformer.config import ModelConfig, TrainConfig, flag, parse_duration
from tformer.data.prepare import default_cache_dir
from tformer.device import set_threads
from tformer.errors import ConfigError
from tformer.training.configs import Settings, dump_config
from tformer.training.dryrun import dry_run
from tformer.training.inputs import check_prepared_options
from tformer.training.launch import RunOptions
from tformer.training.loggers import check_installed, log_targets
from tformer.training.run import plan_job, train_job

# The config fields `tformer train` takes as options, in --help order.
MODEL_OPTIONS = (
    "arch",
    "d_model",
    "n_heads",
    "kv_heads",
    "n_encoder_layers",
    "n_decoder_layers",
    "d_ff",
    "dropout",
    "attention_dropout",
    "norm",
    "normalization",
    "activation",
    "max_len",
    "positions",
    "tie_embeddings",
    "output_bias",
    "source_eos",
    "embedding_scale",
    "norm_eps",
    "embedding_norm",
    "segment_embedding",
    "mlm_head",
    "bos_first",
    "document_bos",
    "relative_buckets",
    "relative_max_distance",
    "attention_scale",
    "linear_bias",
    "output_scale",
)
TRAIN_OPTIONS = (
    "data",
    "source_field",
    "target_field",
    "text_field",
    "pack",
    "block_size",
    "mlm_probability",
    "mlm_mask",
    "mlm_random",
    "streaming",
    "max_tokens",
    "accumulate",
    "lr",
    "warmup_steps",
    "warmup_share",
    "schedule",
    "min_lr",
    "label_smoothing",
    "clip_norm",
    "weight_decay",
    "max_steps",
    "epochs",
    "time_budget",
    "fit_budget",
    "eval_every",
    "save_every",
    "log_every",
    "keep_last",
    "val_bleu",
    "best_metric",
    "patience",
    "final_eval",
    "ema_decay",
    "seed",
    "device",
    "precision",
    "compile",
)
# The most threads or processes one run may ask for: --nproc 1000000 would start as many.
MAX_PROCESSES = 1024
_ALIASES = {"source_field": ("--src-lang",), "target_field": ("--tgt-lang",)}
_CONFIG_PARAMETERS = [
    *(config_parameter(ModelConfig, name) for name in MODEL_OPTIONS),
    *(
        config_parameter(
            TrainConfig,
            name,
            *_ALIASES.get(name, ()),
            annotation=str | None if name == "time_budget" else None,
        )
        for name in TRAIN_OPTIONS
    ),
]
# `tformer train --help` groups its options by what they are for.
PANELS: dict[str, tuple[str, ...]] = {
    "Data": (
        "data", "source_field", "target_field", "text_field", "streaming", "strict",
        "num_proc", "cache_dir", "no_cache",
    ),
    "Tokenizer": ("tokenizer", "tokenizer_kind", "vocab_size", "separate_vocab",
                  "tokenizer_sample"),
    "Model": (
        "recipe", "preset", "arch", "d_model", "n_heads", "n_layers", "n_encoder_layers",
        "n_decoder_layers", "d_ff", "dropout", "attention_dropout", "max_len",
        "tie_embeddings",
    ),
    "Variants": (
        "kv_heads", "norm", "normalization", "activation", "positions", "output_bias",
        "source_eos", "embedding_scale", "norm_eps", "embedding_norm", "segment_embedding",
        "mlm_head", "bos_first", "document_bos", "relative_buckets", "relative_max_distance",
        "attention_scale", "linear_bias", "output_scale",
    ),
    "Optimisation & schedule": (
        "lr", "warmup_steps", "warmup_share", "schedule", "min_lr", "label_smoothing", "clip_norm",
        "weight_decay", "ema_decay", "seed",
    ),
    "Batching": ("max_tokens", "accumulate"),
    "How long, and validation": (
        "max_steps", "epochs", "time_budget", "fit_budget", "eval_every", "val_bleu",
        "best_metric", "patience", "final_eval",
    ),
    "Precision & devices": ("device", "precision", "compile", "threads", "nproc"),
    "Language models only": ("pack", "block_size", "mlm_probability", "mlm_mask",
                             "mlm_random"),
    "Logging & checkpoints": ("out", "log_every", "save_every", "keep_last", "log_to"),
    "Run": ("config", "print_config", "resume", "init_from", "allow_data_change",
            "overwrite", "dry_run_"),
}
_TOKENIZER_OPTIONS = {
    "tokenizer_kind": "kind",
    "vocab_size": "vocab_size",
    "tokenizer_sample": "sample",
}


@app.command("train")
@in_panels(PANELS)
@with_parameters([*dataclass_parameters(TrainFlags), *_CONFIG_PARAMETERS])
def train_command(ctx: typer.Context, **values: Any) -> None:
    """Train a Transformer; with no options, on the bundled date-normalisation data.

    Ctrl-C (or SIGTERM) finishes the current step, saves a checkpoint and exits 130 (143);
    `--resume` then continues exactly where it stopped. A second Ctrl-C stops at once.

    Example: tformer train --preset tiny --max-steps 2000 --out checkpoints/dates
    """
    flags = TrainFlags(**{name: values.pop(name) for name in TRAIN_FLAGS})
    _check_flags(flags)
    targets = log_targets(flags.log_to or [])
    check_installed(targets)
    job = plan_job(
        None,
        None,
        settings=_settings(ctx, flags, values),
        out=flags.out,
        resume=flags.resume or False,
        overwrite=flags.overwrite,
        init_from=flags.init_from,
    )
    given_flags = [flag(name) for name in (*_TOKENIZER_OPTIONS, "num_proc") if _given(ctx, name)]
    check_prepared_options(job.train, job.tokenizer, flags.num_proc, given_flags)
    if flags.print_config:  # fine-tuning: the architecture and tokenizer are the checkpoint's
        model = None if flags.init_from is not None else job.model
        typer.echo(dump_config(model, job.train, job.tokenizer), nl=False)
        return
    if flags.dry_run_:
        show_dry_run(dry_run(job, tokenizer=flags.tokenizer))
        return
    options = RunOptions(
        tokenizer=flags.tokenizer,
        overwrite=flags.overwrite,
        strict=flags.strict,
        tokenized_cache=None if flags.no_cache else (flags.cache_dir or default_cache_dir()),
        num_proc=flags.num_proc,
        allow_data_change=flags.allow_data_change,
        log_to=targets,
    )
    reporter = RichReporter()
    try:
        train_job(job, options, nproc=flags.nproc, reporter=reporter)
    finally:
        if reporter.progress is not None:  # leave the terminal clean for the error line
            reporter.progress.stop()


def _check_flags(flags: TrainFlags) -> None:
    """Refuse out-of-range counts and missing files before anything is resolved; set the
    threads asked for."""
    counts = (("--threads", flags.threads), ("--nproc", flags.nproc),
              ("--num-proc", flags.num_proc))  # fmt: skip
    for option, count in counts:
        if count is not None and not 1 <= count <= MAX_PROCESSES:
            raise ConfigError(f"{option} {count} must be from 1 to {MAX_PROCESSES}")
    if flags.threads is not None:
        set_threads(flags.threads)
        os.environ["OMP_NUM_THREADS"] = str(flags.threads)  # for the ranks of --nproc
    existing_file(flags.tokenizer, "--tokenizer")
    existing_file(flags.config, "--config")
    if flags.tokenizer_sample < 1:
        raise ConfigError(
            f"--tokenizer-sample {flags.tokenizer_sample} must be at least 1 pair"
        )


def _settings(ctx: typer.Context, flags: TrainFlags, values: dict[str, Any]) -> Settings:
    """What the command line asks for: the config values given, the recipe, preset and config
    file, and the tokenizer settings given."""
    given = {k: v for k, v in values.items() if _given(ctx, k)}
    if isinstance(given.get("time_budget"), str):
        given["time_budget"] = parse_duration(given["time_budget"])
    if flags.n_layers is not None:
        given["n_layers"] = flags.n_layers
    tokenizer_spec = {
        new: ctx.params[old] for old, new in _TOKENIZER_OPTIONS.items() if _given(ctx, old)
    }
    if flags.separate_vocab:
        tokenizer_spec["shared"] = False
    return Settings(recipe=flags.recipe, preset=flags.preset, config_file=flags.config,
                    values=given, tokenizer=tokenizer_spec)  # fmt: skip


def _given(ctx: typer.Context, name: str) -> bool:
    # Compared by name: Typer may carry its own copy of click's ParameterSource enum.
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"
