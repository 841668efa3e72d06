"""The validation curves of several runs on one figure (``tformer compare-runs --plot``)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tformer.analysis.runs import Comparison
from tformer.errors import ConfigError, DataError
from tformer.paths import check_replaceable, follow_umask, replace_file

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOT_SUFFIXES = (".png", ".svg", ".pdf")
# The panels, in order: the metrics.jsonl key and its axis label. Loss is always drawn; a
# score panel only when some run logged it (--val-bleu).
PANELS = (
    ("val_loss", "validation loss"),
    ("val_bleu", "validation BLEU"),
    ("val_chrf", "validation chrF"),
)


def check_plot_path(path: Path, option: str = "--plot") -> None:
    """Refuse a file type matplotlib is not asked to write, or a path that is not a regular
    file (a folder, a link, a FIFO), before anything is read or written.

    Raises:
        ConfigError: naming ``option``, the path and what to give instead.
    """
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a folder; give a file name such as curves.png")
    check_replaceable(path, option, ConfigError)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise ConfigError(
            f"{option} {path}: unsupported file type; use one of {', '.join(PLOT_SUFFIXES)}"
        )


def plot_curves(comparison: Comparison, path: Path, *, option: str = "--plot") -> Path:
    """Draw every run's validation loss (and BLEU / chrF where logged) against the step into
    ``path``, written atomically (a temporary file in the same folder, then renamed).

    Raises:
        ConfigError: a bad ``path`` (see ``check_plot_path``).
        DataError: no run logged a validation loss, so there is nothing to draw.
    """
    check_plot_path(path, option)
    panels = [(k, label) for k, label in PANELS if any(k in r.curves for r in comparison.runs)]
    if not panels or panels[0][0] != "val_loss":
        raise DataError(
            f"{option} {path}: none of the runs logged a validation loss (no val_loss in their "
            "metrics.jsonl); train with a validation split to draw curves"
        )
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(
        1, len(panels), figsize=(5.0 * len(panels), 3.8), squeeze=False, layout="constrained"
    )
    try:
        for ax, (key, label) in zip(axes[0], panels, strict=True):
            for run in comparison.runs:
                points = run.curves.get(key, [])
                if points:
                    steps, values = zip(*points, strict=True)
                    ax.plot(steps, values, marker="o", markersize=3, label=run.name)
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=8)
        save_figure(fig, path, option)
    finally:
        plt.close(fig)
    return path


def save_figure(fig: Figure, path: Path, option: str) -> None:
    """Write ``fig`` to ``path`` atomically (a temporary file beside it, then renamed)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise ConfigError(
            f"{option} {path}: cannot be written ({error.strerror or error}); "
            "choose a writable place"
        ) from error
    os.close(handle)
    try:
        follow_umask(tmp)  # mkstemp makes it private; a figure is an ordinary file
        fig.savefig(tmp, dpi=120, format=path.suffix.lower()[1:])
        replace_file(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
