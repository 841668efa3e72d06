"""Attention heatmaps: Rich tables for the terminal, PNG and JSON files for later."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.color import Color
from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text
from torch import Tensor

from tformer.errors import ConfigError
from tformer.tokenizer import SPECIAL_TOKENS

# A viridis-like ramp: dark for ~0, bright for ~1, readable on dark and light terminals.
_RAMP = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]
_SPECIAL_STYLE = "bold magenta"


def weight_color(value: float) -> Color:
    """Interpolate the ramp at ``value`` in [0, 1]."""
    value = min(max(value, 0.0), 1.0) * (len(_RAMP) - 1)
    low = int(value)
    high = min(low + 1, len(_RAMP) - 1)
    frac = value - low
    rgb = [round(a + (b - a) * frac) for a, b in zip(_RAMP[low], _RAMP[high], strict=True)]
    return Color.from_rgb(*rgb)


def _label(token: str, width: int = 12) -> Text:
    shown = token if len(token) <= width else token[: width - 1] + "…"
    return Text(shown, style=_SPECIAL_STYLE if token in SPECIAL_TOKENS else "")


def _vertical(token: str, height: int) -> Text:
    """A column label written top to bottom, so narrow columns still carry their token."""
    shown = token if len(token) <= height else token[: height - 1] + "…"
    return Text("\n".join(shown), style=_SPECIAL_STYLE if token in SPECIAL_TOKENS else "")


def legend() -> Text:
    text = Text("0 ")
    for i in range(21):
        text.append("█", style=Style(color=weight_color(i / 20)))
    return text.append(" 1")


def heatmap(
    matrix: Tensor,
    rows: Sequence[str],
    cols: Sequence[str],
    *,
    width: int = 80,
    values: bool = False,
    title: str = "",
) -> RenderableType:
    """A labelled heatmap; columns that do not fit ``width`` are folded into further blocks."""
    cell = 4 if values else 2
    label_width = min(max((len(r) for r in rows), default=1), 12) + 1
    per_block = max(1, (width - label_width - 4) // (cell + 1))
    header_height = min(max((len(c) for c in cols), default=1), 8)
    blocks: list[RenderableType] = []
    for start in range(0, len(cols), per_block):
        stop = min(start + per_block, len(cols))
        caption = f"columns {start}-{stop - 1} of {len(cols)}" if len(cols) > per_block else None
        table = Table(
            title=title if start == 0 else None,
            title_justify="left",
            caption=caption,
            caption_justify="left",
            box=None,
            padding=(0, 1, 0, 0),
            show_edge=False,
        )
        table.add_column("", justify="right", no_wrap=True)
        for c in range(start, stop):
            table.add_column(
                _vertical(cols[c], header_height), justify="center", width=cell, no_wrap=True
            )
        for r, row_label in enumerate(rows):
            cells: list[RenderableType] = [_label(row_label)]
            for c in range(start, stop):
                v = float(matrix[r, c])
                bg = weight_color(v)
                fg = "black" if v > 0.55 else "white"
                text = f"{v:.2f}"[1:] if values and v < 1 else ("1.0" if values else "")
                cells.append(Text(text.rjust(cell), style=Style(bgcolor=bg, color=fg)))
            table.add_row(*cells)
        blocks.append(table)
    blocks.append(legend())
    return Group(*blocks)


def head_grid(
    maps: Tensor, rows: Sequence[str], cols: Sequence[str], *, width: int = 80, title: str = ""
) -> RenderableType:
    """All heads of one layer side by side, one character per cell, row labels once."""
    n_heads = maps.shape[0]
    label_width = min(max((len(r) for r in rows), default=1), 12) + 1
    per_line = max(1, (width - label_width) // (len(cols) + 2))
    blocks: list[RenderableType] = [Text(title, style="bold")] if title else []
    for start in range(0, n_heads, per_line):
        heads = range(start, min(start + per_line, n_heads))
        table = Table(box=None, padding=(0, 1, 0, 0), show_edge=False)
        table.add_column("", justify="right", no_wrap=True)
        for h in heads:
            table.add_column(f"h{h}", no_wrap=True, width=len(cols))
        for r, row_label in enumerate(rows):
            cells: list[RenderableType] = [_label(row_label)]
            for h in heads:
                line = Text()
                for c in range(len(cols)):
                    line.append("█", style=Style(color=weight_color(float(maps[h, r, c]))))
                cells.append(line)
            table.add_row(*cells)
        blocks.append(table)
    blocks.append(legend())
    return Group(*blocks)


def save_map(
    path: Path,
    weights: Tensor,
    rows: Sequence[str],
    cols: Sequence[str],
    meta: dict[str, Any],
) -> None:
    """Write the selected map(s) as ``.json`` (tokens + weights) or ``.png`` (a heatmap)."""
    suffix = path.suffix.lower()
    if suffix not in (".json", ".png"):
        raise ConfigError(f"--save {path}: unsupported file type; use .json or .png")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".json":
        record = {
            **meta,
            "rows": list(rows),
            "columns": list(cols),
            "shape": list(weights.shape),
            "weights": weights.tolist(),
        }
        path.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
        return
    _save_png(path, weights, rows, cols, meta)


def _save_png(
    path: Path, weights: Tensor, rows: Sequence[str], cols: Sequence[str], meta: dict[str, Any]
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    maps = weights[None] if weights.dim() == 2 else weights
    n = maps.shape[0]
    ncols = min(n, 4)
    nrows = (n + ncols - 1) // ncols
    cell = 0.32
    fig_w = max(4.0, ncols * (len(cols) * cell + 1.5))
    fig_h = max(3.0, nrows * (len(rows) * cell + 1.5))
    fig, axes = plt.subplots(nrows, ncols, figsize=(fig_w, fig_h), squeeze=False)
    for index, ax in enumerate(axes.flat):
        if index >= n:
            ax.axis("off")
            continue
        image = ax.imshow(maps[index].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(cols)), list(cols), rotation=90, fontsize=8)
        ax.set_yticks(range(len(rows)), list(rows), fontsize=8)
        if n > 1:
            ax.set_title(f"head {index}", fontsize=9)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8)
    fig.suptitle(
        f"{meta.get('kind')} attention, layer {meta.get('layer')}, head {meta.get('head')}",
        fontsize=10,
    )
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
