"""Attention maps in the terminal: labelled heatmaps, head grids, a layer overview, statistics.

Everything is laid out line by line to a given width, so a map never wraps: wide maps fold
into blocks of columns, and grids of heads move on to further lines. Cells are coloured on
one fixed 0..1 scale (a legend closes every map), so maps compare with each other.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.cells import cell_len
from rich.color import Color
from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text
from torch import Tensor

from tformer.analysis.attention import AttentionSelection
from tformer.analysis.head_stats import HeadStats
from tformer.data.display import is_special

# A viridis-like ramp: dark for ~0, bright for ~1, readable on dark and light terminals.
RAMP = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]
SPECIAL_STYLE = "bold magenta"
MAX_LABEL = 12  # characters of a row label
MAX_HEADER = 8  # lines of a vertical column label
GAP = 2  # spaces between panels of a grid


def weight_rgb(value: float) -> tuple[int, int, int]:
    """Interpolate the ramp at ``value`` in [0, 1]."""
    value = min(max(value, 0.0), 1.0) * (len(RAMP) - 1)
    low = int(value)
    high = min(low + 1, len(RAMP) - 1)
    frac = value - low
    r, g, b = (round(a + (z - a) * frac) for a, z in zip(RAMP[low], RAMP[high], strict=True))
    return r, g, b


def weight_color(value: float) -> Color:
    return Color.from_rgb(*weight_rgb(value))


def legend() -> Text:
    """The colour scale: weights run from 0 (dark) to 1 (bright); each row sums to 1."""
    text = Text("weight 0 ")
    for i in range(21):
        text.append("█", style=Style(color=weight_color(i / 20)))
    return text.append(" 1   ").append("<special>", style=SPECIAL_STYLE).append(" tokens")


def _token_style(token: str) -> str:
    return SPECIAL_STYLE if is_special(token) else ""


def _clip(token: str, width: int) -> str:
    return token if len(token) <= width else token[: max(width - 1, 0)] + "…"


def _label_width(rows: Sequence[str], width: int) -> int:
    return max(1, min(max((cell_len(r) for r in rows), default=1), MAX_LABEL, width // 4))


def _row_label(token: str, width: int) -> Text:
    """Right-aligned in ``width`` terminal cells (wide characters count twice)."""
    text = Text(token, style=_token_style(token))
    text.truncate(width, overflow="ellipsis")
    text.pad_left(width - text.cell_len)
    return text


def _vertical_header(cols: Sequence[str], cell: int, gap: int) -> list[Text]:
    """Column labels written top to bottom, bottom-aligned, each centred over its cell."""
    height = min(max((len(c) for c in cols), default=1), MAX_HEADER)
    lines = [Text() for _ in range(height)]
    for token in cols:
        shown = _clip(token, height)
        padded = " " * (height - len(shown)) + shown
        for line, char in zip(lines, padded, strict=True):
            line.append(" " * gap)
            line.append(char.center(cell), style=_token_style(token))
    return lines


def _blocks(n: int, size: int) -> list[range]:
    size = max(1, size)
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


# -- one map ----------------------------------------------------------------------------------


def heatmap(
    matrix: Tensor,
    rows: Sequence[str],
    cols: Sequence[str],
    *,
    width: int = 80,
    values: bool = False,
    title: str = "",
) -> RenderableType:
    """A labelled heatmap of one (R, C) map; columns that do not fit ``width`` fold into blocks.

    With ``values`` each cell also prints its weight (".42"; "1.0" for one).
    """
    cell = 3 if values else 2
    label_w = _label_width(rows, width)
    per_block = (width - label_w) // (cell + 1)
    lines: list[RenderableType] = [Text(title, style="bold")] if title else []
    blocks = _blocks(len(cols), per_block)
    for block in blocks:
        if len(blocks) > 1:
            lines.append(
                Text(f"columns {block.start}-{block.stop - 1} of {len(cols)}", style="dim")
            )
        for header in _vertical_header([cols[c] for c in block], cell, 1):
            lines.append(Text(" " * label_w) + header)
        for r, token in enumerate(rows):
            line = _row_label(token, label_w)
            for c in block:
                v = float(matrix[r, c])
                line.append(" ")
                line.append(_cell_text(v, cell, values), style=_cell_style(v, values))
            lines.append(line)
    lines.append(legend())
    return Group(*lines)


_SHADES = " ░▒▓█"


def _cell_text(value: float, cell: int, values: bool) -> str:
    if not values:
        # A shade glyph drawn in the cell's own colour: invisible on a colour terminal, and
        # still a readable heatmap where colour is off (NO_COLOR, output piped to a file).
        level = min(int(max(value, 0.0) * len(_SHADES)), len(_SHADES) - 1)
        return _SHADES[level] * cell
    return "1.0" if value >= 0.995 else f"{value:.2f}"[1:]


def _cell_style(value: float, values: bool = True) -> Style:
    if not values:
        return Style(bgcolor=weight_color(value), color=weight_color(value))
    return Style(bgcolor=weight_color(value), color="black" if value > 0.55 else "white")


# -- grids of small maps ----------------------------------------------------------------------


def _full_panel(matrix: Tensor, cols: Sequence[str], block: range, title: str) -> list[Text]:
    """One map at one character per cell, with vertical column labels and a title."""
    width = max(len(block), len(title))
    lines = [Text(title.ljust(width), style="bold")]
    lines += [
        h.append(" " * (width - len(block)))
        for h in _vertical_header([cols[c] for c in block], 1, 0)
    ]
    for r in range(matrix.shape[0]):
        line = Text()
        for c in block:
            line.append("█", style=Style(color=weight_color(float(matrix[r, c]))))
        lines.append(line.append(" " * (width - len(block))))
    return lines


def _compact_panel(matrix: Tensor, block: range, title: str) -> list[Text]:
    """One map at half a line per row: "▀" takes row 2k as its colour and row 2k+1 as ground."""
    width = max(len(block), len(title))
    lines = [Text(title.ljust(width), style="bold")]
    n_rows = matrix.shape[0]
    for top in range(0, n_rows, 2):
        line = Text()
        for c in block:
            upper = weight_color(float(matrix[top, c]))
            lower = weight_color(float(matrix[top + 1, c])) if top + 1 < n_rows else None
            line.append("▀", style=Style(color=upper, bgcolor=lower))
        lines.append(line.append(" " * (width - len(block))))
    return lines


def _arrange(panels: list[list[Text]], left: list[Text], width: int) -> list[Text]:
    """Panels side by side after a ``left`` label column, wrapping when ``width`` runs out."""
    left_w = max((t.cell_len for t in left), default=0)
    out: list[Text] = []
    line_panels: list[list[Text]] = []
    used = left_w
    for panel in [*panels, None]:
        panel_w = len(panel[0]) if panel else 0
        if panel is None or (line_panels and used + GAP + panel_w > width):
            height = max(len(left), *(len(p) for p in line_panels))
            for i in range(height):
                text = (left[i] if i < len(left) else Text()).copy()
                text.pad_right(left_w - text.cell_len)
                for p in line_panels:
                    text.append(" " * GAP)
                    text.append(p[i] if i < len(p) else Text(" " * len(p[0])))
                out.append(text)
            line_panels, used = [], left_w
        if panel is not None:
            line_panels.append(panel)
            used += GAP + panel_w
    return out


def head_grid(
    maps: Tensor, rows: Sequence[str], cols: Sequence[str], *, width: int = 80, title: str = ""
) -> RenderableType:
    """All heads of one layer (H, R, C) side by side, one character per cell, labelled."""
    label_w = _label_width(rows, width)
    blocks = _blocks(len(cols), width - label_w - GAP)
    header_h = min(max((len(c) for c in cols), default=1), MAX_HEADER)
    left = [Text(""), *(Text("") for _ in range(header_h)), *(_row_label(t, label_w) for t in rows)]
    lines: list[RenderableType] = [Text(title, style="bold")] if title else []
    for block in blocks:
        suffix = f" [{block.start}-{block.stop - 1}]" if len(blocks) > 1 else ""
        panels = [_full_panel(maps[h], cols, block, f"h{h}{suffix}") for h in range(len(maps))]
        lines += _arrange(panels, left, width)
    lines.append(legend())
    return Group(*lines)


def overview(
    maps: Tensor, rows: Sequence[str], cols: Sequence[str], *, width: int = 80, title: str = ""
) -> RenderableType:
    """Every layer at a glance: one line of small maps per layer, one map per head.

    ``maps`` is (L, H, R, C), or (L, R, C) for one map per layer (a head, or their mean).
    Maps wider than the terminal show their first columns only: pick a layer for the rest.
    """
    per_layer = maps if maps.dim() == 4 else maps[:, None]
    left_w = len(f"layer {len(per_layer) - 1}")
    room = width - left_w - GAP
    shown = range(min(len(cols), room))
    lines: list[RenderableType] = [Text(title, style="bold")] if title else []
    lines.append(
        Text(
            f"rows: {len(rows)} ({_preview(rows)}), two per line · "
            f"columns: {len(cols)} ({_preview(cols)})",
            style="dim",
        )
    )
    if len(shown) < len(cols):
        lines.append(
            Text(
                f"columns 0-{len(shown) - 1} of {len(cols)} shown; choose a layer "
                "with --layer N for the whole map",
                style="dim",
            )
        )
    for layer, heads in enumerate(per_layer):
        titles = [f"h{h}" for h in range(len(heads))] if maps.dim() == 4 else [""]
        panels = [_compact_panel(m, shown, t) for m, t in zip(heads, titles, strict=True)]
        lines += _arrange(panels, [Text(""), Text(f"layer {layer}", style="bold")], width)
    lines.append(legend())
    return Group(*lines)


def _preview(tokens: Sequence[str], limit: int = 6) -> str:
    head = " ".join(tokens[:limit])
    return _clip(head + (" …" if len(tokens) > limit else ""), 40)


def render_selection(
    selection: AttentionSelection, *, width: int = 80, values: bool = False
) -> RenderableType:
    """The right view for a selection: one heatmap, a grid of heads, or the layer overview."""
    s = selection
    title = f"{s.kind} attention · layer {s.layer} · head {s.head}"
    if s.kind != "encoder":
        title += " · row: the token it predicts"
    if "layer" in s.dims:
        return overview(s.weights, s.rows, s.columns, width=width, title=title)
    if "head" in s.dims:
        return head_grid(s.weights, s.rows, s.columns, width=width, title=title)
    return heatmap(s.weights, s.rows, s.columns, width=width, values=values, title=title)


# -- statistics -------------------------------------------------------------------------------


def stats_table(stats: Sequence[HeadStats], kind: str) -> Table:
    """One line per layer and head: entropy, positional shares, peak weight, pattern."""
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
        title=f"{kind} attention heads",
        title_justify="left",
        caption="shares: mean weight a row puts on its own position (diag), the previous one, "
        "the first key and the end-of-sequence key; max: a row's largest weight; entropy in "
        "nats, spread = entropy / log(keys seen), 1 = uniform",
        caption_justify="left",
    )
    for name in ("layer", "head", "entropy", "spread", "diag", "prev", "first", "eos", "max"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("pattern", no_wrap=True)
    layer = None
    for s in stats:
        if layer is not None and s.layer != layer:
            table.add_section()
        layer = s.layer
        shares = (s.diagonal, s.previous, s.first, s.eos, s.max_weight)
        table.add_row(
            str(s.layer),
            str(s.head),
            f"{s.entropy:.2f}",
            f"{s.spread:.2f}",
            *(Text(f"{v:.2f}", style="bold" if v >= 0.5 else "") for v in shares),
            Text(s.pattern, style="cyan" if s.pattern not in ("broad", "mixed") else "dim"),
        )
    return table
