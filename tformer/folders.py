"""Output folders written whole or not at all, and replaced only when tformer wrote them.

A command that writes a folder of files (``export``, ``prepare``) writes it into a temporary
sibling (``.OUT.<noun>-XXXX``) renamed to ``OUT`` only once every file is there, so ``OUT``
never holds half of one. Its last file is a marker (JSON) naming every file written, the format
and the version. ``--overwrite`` replaces only a folder whose marker says the same command wrote
it and that holds nothing but the files the marker lists: anything a user put there, or a
folder tformer did not write, is refused and left as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tformer.checkpoint.files import fsync_dir
from tformer.checkpoint.lock import writer_lock
from tformer.errors import CheckpointError, ConfigError
from tformer.paths import (
    excerpt,
    file_kind,
    first_line,
    follow_umask_tree,
    json_loads,
    read_small_text,
)


@dataclass(frozen=True)
class MarkedFolder:
    """One kind of output folder: its marker file and the words its messages use."""

    marker: str  # the marker's file name, e.g. "tformer-export.json"
    format: str  # the marker's "format" value
    version: int
    noun: str  # "export": "an earlier export", ".OUT.export-XXXX"
    command: str  # "`tformer export`"
    option: str = "OUT"  # how the command names the folder
    # For a folder that records its writer in a file of its own (an imported checkpoint's
    # config.json) rather than in a marker: the files (relative paths) the command wrote
    # there, or None when it did not write the folder.
    recognise: Callable[[Path], set[str] | None] | None = None
    unmarked: str = ""  # why a folder is not one, where "no valid MARKER" would not say it

    def check_out(self, out: Path) -> None:
        """Refuse an ``out`` that can hold no folder. Checks only: nothing is written.

        Raises:
            ConfigError: ``out`` is a file, link or other non-folder, or sits under a file.
        """
        kind = file_kind(out)  # None for a regular file or nothing at all
        if kind is None and out.is_file():
            kind = "a file"
        if kind is not None and kind != "a folder":
            raise ConfigError(
                f"{self.option} {out}: exists and is {kind}; choose a new folder name for the "
                f"{self.noun}"
            )
        for parent in out.absolute().parents:
            if parent.exists():
                if not parent.is_dir():
                    raise ConfigError(
                        f"{self.option} {out}: {parent} is a file, so no folder can go there"
                    )
                break

    def check_replace(self, out: Path, *, overwrite: bool) -> None:
        """Refuse a non-empty ``out`` unless ``overwrite`` and it is an earlier one."""
        if not out.is_dir() or not any(out.iterdir()):
            return
        if not overwrite:
            raise ConfigError(
                f"{self.option} {out}: exists and is not empty; give --overwrite to replace an "
                f"earlier {self.noun}, or choose another folder"
            )
        self.check_earlier(out)

    def check_earlier(self, out: Path) -> None:
        """Refuse to replace ``out`` unless this command wrote it and everything in it.

        Raises:
            ConfigError: naming ``out`` (no valid marker) or the first entry not written.
        """
        written = self.files_of(out)
        if written is None:
            raise ConfigError(
                f"{self.option} {out}: not written by {self.command} "
                f"({self.unmarked or f'no valid {self.marker}'}); "
                f"{self.command} replaces only an earlier {self.noun}, so choose another "
                "folder (nothing was deleted)"
            )
        foreign = _foreign_entries(out, written)
        if foreign:
            raise ConfigError(
                f"{self.option} {out}: holds {excerpt(foreign[0])}, which the earlier "
                f"{self.noun} did not write; move it away or choose another folder (nothing "
                "was deleted)"
            )

    def read_marker(self, folder: Path, limit: int = 1 << 20) -> dict[str, Any] | None:
        """The marker of ``folder`` when it is a valid one of this kind, else None."""
        text = read_small_text(folder / self.marker, limit=limit)
        try:
            marker = json_loads(text) if text is not None else None
        except json.JSONDecodeError:
            return None
        if not isinstance(marker, dict) or marker.get("format") != self.format:
            return None
        files = marker.get("files")
        if not isinstance(files, list) or not all(relative_name(name) for name in files):
            return None
        return marker

    def files_of(self, folder: Path) -> set[str] | None:
        """The files (relative paths) written into ``folder``, its marker included, or None
        when ``folder`` has no valid marker."""
        if self.recognise is not None:
            return self.recognise(folder)
        marker = self.read_marker(folder, limit=1 << 16)
        return None if marker is None else {*marker["files"], self.marker}

    def marker_text(self, files: list[str], **fields: Any) -> str:
        """The marker: what was written (relative paths) and where it came from."""
        marker = {"format": self.format, "format_version": self.version, **fields}
        marker["files"] = sorted(files)
        return json.dumps(marker, indent=2) + "\n"

    @contextmanager
    def staging(self, out: Path, *, overwrite: bool) -> Iterator[Path]:
        """A temporary sibling of ``out`` to write into; renamed to ``out`` when the block
        ends normally, removed whatever happens otherwise (an error, Ctrl-C), with the
        parent folders it created.

        Two commands writing one ``out`` at once cannot both succeed: a lock beside ``out``
        (``.OUT.lock``) is held from the start of the block to the rename, so the second
        is refused at once; one that starts after the first has finished finds ``out``
        there and is refused without ``overwrite``, which is checked again just before the
        rename.

        Raises:
            ConfigError: another process is writing ``out``, or ``out`` is there now and may
                not be replaced.
            CheckpointError: the folder cannot be created or renamed (read-only, full ...).
        """
        out = out.absolute()
        tmp: Path | None = None
        created = [p for p in (out.parent, *out.parent.parents) if not p.exists()][::-1]
        lock = writer_lock(out, self.option)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire()
            self.check_replace(out, overwrite=overwrite)  # another may have written it by now
            tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.{self.noun}-"))
            yield tmp
            # mkdtemp and the weight writers make private entries; the result is ordinary files
            follow_umask_tree(tmp)
            fsync_tree(tmp)
            self.check_replace(out, overwrite=overwrite)
            self._move_into_place(tmp, out)
            tmp = None
            fsync_dir(out.parent)
        except OSError as error:
            where = f" at {error.filename}" if error.filename else ""
            raise CheckpointError(
                f"{self.option} {out}: cannot be written ({error.strerror or first_line(error)}"
                f"{where}); free some space, fix the permissions or choose another "
                f"{self.option} (nothing was written)"
            ) from error
        finally:
            lock.release()
            if tmp is not None or not out.exists():
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
                for folder in reversed(created):
                    with contextlib.suppress(OSError):  # left alone once anything is in it
                        folder.rmdir()

    def _move_into_place(self, tmp: Path, out: Path) -> None:
        """Rename ``tmp`` to ``out``; an earlier one there is moved aside first and deleted
        only once the new one is in place."""
        if not out.exists() or (out.is_dir() and not any(out.iterdir())):
            os.replace(tmp, out)  # an empty folder is replaced by the rename itself
            return
        self.check_earlier(out)  # again: the folder may have changed in the meantime
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
        os.replace(out, old / out.name)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)


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


def relative_name(name: object) -> bool:
    """Whether ``name`` is a plain relative POSIX path inside a folder (no "..", no root)."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name:
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def written_files(folder: Path) -> list[str]:
    """Every file below ``folder`` as a relative POSIX path (what a marker lists)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def fsync_tree(folder: Path) -> None:
    """Flush every file and folder below ``folder`` (and ``folder``) to disk."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        elif path.is_dir():
            fsync_dir(path)
    fsync_dir(folder)
