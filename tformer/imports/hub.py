"""SOURCE of ``tformer import``: a local ``save_pretrained`` folder, or a Hugging Face hub id
fetched into the hub's own cache by ``huggingface_hub.snapshot_download`` (only the files an
import reads). Offline, a hub id that is not cached is refused in one line saying to pass a
local folder instead.
"""

from __future__ import annotations

import re
from pathlib import Path

from tformer.errors import CheckpointError, ConfigError
from tformer.paths import first_line

INSTALL = 'pip install "tformer[import]"'
# What an import reads; the TensorFlow / Flax / pickled PyTorch weights are left on the hub.
FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "*.spm",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.json",
    "target_vocab.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
]
# owner/name, or a bare name of the hub's oldest models (gpt2, bert-base-uncased).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def local_folder(source: str) -> Path:
    """SOURCE as a local folder: a folder given, or a hub id fetched (or found in the cache).

    Raises:
        CheckpointError: SOURCE is a file, or a path that does not exist and is no hub id.
        ConfigError: huggingface_hub is not installed, or the hub cannot be reached.
    """
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise CheckpointError(
                f"SOURCE {source}: is not a folder; give a folder written by save_pretrained "
                "or a hub id such as Helsinki-NLP/opus-mt-en-de"
            )
        return path
    if not _HUB_ID.match(source):
        raise CheckpointError(
            f"SOURCE {source}: no such folder, and not a hub id (owner/name, or a name such "
            "as gpt2) either"
        )
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
