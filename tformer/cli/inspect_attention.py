"""``tformer inspect-attention``: explore attention maps in the terminal, or save them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from tformer.analysis.attention import (
    KINDS,
    AttentionResult,
    AttentionSelection,
    Head,
    Layer,
    check_kind,
    default_kind,
    inspect_attention,
)
from tformer.analysis.head_stats import eos_column, head_statistics
from tformer.cli.app import app
from tformer.cli.console import console, err_console
from tformer.cli.data_options import checkpoint_family
from tformer.cli.decoding_options import decoding_config, decoding_parameters
from tformer.cli.options import (
    CHECKPOINT,
    CHECKPOINT_CHOICE,
    DEVICE,
    MASK_HEADS,
    apply_mask_heads,
    load_chosen,
    warn_long_inputs,
    warn_long_target,
    with_parameters,
)
from tformer.cli.render import render_selection, stats_table
from tformer.cli.render_files import check_save_path, save_maps
from tformer.config import ModelConfig
from tformer.errors import CheckpointError, ConfigError
from tformer.model import TransformerBase


def parse_layer(text: str) -> Layer:
    """``--layer``: a number (negative counts from the end) or ``all``."""
    if text == "all":
        return "all"
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            f"--layer {text!r} must be a layer number (negative counts from the end) or 'all'"
        ) from None


def parse_head(text: str) -> Head:
    """``--head``: a number (negative counts from the end), ``all`` or ``mean``."""
    if text in ("all", "mean"):
        return text  # type: ignore[return-value]
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--head {text!r} must be a head number, 'all' or 'mean'") from None


@app.command("inspect-attention")
@with_parameters(
    decoding_parameters("temperature", "max_new_tokens", "seed"), after="save"
)
def inspect_attention_command(
    checkpoint: Path = CHECKPOINT,
    checkpoint_choice: str = CHECKPOINT_CHOICE,
    text: str = typer.Argument(..., help="The source text.", show_default=False),
    target: str | None = typer.Option(
        None,
        "--target",
        help="Teacher-force this target (default: the model's own output).",
        show_default=False,
    ),
    kind: str | None = typer.Option(
        None,
        "--kind",
        "-k",
        help="encoder | decoder | cross (default: cross; a decoder-only model's decoder, an "
        "encoder-only model's encoder).",
        show_default=False,
    ),
    layer: str = typer.Option(
        "-1", "--layer", "-l", help="A layer number (negative counts from the end) or 'all'."
    ),
    head: str = typer.Option("mean", "--head", help="A head number, 'all' or 'mean'."),
    values: bool = typer.Option(
        False, "--values", help="Print the weights in the cells of a single map."
    ),
    stats: bool = typer.Option(
        False, "--stats", help="Add a table of every head: entropy, positional shares, pattern."
    ),
    save: Path | None = typer.Option(
        None,
        "--save",
        help="Also write the selection to .png, .html (interactive, every map), .json or .npz.",
        show_default=False,
    ),
    device: str = DEVICE,
    mask_heads: str | None = MASK_HEADS,
    **decoding_flags: Any,
) -> None:
    """Show attention weights as heatmaps with token labels, or save them.

    Rows of decoder and cross maps are decoder positions: row "<bos>"
    predicts the first output token. The target is the model's own output
    (greedy unless --temperature, at most --max-new-tokens long) or
    --target, teacher-forced. Wide maps fold to the terminal width;
    --stats tags each head with its pattern.

    Examples:

      tformer inspect-attention checkpoints/dates "6 March 2025" --values

      tformer inspect-attention checkpoints/dates "6 Mar 2025" --layer all --stats

      tformer inspect-attention checkpoints/dates "03/06/25" --save map.html

      tformer inspect-attention checkpoints/gpt2 "The cat" --max-new-tokens 8
    """
    which_layer, which_head = _check_options(kind, layer, head, save)
    decoding = decoding_config(decoding_flags)
    family = checkpoint_family(checkpoint, "inspect-attention")
    kind = kind or default_kind(family)
    check_kind(kind, family)
    loaded = load_chosen(checkpoint, device)
    apply_mask_heads(loaded.model, mask_heads)
    warn_long_inputs(loaded.tokenizers.source, [text], loaded.model_config.max_len)
    if target is not None:
        warn_long_target(loaded.tokenizers.target, target, loaded.model_config.max_len)
    result = inspect_attention(loaded, text, target, decoding)
    selection = result.selection(kind, which_layer, which_head, checkpoint=str(loaded.path))
    _show_texts(result, family)
    grouping = head_groups(loaded.model_config)
    if grouping is not None:
        console.print(grouping, soft_wrap=True, highlight=False)
    console.print(render_selection(selection, width=console.width, values=values))
    if stats:
        console.print(_stats(result, selection, kind))
    if save is not None:
        _save(save, result, selection, values=values)


def _check_options(
    kind: str | None, layer: str, head: str, save: Path | None
) -> tuple[Layer, Head]:
    """Refuse a bad --kind, --layer, --head or --save before the checkpoint is read; the
    layer and head chosen."""
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"--kind {kind!r} must be one of {', '.join(KINDS)}")
    which = parse_layer(layer), parse_head(head)
    check_save_path(save)
    return which


def _stats(result: AttentionResult, selection: AttentionSelection, kind: str) -> Table:
    """--stats: every head of ``kind``'s maps, with its entropy, positional shares and
    pattern."""
    maps = result.maps(kind)
    head_stats = head_statistics(maps, causal=kind == "decoder", eos=eos_column(selection.columns))
    return stats_table(head_stats, kind)


def _show_texts(result: AttentionResult, family: type[TransformerBase]) -> None:
    """The texts the maps are of: the input, or the source (prompt) and the target
    (continuation), saying whether the model wrote it."""
    if not family.generates:
        console.print(f"input: {escape(result.source_text)}", soft_wrap=True)
        return
    origin = "model output" if result.generated else "given target"
    first = "prompt" if family.continues_prompts else "source"
    second = "continuation" if family.continues_prompts else "target"
    console.print(
        f"{first}: {escape(result.source_text)}\n{second} ({origin}): "
        f"{escape(result.target_text)}",
        soft_wrap=True,
    )


def _save(
    path: Path, result: AttentionResult, selection: AttentionSelection, *, values: bool
) -> None:
    """--save: the selection written to ``path``, or one line saying it cannot be."""
    try:
        save_maps(path, result, selection, values=values)
    except OSError as error:
        raise CheckpointError(
            f"--save {path}: cannot be written ({error.strerror or error}); give a writable path"
        ) from error
    err_console.print(f"wrote {escape(str(path))}", soft_wrap=True)


def head_groups(config: ModelConfig) -> str | None:
    """With grouped-query attention, which query heads share each key/value head (the maps
    stay one per query head); None for the paper's multi-head attention."""
    groups = config.n_heads // config.n_kv_heads
    if groups == 1:
        return None
    shares = ", ".join(
        f"h{g * groups}-h{(g + 1) * groups - 1} -> kv{g}" for g in range(config.n_kv_heads)
    )
    return (
        f"grouped-query attention: {config.n_heads} query heads share {config.n_kv_heads} "
        f"key/value heads ({shares}); maps are per query head"
    )
