"""Attention maps written to files: ``.png`` (matplotlib), ``.html`` (interactive, one file),
``.json`` and ``.npz`` (data, see ``tformer.analysis.attention.save_attention``)."""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from tformer.analysis.attention import AttentionResult, AttentionSelection
from tformer.analysis.attention_files import save_attention
from tformer.cli.options import file_option
from tformer.cli.render_html import write_html
from tformer.errors import ConfigError
from tformer.paths import check_replaceable

SAVE_SUFFIXES = (".png", ".html", ".json", ".npz")
ANNOTATE_CELLS = 400  # print the weights in the cells of a single map up to this size


def check_save_path(path: Path | None) -> None:
    """Refuse an unsupported ``--save`` file type, a folder, a path under a file, or a path
    that is not a regular file (a FIFO would block, a link would write elsewhere), before any
    work is done (missing folders on the way are made)."""
    if path is None:
        return
    check_replaceable(path, "--save", ConfigError)
    if path.suffix.lower() not in SAVE_SUFFIXES:
        raise ConfigError(
            f"--save {path}: unsupported file type; use one of {', '.join(SAVE_SUFFIXES)}"
        )
    file_option(path, "--save")


def save_maps(
    path: Path, result: AttentionResult, selection: AttentionSelection, *, values: bool = False
) -> None:
    """Write the selection to ``path``; the HTML page holds every map, opened at the selection."""
    check_save_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix == ".png":
        save_png(path, selection, values=values)
    elif suffix == ".html":
        write_html(path, result, selection)
    else:
        save_attention(path, selection)


def _panels(selection: AttentionSelection) -> list[tuple[str, Tensor]]:
    """(title, (R, C) map) for each map of the selection, in reading order."""
    w, dims = selection.weights, selection.dims
    if dims == ("row", "column"):
        return [("", w)]
    if dims == ("head", "row", "column"):
        return [(f"head {h}", m) for h, m in enumerate(w)]
    if dims == ("layer", "row", "column"):
        return [(f"layer {i}", m) for i, m in enumerate(w)]
    return [(f"layer {i} head {h}", m) for i, heads in enumerate(w) for h, m in enumerate(heads)]


def save_png(path: Path, selection: AttentionSelection, *, values: bool = False) -> None:
    """A labelled heatmap, or a grid of them (one row per layer when all layers are selected)."""
    # Lazy: matplotlib is an optional extra and slow to import; only --png needs it.
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    panels = _panels(selection)
    rows, cols = selection.rows, selection.columns
    n_heads = selection.weights.shape[1] if selection.dims[:2] == ("layer", "head") else 0
    ncols = n_heads or min(len(panels), 4)
    nrows = (len(panels) + ncols - 1) // ncols
    cell = 0.3
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(
            max(4.0, ncols * (len(cols) * cell + 1.2)),
            max(3.0, nrows * (len(rows) * cell + 1.2)),
        ),
        squeeze=False,
        layout="constrained",  # room for the titles, the colour bar and the labels
    )
    image = None
    for index, ax in enumerate(axes.flat):
        if index >= len(panels):
            ax.axis("off")
            continue
        title, matrix = panels[index]
        image = ax.imshow(matrix.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        # Labels once per grid row / column: every panel has the same tokens.
        bottom = index + ncols >= len(panels)
        ax.set_xticks(range(len(cols)), list(cols) if bottom else [], rotation=90, fontsize=7)
        ax.set_yticks(range(len(rows)), list(rows) if index % ncols == 0 else [], fontsize=7)
        ax.set_title(title, fontsize=8)
        if values and len(panels) == 1 and matrix.numel() <= ANNOTATE_CELLS:
            for (r, c), v in _cells(matrix):
                ax.text(
                    c,
                    r,
                    f"{v:.2f}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="black" if v > 0.55 else "white",
                )
    assert image is not None  # at least one panel
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight")
    fig.suptitle(
        f"{selection.kind} attention, layer {selection.layer}, head {selection.head}\n"
        f"rows: {'source' if selection.kind == 'encoder' else 'the token each predicts'}, "
        f"columns: {'target read' if selection.kind == 'decoder' else 'source'}",
        fontsize=9,
    )
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _cells(matrix: Tensor) -> list[tuple[tuple[int, int], float]]:
    return [
        ((r, c), float(matrix[r, c]))
        for r in range(matrix.shape[0])
        for c in range(matrix.shape[1])
    ]
