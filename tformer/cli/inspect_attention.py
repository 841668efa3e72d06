"""``tformer inspect-attention``: show one attention map, or all heads of a layer."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from tformer.checkpoint import load_checkpoint
from tformer.cli import app
from tformer.cli.console import console
from tformer.cli.options import CHECKPOINT, DEVICE, SEED, TEMPERATURE
from tformer.cli.render import head_grid, heatmap, save_map
from tformer.decoding import DecodingConfig
from tformer.device import resolve_device
from tformer.errors import ConfigError
from tformer.inspection import KINDS, inspect_attention


def parse_head(text: str) -> int | str:
    if text in ("all", "mean"):
        return text
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--head {text!r} must be a head number, 'all' or 'mean'") from None


@app.command("inspect-attention")
def inspect_attention_command(
    checkpoint: Path = CHECKPOINT,
    text: str = typer.Argument(..., help="The source text.", show_default=False),
    target: str | None = typer.Option(
        None,
        "--target",
        help="Teacher-force this target (default: the model's own output).",
        show_default=False,
    ),
    kind: str = typer.Option("cross", "--kind", "-k", help="encoder | decoder | cross"),
    layer: int = typer.Option(-1, "--layer", "-l", help="Layer; negative counts from the end."),
    head: str = typer.Option("mean", "--head", help="A head number, 'all' or 'mean'."),
    values: bool = typer.Option(False, "--values", help="Print the weights in the cells."),
    save: Path | None = typer.Option(
        None, "--save", help="Write .json or .png.", show_default=False
    ),
    temperature: float = TEMPERATURE,
    seed: int | None = SEED,
    device: str = DEVICE,
) -> None:
    """Show attention weights as a heatmap with token labels.

    Rows of decoder and cross maps are decoder positions: row "<bos>" predicts the first
    output token. Example: tformer inspect-attention checkpoints/dates "6 March 2025"
    """
    if kind not in KINDS:
        raise ConfigError(f"--kind {kind!r} must be one of {', '.join(KINDS)}")
    which = parse_head(head)
    decoding = DecodingConfig(temperature=temperature, seed=seed)
    loaded = load_checkpoint(checkpoint, resolve_device(device))
    result = inspect_attention(loaded.model, loaded.tokenizers, text, target, decoding)
    weights = result.select(kind, layer, which)
    rows, cols = result.labels(kind)
    n_layers = result.maps(kind).shape[0]
    shown_layer = layer % n_layers
    origin = "model output" if result.generated else "given target"
    title = f"{kind} attention · layer {shown_layer} · head {head}"
    console.print(
        f"source: {escape(result.source_text)}\ntarget ({origin}): {escape(result.target_text)}"
    )
    if which == "all":
        console.print(head_grid(weights, rows, cols, width=console.width, title=title))
    else:
        console.print(heatmap(weights, rows, cols, width=console.width, values=values, title=title))
    if save is not None:
        meta = {
            "checkpoint": str(loaded.path),
            "source": result.source_text,
            "target": result.target_text,
            "kind": kind,
            "layer": shown_layer,
            "head": head,
        }
        save_map(save, weights, rows, cols, meta)
        console.print(f"wrote {escape(str(save))}")
