"""``tformer train``: train a model (the whole job), with a Rich progress display."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import click
import typer
from rich.table import Table

from tformer.checkpoint import store as ckpt
from tformer.cli.app import app
from tformer.cli.console import console
from tformer.cli.options import (
    DATA,
    DEVICE,
    SOURCE_FIELD,
    TARGET_FIELD,
    default,
    existing_file,
)
from tformer.cli.progress import RichReporter
from tformer.config import (
    DEFAULT_PRESET,
    PRESETS,
    RECIPES,
    ModelConfig,
    TrainConfig,
    parse_duration,
    preset,
)
from tformer.data.tokenized import default_cache_dir
from tformer.data.tokenizer import TOKENIZER_KINDS
from tformer.device import resolve_device, set_threads
from tformer.errors import CheckpointError, ConfigError
from tformer.training import distributed as dist_
from tformer.training.dryrun import DryRunReport, measure_batch_limits
from tformer.training.run import check_architecture, train, with_older_checkpoint

T = TrainConfig
M = ModelConfig
# The command's parameters that are TrainConfig / ModelConfig fields of the same name.
_TRAIN_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}
_MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}


@app.command("train")
def train_command(
    ctx: typer.Context,
    data: str | None = DATA,
    source_field: str = SOURCE_FIELD,
    target_field: str = TARGET_FIELD,
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
    # tokenizer
    tokenizer: Path | None = typer.Option(
        None,
        "--tokenizer",
        help="tokenizer.json to use (default: train one on the data).",
        show_default=False,
    ),
    tokenizer_kind: str = typer.Option(
        "bpe", "--tokenizer-kind", help=f"{' | '.join(TOKENIZER_KINDS)}"
    ),
    vocab_size: int = typer.Option(8000, "--vocab-size", help="For an automatic tokenizer."),
    separate_vocab: bool = typer.Option(
        False, "--separate-vocab", help="Separate source and target vocabularies."
    ),
    # architecture
    recipe: str | None = typer.Option(
        None,
        "--recipe",
        show_default=False,
        help=f"Architecture + training settings for a data set ({', '.join(RECIPES)}, or "
        "none); default: 'dates' for the bundled data. Flags given still win.",
    ),
    preset_name: str = typer.Option(
        DEFAULT_PRESET, "--preset", help=f"Architecture preset: {', '.join(PRESETS)}."
    ),
    d_model: int | None = typer.Option(None, "--d-model", show_default=False),
    n_heads: int | None = typer.Option(None, "--n-heads", show_default=False),
    n_layers: int | None = typer.Option(
        None, "--n-layers", show_default=False, help="Encoder and decoder depth."
    ),
    n_encoder_layers: int | None = typer.Option(None, "--n-encoder-layers", show_default=False),
    n_decoder_layers: int | None = typer.Option(None, "--n-decoder-layers", show_default=False),
    d_ff: int | None = typer.Option(None, "--d-ff", show_default=False),
    dropout: float | None = typer.Option(None, "--dropout", show_default=False),
    attention_dropout: float | None = typer.Option(None, "--attention-dropout", show_default=False),
    norm: str | None = typer.Option(None, "--norm", help="post (paper) | pre", show_default=False),
    activation: str | None = typer.Option(
        None, "--activation", help="relu | gelu", show_default=False
    ),
    max_len: int | None = typer.Option(
        None,
        "--max-len",
        show_default=False,
        help="Longest sequence in tokens (longer pairs skipped).",
    ),
    tie_embeddings: bool | None = typer.Option(
        None,
        "--tie-embeddings/--no-tie-embeddings",
        show_default=False,
        help="Share embeddings and output projection (default: on).",
    ),
    # batching and optimisation
    max_tokens: int = typer.Option(
        default(T, "max_tokens"),
        "--max-tokens",
        help="Padded tokens per batch; lower it after an out-of-memory error.",
    ),
    accumulate: int = typer.Option(
        default(T, "accumulate"), "--accumulate", help="Batches per optimiser step."
    ),
    lr: float | None = typer.Option(
        None,
        "--lr",
        show_default=False,
        help="Peak learning rate (default: the paper's d_model^-0.5 * warmup^-0.5).",
    ),
    warmup_steps: int = typer.Option(default(T, "warmup_steps"), "--warmup-steps"),
    schedule: str = typer.Option(
        default(T, "schedule"),
        "--schedule",
        help="inverse-sqrt (paper) | cosine | linear | constant. cosine and linear decay to "
        "--min-lr by the end of --max-steps / --epochs / --time-budget.",
    ),
    min_lr: float = typer.Option(default(T, "min_lr"), "--min-lr"),
    label_smoothing: float = typer.Option(default(T, "label_smoothing"), "--label-smoothing"),
    clip_norm: float = typer.Option(default(T, "clip_norm"), "--clip-norm"),
    weight_decay: float = typer.Option(default(T, "weight_decay"), "--weight-decay"),
    # stopping and bookkeeping
    max_steps: int | None = typer.Option(None, "--max-steps", show_default=False),
    epochs: float | None = typer.Option(
        None, "--epochs", show_default=False, help="Default 10 when no other limit is set."
    ),
    time_budget: str | None = typer.Option(
        None, "--time-budget", show_default=False, help="e.g. 90s, 3m, 1h."
    ),
    eval_every: int = typer.Option(default(T, "eval_every"), "--eval-every"),
    save_every: int = typer.Option(default(T, "save_every"), "--save-every"),
    log_every: int = typer.Option(default(T, "log_every"), "--log-every"),
    keep_last: int = typer.Option(
        default(T, "keep_last"),
        "--keep-last",
        help="Step checkpoints to keep (the best one by validation loss is kept apart in best/).",
    ),
    val_bleu: int = typer.Option(
        default(T, "val_bleu"),
        "--val-bleu",
        help="At each evaluation, translate this many validation pairs (greedy) and report "
        "sacreBLEU and chrF (0 = off).",
    ),
    best_metric: str = typer.Option(
        default(T, "best_metric"),
        "--best-metric",
        help="What best/ keeps and --patience watches: val_loss | bleu | chrf (needs --val-bleu).",
    ),
    patience: int | None = typer.Option(
        None,
        "--patience",
        show_default=False,
        help="Stop after this many evaluations without a better --best-metric.",
    ),
    ema_decay: float = typer.Option(
        default(T, "ema_decay"),
        "--ema-decay",
        help="Keep an exponential moving average of the weights (e.g. 0.999; 0 = off); "
        "checkpoints and validation then use the average.",
    ),
    seed: int = typer.Option(default(T, "seed"), "--seed"),
    device: str = DEVICE,
    precision: str = typer.Option(
        default(T, "precision"),
        "--precision",
        help="auto | fp32 | bf16 | fp16. auto: bf16 autocast on GPUs that have it (else fp16 "
        "with a grad scaler) and on CPUs with AMX / AVX-512-BF16 for models with d_model >= "
        "256; fp32 otherwise.",
    ),
    compile_: bool = typer.Option(
        default(T, "compile"),
        "--compile/--no-compile",
        help="torch.compile the model for training (compiles once, then runs faster; "
        "checkpoints are unaffected).",
    ),
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
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Run a few steps on the largest batch the settings allow and report tokens/s, "
        "peak memory and the largest --max-tokens that fits; trains nothing, writes nothing.",
    ),
) -> None:
    """Train a Transformer; with no options, on the bundled date-normalisation data.

    Ctrl-C (or SIGTERM) finishes the current step, saves a checkpoint and exits 130 (143);
    `--resume` then continues exactly where it stopped. A second Ctrl-C stops at once.

    Example: tformer train --preset tiny --max-steps 2000 --out checkpoints/dates
    """
    params: dict[str, Any] = dict(ctx.params)
    params["compile"] = params.pop("compile_")
    params["time_budget"] = parse_duration(time_budget) if time_budget else None
    if threads is not None:
        set_threads(threads)
    if nproc is not None and not dist_.launched_by_torchrun():
        if resume is None and nproc > 1:  # a resumed run's device is the checkpoint's
            dist_.check_gpus_per_process(resolve_device(params["device"]), nproc)
        raise typer.Exit(launch_data_parallel(nproc))
    existing_file(tokenizer, "--tokenizer")
    if n_layers is not None:
        params["n_encoder_layers"] = params["n_encoder_layers"] or n_layers
        params["n_decoder_layers"] = params["n_decoder_layers"] or n_layers
    model_overrides = {k: v for k, v in params.items() if k in _MODEL_FIELDS and v is not None}
    train_values = {k: v for k, v in params.items() if k in _TRAIN_FIELDS}

    if resume is not None:
        if overwrite:
            raise ConfigError("--resume continues a run and --overwrite replaces it; give one")
        model_config, train_config = _resume_configs(ctx, resume, model_overrides, train_values)
    else:
        model_config, train_config = _new_configs(
            ctx, recipe, preset_name, model_overrides, train_values
        )

    if dry_run:
        if model_config is None:  # resuming: the run's own architecture and vocabulary
            folder = ckpt.resolve(resume)
            model_config = ckpt.parse_configs(folder, ckpt.read_verified_config(folder))[0]
            vocab_size = model_config.src_vocab_size
        show_dry_run(
            measure_batch_limits(
                model_config, train_config, tokenizer=tokenizer, vocab_size=vocab_size
            )
        )
        return
    reporter = RichReporter()
    try:
        train(
            model_config,
            train_config,
            out=out,
            tokenizer=tokenizer,
            tokenizer_kind=tokenizer_kind,
            vocab_size=vocab_size,
            shared_vocab=not separate_vocab,
            resume=resume if resume is not None else False,
            overwrite=overwrite,
            strict=strict,
            reporter=reporter,
            tokenized_cache=None if no_cache else (cache_dir or default_cache_dir()),
            num_proc=num_proc,
        )
    finally:
        if reporter.progress is not None:  # leave the terminal clean for the error line
            reporter.progress.stop()


def _given(ctx: click.Context, name: str) -> bool:
    # Compared by name: Typer may carry its own copy of click's ParameterSource enum.
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _new_configs(
    ctx: click.Context,
    recipe: str | None,
    preset_name: str,
    model_overrides: dict[str, Any],
    train_values: dict[str, Any],
) -> tuple[ModelConfig, TrainConfig]:
    """Defaults, then the recipe (if any), then the flags given on the command line."""
    if recipe is None and train_values.get("data") is None:
        recipe = "dates"
    if recipe is not None and recipe != "none" and recipe not in RECIPES:
        raise ConfigError(
            f"--recipe {recipe!r} is unknown; choose one of {', '.join(RECIPES)} or none"
        )
    chosen = RECIPES.get(recipe or "none", {"model": {}, "train": {}})
    if _given(ctx, "preset_name") or not chosen["model"]:
        model_config = preset(preset_name, **model_overrides)
    else:
        model_config = ModelConfig(**{**chosen["model"], **model_overrides})
    train_values = dict(train_values)
    # A stopping flag given by the user replaces the recipe's stopping rule as a whole.
    stops = ("max_steps", "epochs", "time_budget")
    user_stops = any(_given(ctx, k) for k in stops)
    for key, value in chosen["train"].items():
        if not _given(ctx, key) and not (user_stops and key in stops):
            train_values[key] = value
    return model_config, TrainConfig(**train_values)


def _resume_configs(
    ctx: click.Context, run: Path, model_overrides: dict[str, Any], train_values: dict[str, Any]
) -> tuple[None, TrainConfig]:
    """The saved configs, with the training flags given on this command line on top."""
    folder = ckpt.resolve(run)
    try:
        config = ckpt.read_verified_config(folder)
    except CheckpointError as error:
        if not ckpt.is_run_dir(folder.parent):
            raise
        raise with_older_checkpoint(error, folder.parent, folder) from error
    saved_model, saved, _ = ckpt.parse_configs(folder, config)
    saved_train = saved.to_dict()
    explicit = {k: v for k, v in model_overrides.items() if _given(ctx, k)}
    check_architecture(saved_model, explicit)
    changed = {
        k: v
        for k, v in train_values.items()
        if _given(ctx, k) or k == "time_budget" and v is not None
    }
    merged = {**saved_train, **changed}
    return None, TrainConfig.from_dict(merged, source=str(run))


def launch_data_parallel(nproc: int) -> int:
    """Re-run this very command under torchrun with ``nproc`` processes on this machine."""
    argv = sys.argv[1:]
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--nproc":
            skip = True
            continue
        if arg.startswith("--nproc="):
            continue
        kept.append(arg)
    if not kept or kept[0] != "train":
        kept = ["train", *kept]
    return dist_.launch(nproc, kept)


def show_dry_run(report: DryRunReport) -> None:
    table = Table(title="dry run (nothing was trained or written)", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    gib = 1024**3
    rows = [
        ("device / precision", f"{report.device} / {report.precision}"),
        ("parameters", f"{report.parameters:,}"),
        (
            "batch: rows x length (worst case)",
            f"{report.rows} x {report.seq_len} = {report.tokens_per_batch:,} tokens",
        ),
        ("time per step", f"{report.ms_per_step:,.1f} ms (mean of {report.steps})"),
        ("throughput", f"{report.tokens_per_s:,.0f} target tokens/s"),
        (f"peak memory ({report.memory})", f"{report.peak_bytes / gib:.2f} GiB"),
        ("before the batch (runtime, model, optimizer)", f"{report.baseline_bytes / gib:.2f} GiB"),
    ]
    if report.free_bytes is not None:
        rows.append(("free memory", f"{report.free_bytes / gib:.2f} GiB"))
    if report.max_tokens_fit is not None:
        verdict = "fits" if report.max_tokens_fit >= report.max_tokens else "does NOT fit"
        rows.append(("--max-tokens", f"{report.max_tokens:,} ({verdict})"))
        rows.append(("largest --max-tokens (estimate)", f"{report.max_tokens_fit:,}"))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
