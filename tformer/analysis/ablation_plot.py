"""Head importance as heatmaps (one panel per part: layers x heads) and the pruning curve,
drawn into one figure (``tformer ablate --save heads.png``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from tformer.analysis.ablate import Ablation
from tformer.analysis.run_plot import check_plot_path, save_figure
from tformer.model.heads import PARTS

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def plot_ablation(ablation: Ablation, path: Path, *, option: str = "--save") -> Path:
    """Draw ``ablation`` into ``path`` (.png, .svg or .pdf), written atomically."""
    check_plot_path(path, option)
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    grids = [(part, ablation.grid(part)) for part in PARTS]
    grids = [(part, grid) for part, grid in grids if grid]
    panels = len(grids) + (1 if ablation.prune_curve else 0)
    fig, axes = plt.subplots(
        1, panels, figsize=(4.2 * panels, 3.6), squeeze=False, layout="constrained"
    )
    try:
        finite = [v for _, g in grids for row in g for v in row if not math.isnan(v)]
        top = max((abs(v) for v in finite), default=1.0) or 1.0
        image = None
        for ax, (part, grid) in zip(axes[0], grids, strict=False):
            image = ax.imshow(grid, cmap="RdBu_r", vmin=-top, vmax=top, aspect="auto")
            ax.set_title(PARTS[part], fontsize=9)
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_xticks(range(len(grid[0])))
            ax.set_yticks(range(len(grid)))
            for r, row in enumerate(grid):
                for c, value in enumerate(row):
                    dark = abs(value) > 0.6 * top  # white on the deepest colours
                    ax.text(
                        c,
                        r,
                        f"{value:.3g}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if dark else "black",
                    )
        if image is not None:
            label = "BLEU drop when masked" if ablation.metric == "bleu" else "loss increase"
            fig.colorbar(image, ax=axes[0][: len(grids)].tolist(), shrink=0.8, label=label)
        if ablation.prune_curve:
            _plot_curve(axes[0][-1], ablation)
        save_figure(fig, path, option)
    finally:
        plt.close(fig)
    return path


def _plot_curve(ax: Axes, ablation: Ablation) -> None:
    shares = [100 * p.share for p in ablation.prune_curve]
    key = "bleu" if ablation.metric == "bleu" else "loss"
    values = [getattr(p.quality, key) for p in ablation.prune_curve]
    ax.plot(shares, values, marker="o", markersize=3)
    ax.set_xlabel("heads removed (%)")
    ax.set_ylabel("BLEU" if key == "bleu" else "loss (teacher forcing)")
    ax.set_title("greedy pruning", fontsize=9)
    ax.grid(alpha=0.3)
