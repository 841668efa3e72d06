"""The export's output folder: refuse to clobber, write beside it, rename into place.

An export is written into a temporary sibling folder (``.OUT.export-XXXX``) and renamed to
``OUT`` only once every file is there, so ``OUT`` never holds half an export. Its last file is
``tformer-export.json`` (``MARKER``), which names every file the export wrote, the checkpoint's
weights hash, the target and the version. ``--overwrite`` replaces only a folder whose marker
says it is an export and that holds nothing but the files the marker lists: anything a user
put there, or a folder tformer did not write, is refused and left as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tformer.checkpoint.files import fsync_dir
from tformer.errors import CheckpointError, ConfigError
from tformer.paths import excerpt, file_kind, first_line, inside, read_small_text

MARKER = "tformer-export.json"
MARKER_FORMAT = "tformer-export"
MARKER_VERSION = 1


def check_out(out: Path, *, overwrite: bool, checkpoint: Path) -> None:
    """Refuse an ``out`` the export may not write to. Checks only: nothing is written.

    Raises:
        ConfigError: ``out`` is a file, link or other non-folder, lies inside the checkpoint,
            sits under a file, is a non-empty folder without ``overwrite``, or (with it) is not
            a folder an earlier export wrote, or holds files that export did not write.
    """
    kind = file_kind(out)  # None for a regular file or nothing at all
    if kind is None and out.is_file():
        kind = "a file"
    if kind is not None and kind != "a folder":
        raise ConfigError(
            f"OUT {out}: exists and is {kind}; choose a new folder name for the export"
        )
    for parent in out.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"OUT {out}: {parent} is a file, so no folder can go there")
            break
    if inside(checkpoint, out):
        raise ConfigError(
            f"OUT {out}: lies inside the checkpoint {checkpoint}; choose a folder outside it"
        )
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise ConfigError(
            f"OUT {out}: exists and is not empty; give --overwrite to replace an earlier "
            "export, or choose another folder"
        )
    check_earlier_export(out)


def check_earlier_export(out: Path) -> None:
    """Refuse to replace ``out`` unless an earlier export wrote it and everything in it.

    Raises:
        ConfigError: naming ``out`` (no valid marker) or the first entry it did not write.
    """
    written = exported_files(out)
    if written is None:
        raise ConfigError(
            f"OUT {out}: not written by `tformer export` (no valid {MARKER}); --overwrite only "
            "replaces an earlier export, so choose another folder (nothing was deleted)"
        )
    foreign = _foreign_entries(out, written)
    if foreign:
        raise ConfigError(
            f"OUT {out}: holds {excerpt(foreign[0])}, which the earlier export did not write; "
            "move it away or choose another folder (nothing was deleted)"
        )


def _foreign_entries(out: Path, written: set[str]) -> list[str]:
    """Entries below ``out`` (relative paths) that are not the files of ``written`` nor the
    folders holding them; a link is always foreign."""
    folders = {str(Path(name).parent) for name in written} - {"."}
    foreign = []
    for path in sorted(out.rglob("*")):
        name = path.relative_to(out).as_posix()
        if path.is_symlink():
            foreign.append(name)
        elif path.is_dir():
            if name not in folders:
                foreign.append(name)
        elif name not in written:
            foreign.append(name)
    return foreign


def exported_files(folder: Path) -> set[str] | None:
    """The files (relative paths) an earlier export wrote into ``folder``, its marker
    included, or None when ``folder`` has no valid marker."""
    text = read_small_text(folder / MARKER, limit=1 << 16)
    try:
        marker = json.loads(text) if text is not None else None
    except json.JSONDecodeError:
        return None
    if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
        return None
    files = marker.get("files")
    if not isinstance(files, list) or not all(_relative_name(name) for name in files):
        return None
    return {*files, MARKER}


def _relative_name(name: object) -> bool:
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name:
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def written_files(folder: Path) -> list[str]:
    """Every file below ``folder`` as a relative POSIX path (what the marker lists)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def marker_text(files: list[str], **fields: Any) -> str:
    """The marker: what was written (relative paths) and where it came from."""
    marker = {
        "format": MARKER_FORMAT,
        "format_version": MARKER_VERSION,
        **fields,
        "files": sorted(files),
    }
    return json.dumps(marker, indent=2) + "\n"


@contextmanager
def staging(out: Path) -> Iterator[Path]:
    """A temporary sibling of ``out`` to write the export into; renamed to ``out`` when the
    block ends normally, removed whatever happens otherwise (an error, Ctrl-C).

    Raises:
        CheckpointError: the folder cannot be created or renamed (read-only, full ...).
    """
    out = out.absolute()
    tmp: Path | None = None
    # The folders mkdir will create, deepest last: removed again if the export fails.
    created = [p for p in (out.parent, *out.parent.parents) if not p.exists()][::-1]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.export-"))
        tmp.chmod(0o755)  # mkdtemp makes it private; an export is an ordinary folder
        yield tmp
        fsync_tree(tmp)
        _move_into_place(tmp, out)
        tmp = None
        fsync_dir(out.parent)
    except OSError as error:
        where = error.filename or out
        raise CheckpointError(
            f"{where}: cannot write the export ({error.strerror or first_line(error)}); free "
            "some space, fix the permissions or choose another OUT (nothing was written)"
        ) from error
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            for folder in reversed(created):
                with contextlib.suppress(OSError):  # left alone once anything else is in it
                    folder.rmdir()


def fsync_tree(folder: Path) -> None:
    """Flush every file and folder below ``folder`` (and ``folder``) to disk."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        elif path.is_dir():
            fsync_dir(path)
    fsync_dir(folder)


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an earlier export there (checked by ``check_out``) is moved
    aside first and deleted only once the new one is in place."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        os.replace(tmp, out)  # an empty folder is replaced by the rename itself
        return
    check_earlier_export(out)  # again: the folder may have changed while the export ran
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
    os.replace(out, old / out.name)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
