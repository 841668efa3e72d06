"""``tformer train``'s own options (the config fields come from ModelConfig and TrainConfig):
one typed field each, its flag and help beside it, read by the command as one object."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import typer

from tformer.cli.options import SEPARATE_VOCAB, TOKENIZER_KIND, TOKENIZER_SAMPLE, VOCAB_SIZE
from tformer.config import PRESETS, RECIPES


@dataclass(frozen=True)
class TrainFlags:
    """The options of a run beyond its configs: folders, resuming, tokenizer, processes."""

    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Run folder. Default: checkpoints/<data name>.",
        show_default=False,
    )
    resume: Path | None = typer.Option(
        None,
        "--resume",
        help="Continue a run exactly where it stopped: give its folder (latest checkpoint) or "
        "one of its step-* checkpoints (later ones are dropped). Training flags given again "
        "override the saved ones (and are listed); architecture flags must match.",
        show_default=False,
    )
    init_from: Path | None = typer.Option(
        None,
        "--init-from",
        help="Fine-tune: start a new run from this checkpoint (or run folder's latest) with its "
        "weights, architecture and tokenizer, and a fresh optimizer, schedule and step count. "
        "Architecture and tokenizer flags must agree with it; a --recipe gives its training "
        "settings only.",
        show_default=False,
    )
    log_to: list[str] | None = typer.Option(
        None,
        "--log-to",
        help="Also log the metrics (and attention entropy per layer at each evaluation) to "
        "tensorboard (RUN/tensorboard/), wandb or mlflow; repeat or separate with commas. "
        "Needs the optional package: pip install \"tformer[tensorboard]\" ...",
        show_default=False,
    )
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Replace the tformer run in --out (its checkpoints and metrics). A folder that is "
        "not a tformer run is never deleted.",
    )
    strict: bool = typer.Option(
        False,
        "--strict",
        help="Refuse pairs longer than --max-len (or with an empty side) instead of skipping "
        "and counting them.",
    )
    config: Path | None = typer.Option(
        None,
        "--config",
        help="A YAML file of settings (sections model, train, tokenizer), as --print-config "
        "writes it. Precedence: defaults < recipe < this file < flags given.",
        show_default=False,
    )
    print_config: bool = typer.Option(
        False, "--print-config", help="Print the resolved settings as YAML and exit."
    )
    recipe: str | None = typer.Option(
        None,
        "--recipe",
        show_default=False,
        help=f"Architecture + training settings for a data set ({', '.join(RECIPES)}, or "
        "none); default: 'dates' for the bundled data. They replace the defaults shown here; "
        "flags given still win.",
    )
    preset: str | None = typer.Option(
        None,
        "--preset",
        help=f"Architecture preset: {', '.join(PRESETS)} (default: the recipe's, else small).",
        show_default=False,
    )
    n_layers: int | None = typer.Option(
        None, "--n-layers", show_default=False, help="Encoder and decoder depth."
    )
    tokenizer: Path | None = typer.Option(
        None,
        "--tokenizer",
        help="tokenizer.json or SentencePiece model (.model / .spm) to use (default: train "
        "one on the data).",
        show_default=False,
    )
    tokenizer_kind: str = TOKENIZER_KIND
    vocab_size: int = VOCAB_SIZE
    separate_vocab: bool = SEPARATE_VOCAB
    tokenizer_sample: int = TOKENIZER_SAMPLE
    threads: int | None = typer.Option(
        None,
        "--threads",
        show_default=False,
        help="CPU threads for torch (default: torch's choice, one per physical core).",
    )
    nproc: int | None = typer.Option(
        None,
        "--nproc",
        show_default=False,
        help="Train data-parallel with N processes on this machine (runs torchrun for you; "
        "--max-tokens is per process and step).",
    )
    num_proc: int | None = typer.Option(
        None,
        "--num-proc",
        show_default=False,
        help="Processes that tokenise a large corpus (datasets.map).",
    )
    cache_dir: Path | None = typer.Option(
        None,
        "--cache-dir",
        show_default=False,
        help="Where token ids are cached, keyed by data + tokenizer, so the next run over the "
        "same data starts at once (default: $TFORMER_CACHE or ~/.cache/tformer).",
    )
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Tokenise in memory; read and write no cache."
    )
    allow_data_change: bool = typer.Option(
        False,
        "--allow-data-change",
        help="With --resume: train on even though the training data changed since the "
        "checkpoint was saved (refused otherwise, naming the split that changed).",
    )
    dry_run_: bool = typer.Option(
        False,
        "--dry-run",
        help="Run a few steps on the largest batch the settings allow and report tokens/s, "
        "peak memory and the largest --max-tokens that fits; trains nothing, writes nothing.",
    )


TRAIN_FLAGS = tuple(field.name for field in fields(TrainFlags))
