"""``tformer info``: the architecture and parameter counts of a checkpoint or a preset."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from tformer.checkpoint.store import load_checkpoint, read_origin
from tformer.checkpoint.training_state import saved_record
from tformer.cli.app import app
from tformer.cli.console import console
from tformer.config import DEFAULT_PRESET, PRESETS, ModelConfig, preset
from tformer.errors import ConfigError
from tformer.model import Transformer, model_class


@app.command("info")
def info_command(
    checkpoint: Path | None = typer.Argument(
        None, help="A run or checkpoint folder.", show_default=False
    ),
    preset_name: str | None = typer.Option(
        None, "--preset", help=f"Describe a preset: {', '.join(PRESETS)}.", show_default=False
    ),
    vocab_size: int = typer.Option(8000, "--vocab-size", help="Vocabulary size for --preset."),
) -> None:
    """Show the architecture and parameter counts (total and per part).

    Example: tformer info --preset base --vocab-size 37000
    """
    if checkpoint is not None and preset_name is not None:
        raise ConfigError("give a CHECKPOINT or --preset, not both")
    if checkpoint is not None:
        loaded = load_checkpoint(checkpoint)
        model, source = loaded.model, f"{loaded.path} (step {loaded.step})"
        origin = read_origin(loaded.path)
        if origin is not None:
            console.print(
                f"imported from {origin.get('source')} ({origin.get('model_type')}, "
                f"{origin.get('tokenizer')}, transformers {origin.get('transformers_version')})",
                soft_wrap=True,
                highlight=False,
            )
        start = saved_record(loaded.path, "init_from")
        if start is not None:
            console.print(
                f"fine-tuned from {start.get('path')} (step {start.get('step')}, weights "
                f"sha256 {start.get('weights_sha256')})",
                soft_wrap=True,
                highlight=False,
            )
    else:
        name = preset_name or DEFAULT_PRESET
        model = Transformer(preset(name, src_vocab_size=vocab_size, tgt_vocab_size=vocab_size))
        source = f"preset {name}, vocabulary {vocab_size:,}"

    arch = Table(title=f"architecture: {source}", title_justify="left")
    arch.add_column("setting")
    arch.add_column("value", justify="right")
    config = model.config
    for key, value in config.to_dict().items():
        if key in config.unused_fields:
            continue
        arch.add_row(
            key,
            f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value),
        )
    for key, value in derived_rows(config):
        arch.add_row(key, value, style="dim")
    console.print(arch)

    counts = model.parameter_counts()
    params = Table(title="parameters", title_justify="left")
    params.add_column("part")
    params.add_column("count", justify="right")
    params.add_column("share", justify="right")
    for part in ("embeddings", "encoder", "decoder", "attention", "feed_forward", "total"):
        if part not in counts:
            continue
        params.add_row(part, f"{counts[part]:,}", f"{counts[part] / counts['total']:.1%}")
    console.print(params)


def derived_rows(config: ModelConfig) -> list[tuple[str, str]]:
    """What the settings imply: the effective key/value heads and feed-forward width, and the
    decoder's key/value cache per token (float32)."""
    groups = config.n_heads // config.n_kv_heads
    rows = [
        (
            "key/value heads (effective)",
            f"{config.n_kv_heads} ({groups} query head{'s' * (groups > 1)} each)",
        ),
        ("feed-forward hidden width (effective)", f"{config.ffn_hidden:,}"),
    ]
    if model_class(config.arch).generates:  # else it reads its input at once: nothing cached
        rows.append(("KV cache bytes per token (float32)", kv_cache_text(config)))
    return rows


def kv_cache_text(config: ModelConfig) -> str:
    """``"8,192 (1/4 of multi-head)"``: the cache per token, and its share of the paper's."""
    size = f"{config.kv_cache_bytes_per_token():,}"
    if config.n_kv_heads == config.n_heads:
        return size
    return f"{size} ({config.n_kv_heads}/{config.n_heads} of multi-head)"
