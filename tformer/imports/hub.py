"""SOURCE of ``tformer import``: a local ``save_pretrained`` folder, or a Hugging Face hub id
fetched into the hub's own cache by ``huggingface_hub.snapshot_download`` (only the files an
import reads). Offline, a hub id that is not cached is refused in one line saying to pass a
local folder instead.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from tformer.errors import CheckpointError, ConfigError
from tformer.paths import first_line

INSTALL = 'pip install "tformer[import]"'
# What an import reads; the TensorFlow / Flax / pickled PyTorch weights are left on the hub.
FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",  # a large model's weights come in shards
    "model-*-of-*.safetensors",
    "*.spm",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.json",
    "target_vocab.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
]
# One part of a hub id (huggingface_hub's validate_repo_id, in ASCII): 1 to 96 letters,
# digits, "_", "-" or ".", starting and ending with a letter, digit or "_".
_HUB_PART = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")
# What only a path starts with: a hub id has no such form.
_LOCAL_STARTS = ("/", "./", "../", "~", "\\")


def hub_id_problem(source: str) -> str | None:
    """Why ``source`` is no hub id huggingface_hub would fetch (its own rules), or None."""
    parts = source.split("/")
    if len(parts) > 2:
        return "a hub id is owner/name, with one /"
    if not all(_HUB_PART.fullmatch(part) for part in parts):
        return (
            "each part of a hub id is 1 to 96 letters, digits, '-', '_' or '.', starting and "
            "ending with a letter, digit or '_'"
        )
    if "--" in source or ".." in source:
        return "a hub id holds no -- or .."
    if source.endswith(".git"):
        return "a hub id does not end in .git"
    return None


def _kind(path: Path) -> str | None:
    """"a folder", "a file" (or another kind), or None when ``path`` names nothing."""
    try:
        found = os.stat(path)
    except (OSError, ValueError):  # absent, a name too long, a NUL byte ...
        return None
    return "a folder" if stat.S_ISDIR(found.st_mode) else "a file"


def local_folder(source: str) -> Path:
    """SOURCE as a local folder: a folder given, or a hub id fetched (or found in the cache).

    Raises:
        CheckpointError: SOURCE is a file; a path that does not exist (written as a path, or
            in a folder that does); or neither a folder nor a hub id huggingface_hub accepts.
        ConfigError: huggingface_hub is not installed, or the hub cannot be reached.
    """
    path = Path(source).expanduser()
    kind = _kind(path)
    if kind == "a folder":
        try:
            str(path).encode("utf-8")
        except UnicodeEncodeError:  # bytes of another encoding, as Python passes them on
            shown = source.encode("utf-8", "backslashreplace").decode("utf-8")
            raise CheckpointError(
                f"SOURCE {shown}: the name holds bytes that are not UTF-8, and the "
                "safetensors library opens UTF-8 paths only; rename the folder, or give a "
                "link to it with a UTF-8 name"
            ) from None
        return path
    if kind is not None:
        raise CheckpointError(
            f"SOURCE {source}: is not a folder; give a folder written by save_pretrained "
            "or a hub id such as Helsinki-NLP/opus-mt-en-de"
        )
    parent = source.split("/")[0]
    if source.startswith(_LOCAL_STARTS) or ("/" in source and _kind(Path(parent)) is not None):
        raise CheckpointError(f"SOURCE {source}: no such folder")
    problem = hub_id_problem(source)
    if problem is not None:
        raise CheckpointError(f"SOURCE {source}: no such folder, and not a hub id ({problem})")
    return download(source)


def download(repo_id: str) -> Path:
    """``snapshot_download`` of the files an import reads; the hub's cache is reused."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            LocalEntryNotFoundError,
            OfflineModeIsEnabled,
            RepositoryNotFoundError,
        )
    except ImportError as error:
        raise ConfigError(
            f"SOURCE {repo_id}: fetching from the hub needs huggingface_hub; {INSTALL}, or "
            "pass a local folder written by save_pretrained"
        ) from error
    try:
        return Path(snapshot_download(repo_id, allow_patterns=FILES))
    except RepositoryNotFoundError as error:
        raise CheckpointError(
            f"SOURCE {repo_id}: no such model on the Hugging Face hub (or it is private)"
        ) from error
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, OSError) as error:
        raise ConfigError(
            f"SOURCE {repo_id}: cannot fetch it from the Hugging Face hub (offline? "
            f"{first_line(error)[:120]}); save it with save_pretrained where you are online "
            "and pass that local folder"
        ) from error
