"""Attention maps on disk: a selection written and read as JSON or NumPy ``.npz`` (no pickle)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tformer.analysis.attention import FILE_FORMAT, FILE_VERSION, AttentionSelection
from tformer.checkpoint.files import write_text_atomic
from tformer.errors import ConfigError, DataError
from tformer.paths import json_loads


def save_attention(path: Path, selection: AttentionSelection) -> None:
    """Write ``selection`` as ``.json`` (one object) or ``.npz`` (arrays, loadable without pickle).

    Raises:
        ConfigError: another file type.
    """
    suffix = path.suffix.lower()
    meta = selection.metadata()
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".json":
        record = {
            **meta,
            "rows": selection.rows,
            "columns": selection.columns,
            "weights": selection.weights.tolist(),
        }
        write_text_atomic(path, json.dumps(record, ensure_ascii=False) + "\n")
    elif suffix == ".npz":
        with open(path, "wb") as handle:  # a file object: numpy would append .npz to a name
            np.savez(
                handle,
                weights=selection.weights.detach().cpu().numpy().astype(np.float32),
                rows=np.array(selection.rows, dtype=np.str_),
                columns=np.array(selection.columns, dtype=np.str_),
                meta=np.array([json.dumps(meta, ensure_ascii=False)], dtype=np.str_),
            )
    else:
        raise ConfigError(f"--save {path}: {suffix or 'no suffix'} is not .json or .npz")


def load_attention(path: Path) -> AttentionSelection:
    """Read a file written by ``save_attention`` (``.json`` or ``.npz``).

    Raises:
        DataError: a missing, unreadable or foreign file.
    """
    path = Path(path)
    try:
        if path.suffix.lower() == ".npz":
            with np.load(path, allow_pickle=False) as arrays:
                meta = json_loads(str(arrays["meta"][0]))
                _check_format(path, meta)
                rows = [str(t) for t in arrays["rows"]]
                columns = [str(t) for t in arrays["columns"]]
                weights = torch.from_numpy(arrays["weights"].copy())
        else:
            meta = json_loads(path.read_text(encoding="utf-8"))
            _check_format(path, meta)
            rows, columns = list(meta["rows"]), list(meta["columns"])
            weights = torch.tensor(meta["weights"], dtype=torch.float32)
        return AttentionSelection(
            kind=meta["kind"],
            layer=meta["layer"],
            head=meta["head"],
            dims=tuple(meta["dims"]),
            weights=weights.reshape(meta["shape"]),
            rows=rows,
            columns=columns,
            source=meta["source"],
            target=meta["target"],
            generated=meta["target_generated"],
            checkpoint=meta["checkpoint"],
        )
    except (OSError, ValueError, KeyError, IndexError, TypeError, RuntimeError) as error:
        raise DataError(f"{path}: cannot read attention maps ({error})") from error


def _check_format(path: Path, meta: Any) -> None:
    if not isinstance(meta, dict) or (meta.get("format"), meta.get("version")) != (
        FILE_FORMAT,
        FILE_VERSION,
    ):
        raise DataError(f"{path}: not a {FILE_FORMAT} file, version {FILE_VERSION}")
