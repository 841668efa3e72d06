"""``tformer train``: train a model (the whole job), with a Rich progress display.

The options for config fields are derived from ``ModelConfig`` / ``TrainConfig`` (flag,
default and help); only the options given on the command line reach the library, which
resolves them over the recipe and the ``--config`` file (tformer.training.configs).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from tformer.cli.app import app
from tformer.cli.options import (
    SEPARATE_VOCAB,
    TOKENIZER_KIND,
    TOKENIZER_SAMPLE,
    VOCAB_SIZE,
    config_parameter,
    existing_file,
    in_panels,
    with_parameters,
)
from tformer.cli.progress import RichReporter, show_dry_run
from tformer.config import PRESETS, RECIPES, ModelConfig, TrainConfig, flag, parse_duration
from tformer.data.prepare import default_cache_dir
from tformer.device import set_threads
from tformer.errors import ConfigError
from tformer.training.configs import Settings, dump_config
from tformer.training.dryrun import dry_run
from tformer.training.inputs import check_prepared_options
from tformer.training.loggers import check_installed, log_targets
from tformer.training.run import plan_job, train

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
    "schedule",
    "min_lr",
    "label_smoothing",
    "clip_norm",
    "weight_decay",
    "max_steps",
    "epochs",
    "time_budget",
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
        "lr", "warmup_steps", "schedule", "min_lr", "label_smoothing", "clip_norm",
        "weight_decay", "ema_decay", "seed",
    ),
    "Batching": ("max_tokens", "accumulate"),
    "How long, and validation": (
        "max_steps", "epochs", "time_budget", "eval_every", "val_bleu", "best_metric",
        "patience", "final_eval",
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
@with_parameters(_CONFIG_PARAMETERS)
def train_command(
    ctx: typer.Context,
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Run folder. Default: checkpoints/<data name>.",
        show_default=False,
    ),
    resume: Path | None = typer.Option(
        None,
        "--resume",
        help="Continue a run exactly where it stopped: give its folder (latest checkpoint) or "
        "one of its step-* checkpoints (later ones are dropped). Training flags given again "
        "override the saved ones (and are listed); architecture flags must match.",
        show_default=False,
    ),
    init_from: Path | None = typer.Option(
        None,
        "--init-from",
        help="Fine-tune: start a new run from this checkpoint (or run folder's latest) with its "
        "weights, architecture and tokenizer, and a fresh optimizer, schedule and step count. "
        "Architecture and tokenizer flags must agree with it.",
        show_default=False,
    ),
    log_to: list[str] | None = typer.Option(
        None,
        "--log-to",
        help="Also log the metrics (and attention entropy per layer at each evaluation) to "
        "tensorboard (RUN/tensorboard/), wandb or mlflow; repeat or separate with commas. "
        "Needs the optional package: pip install \"tformer[tensorboard]\" ...",
        show_default=False,
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Replace the tformer run in --out (its checkpoints and metrics). A folder that is "
        "not a tformer run is never deleted.",
    ),
    strict: bool = typer.Option(
        False,
        "--strict",
        help="Refuse pairs longer than --max-len (or with an empty side) instead of skipping "
        "and counting them.",
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="A YAML file of settings (sections model, train, tokenizer), as --print-config "
        "writes it. Precedence: defaults < recipe < this file < flags given.",
        show_default=False,
    ),
    print_config: bool = typer.Option(
        False, "--print-config", help="Print the resolved settings as YAML and exit."
    ),
    recipe: str | None = typer.Option(
        None,
        "--recipe",
        show_default=False,
        help=f"Architecture + training settings for a data set ({', '.join(RECIPES)}, or "
        "none); default: 'dates' for the bundled data. They replace the defaults shown here; "
        "flags given still win.",
    ),
    preset: str | None = typer.Option(
        None,
        "--preset",
        help=f"Architecture preset: {', '.join(PRESETS)} (default: the recipe's, else small).",
        show_default=False,
    ),
    n_layers: int | None = typer.Option(
        None, "--n-layers", show_default=False, help="Encoder and decoder depth."
    ),
    tokenizer: Path | None = typer.Option(
        None,
        "--tokenizer",
        help="tokenizer.json or SentencePiece model (.model / .spm) to use (default: train "
        "one on the data).",
        show_default=False,
    ),
    tokenizer_kind: str = TOKENIZER_KIND,
    vocab_size: int = VOCAB_SIZE,
    separate_vocab: bool = SEPARATE_VOCAB,
    tokenizer_sample: int = TOKENIZER_SAMPLE,
    threads: int | None = typer.Option(
        None,
        "--threads",
        show_default=False,
        help="CPU threads for torch (default: torch's choice, one per physical core).",
    ),
    nproc: int | None = typer.Option(
        None,
        "--nproc",
        show_default=False,
        help="Train data-parallel with N processes on this machine (runs torchrun for you; "
        "--max-tokens is per process and step).",
    ),
    num_proc: int | None = typer.Option(
        None,
        "--num-proc",
        show_default=False,
        help="Processes that tokenise a large corpus (datasets.map).",
    ),
    cache_dir: Path | None = typer.Option(
        None,
        "--cache-dir",
        show_default=False,
        help="Where token ids are cached, keyed by data + tokenizer, so the next run over the "
        "same data starts at once (default: $TFORMER_CACHE or ~/.cache/tformer).",
    ),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Tokenise in memory; read and write no cache."
    ),
    allow_data_change: bool = typer.Option(
        False,
        "--allow-data-change",
        help="With --resume: train on even though the training data changed since the "
        "checkpoint was saved (refused otherwise, naming the split that changed).",
    ),
    dry_run_: bool = typer.Option(
        False,
        "--dry-run",
        help="Run a few steps on the largest batch the settings allow and report tokens/s, "
        "peak memory and the largest --max-tokens that fits; trains nothing, writes nothing.",
    ),
    **values: Any,
) -> None:
    """Train a Transformer; with no options, on the bundled date-normalisation data.

    Ctrl-C (or SIGTERM) finishes the current step, saves a checkpoint and exits 130 (143);
    `--resume` then continues exactly where it stopped. A second Ctrl-C stops at once.

    Example: tformer train --preset tiny --max-steps 2000 --out checkpoints/dates
    """
    for option, count in (("--threads", threads), ("--nproc", nproc), ("--num-proc", num_proc)):
        if count is not None and not 1 <= count <= MAX_PROCESSES:
            raise ConfigError(f"{option} {count} must be from 1 to {MAX_PROCESSES}")
    if threads is not None:
        set_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # for the ranks of --nproc
    existing_file(tokenizer, "--tokenizer")
    existing_file(config, "--config")
    given = {k: v for k, v in values.items() if _given(ctx, k)}
    if isinstance(given.get("time_budget"), str):
        given["time_budget"] = parse_duration(given["time_budget"])
    if n_layers is not None:
        given["n_layers"] = n_layers
    if tokenizer_sample < 1:
        raise ConfigError(f"--tokenizer-sample {tokenizer_sample} must be at least 1 pair")
    tokenizer_spec = {
        new: ctx.params[old] for old, new in _TOKENIZER_OPTIONS.items() if _given(ctx, old)
    }
    if separate_vocab:
        tokenizer_spec["shared"] = False
    settings = Settings(
        recipe=recipe, preset=preset, config_file=config, values=given, tokenizer=tokenizer_spec
    )
    targets = log_targets(log_to or [])
    check_installed(targets)
    job = plan_job(
        None,
        None,
        settings=settings,
        out=out,
        resume=resume or False,
        overwrite=overwrite,
        init_from=init_from,
    )
    given_flags = [flag(name) for name in (*_TOKENIZER_OPTIONS, "num_proc") if _given(ctx, name)]
    check_prepared_options(job.train, job.tokenizer, num_proc, given_flags)
    if print_config:  # fine-tuning: the architecture and tokenizer are the checkpoint's
        model = None if init_from is not None else job.model
        typer.echo(dump_config(model, job.train, job.tokenizer), nl=False)
        return
    if dry_run_:
        show_dry_run(dry_run(job, tokenizer=tokenizer))
        return
    reporter = RichReporter()
    try:
        train(
            None if resume else job.model,
            job.train,
            out=job.out,
            tokenizer=tokenizer,
            tokenizer_kind=job.tokenizer.kind,
            vocab_size=job.tokenizer.vocab_size,
            shared_vocab=job.tokenizer.shared,
            tokenizer_sample=job.tokenizer.sample,
            resume=resume or False,
            overwrite=overwrite,
            strict=strict,
            reporter=reporter,
            tokenized_cache=None if no_cache else (cache_dir or default_cache_dir()),
            num_proc=num_proc,
            nproc=nproc,
            allow_data_change=allow_data_change,
            init_from=init_from,
            log_to=targets,
        )
    finally:
        if reporter.progress is not None:  # leave the terminal clean for the error line
            reporter.progress.stop()


def _given(ctx: typer.Context, name: str) -> bool:
    # Compared by name: Typer may carry its own copy of click's ParameterSource enum.
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"
