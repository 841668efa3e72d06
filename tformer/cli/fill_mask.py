"""``tformer fill-mask``: the most probable tokens at each <mask> of a sentence (encoder-only)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from tformer.analysis.language import fill_mask
from tformer.cli.app import app
from tformer.cli.console import console
from tformer.cli.data_options import checkpoint_family
from tformer.cli.options import (
    CHECKPOINT,
    CHECKPOINT_CHOICE,
    DEVICE,
    QUANTIZE,
    apply_quantize,
    load_chosen,
)
from tformer.errors import ConfigError

MAX_TOP_K = 1000


@app.command("fill-mask")
def fill_mask_command(
    checkpoint: Path = CHECKPOINT,
    checkpoint_choice: str = CHECKPOINT_CHOICE,
    text: str = typer.Argument(
        ...,
        help='A sentence with one or more <mask> (or the model\'s own mask token: [MASK] for '
        'a BERT import), e.g. "6 <mask> 2025 = 2025-03-06".',
    ),
    top_k: int = typer.Option(5, "--top-k", "-k", help="Fillers shown per mask."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    device: str = DEVICE,
    quantize: str = QUANTIZE,
) -> None:
    """Fill in each <mask> of TEXT with an encoder-only (masked language) model; an import
    also takes its own mask token (BERT's [MASK]).

    Example: tformer fill-mask checkpoints/text "6 <mask> 2025 = 2025-03-06"
    """
    if not 1 <= top_k <= MAX_TOP_K:
        raise ConfigError(f"--top-k {top_k} must be from 1 to {MAX_TOP_K}")
    checkpoint_family(checkpoint, "fill-mask", "fills_masks")
    ckpt = load_chosen(checkpoint, device)
    apply_quantize(ckpt.model, quantize)
    results = fill_mask(ckpt, text, top_k=top_k)
    if as_json:
        data = {
            "input": text,
            "masks": [
                {
                    "position": r.position,
                    "fillers": [
                        {"token": f.token, "text": f.text, "probability": f.probability}
                        for f in r.fillers
                    ],
                }
                for r in results
            ],
        }
        print(json.dumps(data, ensure_ascii=False, indent=2))
        return
    for number, result in enumerate(results, start=1):
        table = Table(
            title=f"<mask> {number} (token {result.position})", title_justify="left"
        )
        table.add_column("#", justify="right")
        table.add_column("filler")
        table.add_column("probability", justify="right")
        for rank, filler in enumerate(result.fillers, start=1):
            shown = escape(filler.text or filler.token)
            table.add_row(str(rank), shown, f"{filler.probability:.4f}")
        console.print(table)
