"""Files read from a folder tformer did not write (a published model, a tokenizer): one reader,
so that every such file is checked the same way before a byte of it is read.

Only regular files are read. A symbolic link is followed (the kernel bounds how deep) and what
it reaches is checked: a FIFO would block the read forever, a device such as ``/dev/zero``
never ends, a folder is no file. The size is checked with ``os.stat`` before anything is read,
against a bound per kind of file, and the file is opened without blocking and checked again
through its descriptor, so a file swapped in between is refused too. Every problem is one
line naming the file.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from tformer.errors import CheckpointError
from tformer.paths import excerpt, first_line, json_loads

MIB = 1 << 20
CONFIG_BYTES = 1 * MIB  # config.json, generation_config.json: a few kB in every published model
TOKENIZER_BYTES = 64 * MIB  # tokenizer.json, vocabularies, merges, SentencePiece models
PUBLISHED = "it is not the file a published model has"

_NOT_REGULAR = (
    (stat.S_ISDIR, "a folder, not a file"),
    (stat.S_ISFIFO, "a FIFO (a named pipe), not a regular file; reading one can block forever"),
    (stat.S_ISCHR, "a device, not a regular file; reading one may never end"),
    (stat.S_ISBLK, "a device, not a regular file; reading one may never end"),
    (stat.S_ISSOCK, "a socket, not a regular file"),
)


def _not_regular(path: Path, mode: int) -> str | None:
    """What ``path`` (its link followed) is when not a regular file, as a message's words."""
    if stat.S_ISREG(mode):
        return None
    kind = next((text for test, text in _NOT_REGULAR if test(mode)), "not a regular file")
    if os.path.islink(path):
        kind = f"a link to {excerpt(os.path.realpath(path))}, {kind}"
    return kind


def file_size(
    path: Path, limit: int | None = None, missing: str = "", too_big: str = PUBLISHED
) -> int:
    """The size of ``path``, a regular file (a link to one) of at most ``limit`` bytes.

    Args:
        missing: what the message of an absent file adds (where the file comes from).
        too_big: what the message of a file over ``limit`` adds.

    Raises:
        CheckpointError: naming ``path``: missing (or a link to nothing), a folder, a FIFO, a
            device, over ``limit`` bytes, or not readable.
    """
    try:
        found = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise CheckpointError(
                f"{path}: a link to {excerpt(os.readlink(path))}, which does not exist"
            ) from None
        raise CheckpointError(f"{path}: missing{'; ' + missing if missing else ''}") from None
    except OSError as error:
        why = "a link that loops" if error.errno == errno.ELOOP else error.strerror
        raise CheckpointError(f"{path}: cannot read it ({why or first_line(error)})") from None
    kind = _not_regular(path, found.st_mode)
    if kind is not None:
        raise CheckpointError(f"{path}: is {kind}")
    if limit is not None and found.st_size > limit:
        raise CheckpointError(
            f"{path}: is {found.st_size:,} bytes, over the {limit // MIB} MiB such a file may "
            f"hold; {too_big}"
        )
    return found.st_size


def read_bytes(path: Path, limit: int, missing: str = "", too_big: str = PUBLISHED) -> bytes:
    """The bytes of ``path`` (see :func:`file_size`), at most ``limit`` of them.

    Raises:
        CheckpointError: as :func:`file_size`, naming ``path``.
    """
    file_size(path, limit, missing, too_big)
    try:
        # Without blocking: a FIFO put in its place since the check must not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read it ({error.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        kind = _not_regular(path, os.fstat(fd).st_mode)
        if kind is not None:
            raise CheckpointError(f"{path}: is {kind}")
        try:
            data = handle.read(limit + 1)
        except OSError as error:
            raise CheckpointError(f"{path}: cannot read it ({error.strerror})") from None
    if len(data) > limit:
        raise CheckpointError(f"{path}: grew past {limit // MIB} MiB while it was read")
    return data


def read_json(path: Path, limit: int, missing: str = "") -> dict[str, Any]:
    """The JSON object in ``path`` (see :func:`read_bytes`).

    Raises:
        CheckpointError: as :func:`read_bytes`, or the bytes are not a JSON object.
    """
    return parse_json(path, read_bytes(path, limit, missing))


def text_of(path: Path, data: bytes) -> str:
    """``data``, read from ``path``, as UTF-8 text.

    Raises:
        CheckpointError: naming ``path``, the line and the byte that is not UTF-8.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise CheckpointError(
            f"{path}: line {line}: not UTF-8 text (byte {error.start:,})"
        ) from None


def parse_json(path: Path, data: bytes) -> dict[str, Any]:
    """The JSON object ``data``, read from ``path``.

    Raises:
        CheckpointError: naming ``path``: not UTF-8, not JSON, or not an object.
    """
    try:
        parsed = json_loads(text_of(path, data))
    except ValueError as error:  # json.JSONDecodeError, or int() of too many digits
        raise CheckpointError(f"{path}: not valid JSON ({first_line(error)})") from None
    if not isinstance(parsed, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return parsed


def split_lines(text: str) -> list[str]:
    r"""One item a line, lines ended by "\n" or "\r\n" only.

    ``str.splitlines`` also splits on "\r", "\x0b", "\x0c", "\x1c"-"\x1e", "\x85",
    "\u2028" and "\u2029"; an input holding one of them would become two inputs, and the
    outputs would stop lining up with the input lines.
    """
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def read_lines(path: Path, limit: int, max_lines: int, what: str) -> list[str]:
    """The lines of the UTF-8 text file ``path`` (see :func:`read_bytes`): at least one, at
    most ``max_lines``.

    Args:
        what: what one line of the file is, for the messages ("one hypothesis a line").

    Raises:
        CheckpointError: as :func:`read_bytes`, or the file is not UTF-8, is empty or has more
            than ``max_lines`` lines, naming ``path``.
    """
    data = read_bytes(path, limit, too_big=f"give a text file of {what}")
    # Counted before decoding, so an over-long file is refused without building its lines.
    count = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    if count > max_lines:
        raise CheckpointError(
            f"{path}: has {count:,} lines, over the {max_lines:,} such a file may have"
        )
    lines = split_lines(text_of(path, data))
    if not lines:
        raise CheckpointError(f"{path}: is empty; give a text file of {what}")
    return lines
