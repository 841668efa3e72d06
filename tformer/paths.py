"""Paths tformer writes and files it names: the guards every write and every message share.

An atomic write renames a temporary file over its target, which would turn a device node, a
FIFO or a symlink into a regular file (``--out /dev/full``, run as root, replaced the device).
So every write first checks that its target is absent or a regular file (``check_replaceable``)
and renames only then (``replace_file``). Messages that quote what a file holds quote at most a
short, escaped excerpt (``excerpt``), so an error never prints a file it was pointed at.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tformer.errors import CheckpointError, ConfigError, TformerError

EXCERPT_CHARS = 60
HASH_CHUNK = 1 << 20  # bytes read at a time when hashing a file
MESSAGE_CHARS = 200  # a quoted error is cut here: it may quote what a file holds

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` (escaped: no newline or control character gets through), cut to
    ``limit`` characters with ``...`` and the full length when longer: how a message quotes
    a value read from a file."""
    shown = repr(value)
    if len(shown) <= limit:
        return shown
    return f"{shown[:limit]}... ({len(shown):,} characters)"


def excerpt_list(items: Sequence[object], shown: int = 3) -> str:
    """The first ``shown`` of ``items`` for a message, each an ``excerpt``, then how many more
    there are: one short line even for a hostile file with thousands of names."""
    text = ", ".join(excerpt(item) for item in items[:shown])
    more = len(items) - shown
    return f"{text} and {more:,} more" if more > 0 else text or "none"


def first_line(error: BaseException) -> str:
    """The first line of an error's message (or its type), to quote it in one-line errors.

    Cut to a couple of hundred characters: an error may quote what a file holds.
    """
    lines = str(error).strip().splitlines()
    line = lines[0] if lines else type(error).__name__
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS] + "..."


def whole_message(error: BaseException, limit: int = 300) -> str:
    """An error's whole message on one line, cut to ``limit`` characters: for errors whose
    first line only announces the rest (torch's "Error(s) in loading state_dict ...")."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    text = text or type(error).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def file_kind(path: Path) -> str | None:
    """What ``path`` is when it exists and is not a regular file ("a FIFO"), else None.

    Symbolic links are not followed: a link is reported as one, whatever it points at.
    """
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None  # absent (or unreachable: the write itself will say why)
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def check_replaceable(
    path: Path, flag: str = "", error: type[TformerError] = CheckpointError
) -> None:
    """Refuse a write target that exists and is not a regular file.

    Raises:
        ``error`` (CheckpointError by default): naming ``path`` (after ``flag``) and what it is.
    """
    kind = file_kind(path)
    if kind is not None:
        where = f"{flag} {path}" if flag else str(path)
        raise error(
            f"{where}: exists and is {kind}, not a regular file; tformer only replaces regular "
            "files, so remove it or write somewhere else"
        )


def check_output_file(path: Path, flag: str, *, overwrite: bool) -> None:
    """An output file named by ``flag``: absent, or (with ``overwrite``) a regular file.

    Raises:
        ConfigError: ``path`` exists and ``overwrite`` is not given, or it is not a regular
            file (a folder, link, FIFO or device is never replaced), naming ``path``.
    """
    check_replaceable(path, flag, ConfigError)
    if path.exists() and not overwrite:
        raise ConfigError(
            f"{flag} {path}: already exists; give --overwrite to replace it or choose another "
            f"{flag}"
        )


def replace_file(tmp: str | Path, path: Path) -> None:
    """``os.replace(tmp, path)`` once ``path`` is known to be absent or a regular file."""
    check_replaceable(path)
    os.replace(tmp, path)


def read_small_text(path: Path, limit: int = 256) -> str | None:
    """The text of a small regular file (at most ``limit`` bytes are read; bytes that are not
    UTF-8 become U+FFFD), or None when ``path`` is not a regular file or cannot be read."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None  # never open a FIFO or a device: reading one may block or never end
        with open(path, "rb") as handle:
            return handle.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return None


def inside(folder: Path, path: Path) -> bool:
    """Whether ``path``, with every symlink resolved, lies inside ``folder`` (resolved too)."""
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop
        return False


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename inside it) to disk, where the platform allows."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # some platforms cannot open folders; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process's umask, read without changing it where the platform says it (Linux).

    Elsewhere it is read by setting it and putting it back at once, the only portable way.
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: str | Path, *, folder: bool = False) -> None:
    """Give ``path`` the mode a plain ``open`` / ``mkdir`` would have given it.

    ``tempfile.mkstemp`` / ``mkdtemp`` (and the safetensors writer) create private (0600 /
    0700) entries; a written file renamed into place must read like every other file.
    """
    os.chmod(path, (0o777 if folder else 0o666) & ~current_umask())


def follow_umask_tree(folder: Path) -> None:
    """``follow_umask`` for ``folder`` and every file and folder below it (links untouched)."""
    mask = current_umask()
    for dirpath, dirnames, filenames in os.walk(folder):
        os.chmod(dirpath, 0o777 & ~mask)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.chmod(path, 0o666 & ~mask)
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]


def json_loads(text: str | bytes) -> Any:
    """``json.loads``, with nesting too deep for the parser reported as malformed JSON (a
    ``json.JSONDecodeError``, as callers already catch) rather than a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", "", 0) from None
