"""The export's output folder: written whole or not at all (``tformer.folders``), with
``tformer-export.json`` naming every file, the checkpoint's weights hash, the target and the
version; ``--overwrite`` replaces only a clean earlier export.
"""

from __future__ import annotations

from pathlib import Path

from tformer.errors import ConfigError
from tformer.folders import MarkedFolder, written_files
from tformer.paths import inside

MARKER = "tformer-export.json"
EXPORT = MarkedFolder(
    marker=MARKER, format="tformer-export", version=1, noun="export", command="`tformer export`"
)
marker_text = EXPORT.marker_text
staging = EXPORT.staging

__all__ = ["EXPORT", "MARKER", "check_out", "marker_text", "staging", "written_files"]


def check_out(out: Path, *, overwrite: bool, checkpoint: Path) -> None:
    """Refuse an ``out`` the export may not write to. Checks only: nothing is written.

    Raises:
        ConfigError: ``out`` is a file, link or other non-folder, lies inside the checkpoint,
            sits under a file, is a non-empty folder without ``overwrite``, or (with it) is not
            a folder an earlier export wrote, or holds files that export did not write.
    """
    EXPORT.check_out(out)
    if inside(checkpoint, out):
        raise ConfigError(
            f"OUT {out}: lies inside the checkpoint {checkpoint}; choose a folder outside it"
        )
    EXPORT.check_replace(out, overwrite=overwrite)
