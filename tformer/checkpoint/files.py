"""The files of a checkpoint: their names, atomic writes, and the manifest that vouches for them.

Every checkpoint folder ends with ``manifest.json``, the size and SHA-256 of each other file,
written last: a folder with a manifest was written completely, and every file read later is
checked against it, so a truncated or altered file is an error, never garbage weights.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from tformer.errors import CheckpointError
from tformer.paths import (
    check_replaceable,
    excerpt,
    file_sha256,
    first_line,
    follow_umask,
    fsync_dir,
    json_loads,
    replace_file,
)
from tformer.version import __version__

FORMAT = "tformer-checkpoint"
FORMAT_VERSION = 2  # 2: manifest.json with the size and SHA-256 of every file
CONFIG = "config.json"
MANIFEST = "manifest.json"
WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.safetensors"
TRAINER_STATE = "trainer_state.json"
SHARED_TOKENIZER = "tokenizer.json"
SOURCE_TOKENIZER = "source_tokenizer.json"
TARGET_TOKENIZER = "target_tokenizer.json"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def write_failure(where: Path, error: OSError) -> str:
    """The one-line message for a checkpoint write that failed with ``error``."""
    path = error.filename or where
    reason = error.strerror or first_line(error)
    return (
        f"{path}: cannot write the checkpoint ({reason}); free some space, fix the "
        f"permissions or choose another --out (the previous checkpoint in {where} is intact)"
    )


# -- the manifest -----------------------------------------------------------------------------


def write_manifest(folder: Path) -> dict[str, Any]:
    """Record the size and SHA-256 of every file in ``folder`` in its ``manifest.json``."""
    files = {
        path.name: {"size": path.stat().st_size, "sha256": file_sha256(path)}
        for path in sorted(folder.iterdir())
        if path.is_file() and path.name != MANIFEST
    }
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "files": files}
    (folder / MANIFEST).write_text(_manifest_text(manifest), encoding="utf-8")
    return manifest


def _manifest_text(manifest: dict[str, Any]) -> str:
    # One canonical spelling: reading checks the text is exactly this, so that no byte of the
    # manifest can change unnoticed (not even whitespace, which JSON would ignore).
    return json.dumps(manifest, indent=2) + "\n"


def _valid_entry(name: object, entry: object) -> bool:
    return (
        isinstance(name, str)
        and "/" not in name
        and "\\" not in name
        and name not in ("", ".", "..", MANIFEST)
        and isinstance(entry, dict)
        and set(entry) == {"size", "sha256"}
        and type(entry["size"]) is int
        and entry["size"] >= 0
        and isinstance(entry["sha256"], str)
        and _SHA256.match(entry["sha256"]) is not None
    )


def read_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """The manifest's ``{file name: {"size", "sha256"}}``.

    Raises:
        CheckpointError: the manifest is missing, unreadable, malformed or altered.
    """
    path = folder / MANIFEST
    if not path.is_file():
        raise CheckpointError(
            f"{path}: missing, so the checkpoint is partial or was not written by this tformer; "
            "use another checkpoint of the run"
        )
    try:
        text = path.read_text(encoding="utf-8")
        manifest = json_loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: unreadable ({first_line(error)})") from error
    files = manifest.get("files") if isinstance(manifest, dict) else None
    ok = (
        isinstance(manifest, dict)
        and set(manifest) == {"format", "format_version", "files"}
        and manifest["format"] == FORMAT
        and isinstance(files, dict)
        and all(_valid_entry(name, entry) for name, entry in files.items())
    )
    if not ok:
        raise CheckpointError(f"{path}: not a tformer manifest (corrupt or foreign)")
    if manifest["format_version"] != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: format version {excerpt(manifest['format_version'])} is not supported by "
            f"this tformer ({__version__}, format {FORMAT_VERSION})"
        )
    if text != _manifest_text(manifest):
        raise CheckpointError(f"{path}: altered after saving (it is not as tformer wrote it)")
    return cast(dict[str, dict[str, Any]], files)  # checked by ``ok`` above


def manifest_problem(folder: Path, name: str, entry: dict[str, Any], *, hashes: bool) -> str | None:
    """What is wrong with one listed file, or None when its size (and hash) match."""
    path = folder / name
    if not path.is_file():
        return f"{path}: listed in {MANIFEST} but missing"
    size = path.stat().st_size
    if size != entry["size"]:
        how = "truncated or altered" if size < entry["size"] else "altered"
        return f"{path}: {size} bytes but {MANIFEST} records {entry['size']} ({how})"
    if hashes and file_sha256(path) != entry["sha256"]:
        return f"{path}: SHA-256 differs from {MANIFEST} (corrupt or altered after saving)"
    return None


def check_manifest(
    folder: Path, names: Iterable[str] | None = None, *, hashes: bool = True
) -> None:
    """Check files of ``folder`` (default: all listed) against its manifest.

    Raises:
        CheckpointError: naming the first file that is missing, unlisted, truncated or altered.
    """
    files = read_manifest(folder)
    for name in files if names is None else names:
        if name not in files:
            raise CheckpointError(f"{folder / name}: not listed in {folder / MANIFEST}")
        problem = manifest_problem(folder, name, files[name], hashes=hashes)
        if problem:
            raise CheckpointError(problem)


def written_files(folder: Path) -> set[str] | None:
    """The names of the files tformer wrote into checkpoint ``folder`` (those its manifest
    lists, and the manifest), or None when it has no valid manifest (then none is ours)."""
    if os.path.islink(folder) or not folder.is_dir():
        return None
    try:
        return {*read_manifest(folder), MANIFEST}
    except CheckpointError:
        return None


def foreign_files(folder: Path) -> list[Path]:
    """What lies in checkpoint ``folder`` that tformer did not write (every entry when the
    folder has no valid manifest; the path itself when it is not a folder or is a link)."""
    if folder.is_symlink() or not folder.is_dir():
        return [folder]
    ours = written_files(folder) or set()
    return sorted(p for p in folder.iterdir() if p.name not in ours or not _plain_file(p))


def _plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def remove_checkpoint(folder: Path, *, hashes: bool = True) -> bool:
    """Delete the files tformer wrote into checkpoint ``folder``, then the folder if that
    emptied it. A file goes only when its manifest lists it and its size (and, with
    ``hashes``, its SHA-256) still match; anything else (a file a user put there or changed,
    a folder with no valid manifest) stays.

    Returns:
        Whether the folder is gone.
    """
    if os.path.islink(folder) or not folder.is_dir():
        return False  # a link is not a checkpoint tformer wrote, wherever it points
    try:
        files = read_manifest(folder)
    except CheckpointError:
        files = {}
    for name, entry in files.items():
        path = folder / name
        if _plain_file(path) and manifest_problem(folder, name, entry, hashes=hashes) is None:
            path.unlink()
    if files:
        (folder / MANIFEST).unlink()
    try:
        folder.rmdir()
    except OSError:
        return False  # not empty: what is left is not ours
    return True


# -- atomic writes ----------------------------------------------------------------------------


def fsync_files(folder: Path) -> None:
    """Flush every file of ``folder`` and the folder itself to disk."""
    for path in folder.iterdir():
        with open(path, "rb+") as handle:
            os.fsync(handle.fileno())
    fsync_dir(folder)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8 through :func:`write_bytes_atomic`."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename.

    Raises:
        CheckpointError: ``path`` exists and is not a regular file (a symlink, FIFO, device or
            folder, which the rename would replace); nothing is written.
    """
    check_replaceable(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        follow_umask(tmp)  # mkstemp makes it private; these are ordinary files
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        replace_file(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
