"""The fingerprint of the data a run trains on, so ``--resume`` notices when it changed.

Per split (train and validation: what training reads; the test split is left to ``evaluate``):
the files it was read from (name relative to ``--data`` and size in bytes), the number of pairs
and a SHA-256 of the pairs themselves. Hashing the pairs already in memory costs one pass over
text that was just read (no second read of a large file, and nothing to do for a hub data set,
whose name, config and revision are recorded as given); it covers exactly what the model sees,
and unlike a file's modification time it does not change when the data is copied or touched.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tformer.data.layout import split_files
from tformer.data.sources import TextPair, bundled_data_dir
from tformer.paths import excerpt

FINGERPRINTED = ("train", "validation")
_CHUNK = 10_000  # pairs hashed per update: few Python calls, bounded memory


class PairsDigest:
    """SHA-256 of pairs fed a run at a time, each side length-prefixed so that no two lists
    hash alike; the runs' boundaries do not change the result."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.pairs = 0

    def update(self, sources: Iterable[str], targets: Iterable[str]) -> None:
        pieces = [f"{len(s)},{len(t)}:{s}{t}" for s, t in zip(sources, targets, strict=True)]
        self.digest.update("".join(pieces).encode("utf-8", "surrogatepass"))
        self.pairs += len(pieces)

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


def pairs_sha256(pairs: Sequence[TextPair]) -> str:
    """SHA-256 of the pairs (see :class:`PairsDigest`)."""
    digest = PairsDigest()
    for start in range(0, len(pairs), _CHUNK):
        run = pairs[start : start + _CHUNK]
        digest.update((s for s, _ in run), (t for _, t in run))
    return digest.hexdigest()


def fingerprint(
    spec: str | None,
    texts: Mapping[str, Sequence[TextPair]],
    *,
    source_field: str = "source",
    target_field: str = "target",
) -> dict[str, Any]:
    """The fingerprint of the data ``spec`` as loaded into ``texts`` (see the module)."""
    hashes = {
        split: (len(texts[split]), pairs_sha256(texts[split]))
        for split in FINGERPRINTED
        if split in texts
    }
    return fingerprint_of(spec, hashes, source_field=source_field, target_field=target_field)


def fingerprint_of(
    spec: str | None,
    hashes: Mapping[str, tuple[int, str]],
    *,
    source_field: str = "source",
    target_field: str = "target",
) -> dict[str, Any]:
    """The fingerprint of ``spec`` from each split's (pairs, SHA-256) already computed."""
    root = Path(spec).expanduser() if spec is not None else bundled_data_dir()
    files = split_files(root, source_field, target_field) if spec is None or root.exists() else {}
    splits = {
        split: {
            "files": [_file_entry(path, root) for path in files.get(split, [])],
            "pairs": hashes[split][0],
            "sha256": hashes[split][1],
        }
        for split in FINGERPRINTED
        if split in hashes
    }
    return {"data": spec, "splits": splits}


def _file_entry(path: Path, root: Path) -> dict[str, Any]:
    name = str(path.relative_to(root)) if root.is_dir() else path.name
    try:
        size = path.stat().st_size
    except OSError:
        size = None
    return {"name": name, "size": size}


def changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What differs between two fingerprints, one phrase per split ([] when nothing does)."""
    found = saved.get("splits")
    before: Mapping[str, Any] = found if isinstance(found, dict) else {}
    after = now["splits"]
    out = []
    for split in FINGERPRINTED:
        old, new = before.get(split), after.get(split)
        if old is None and new is None:
            continue
        if old is None or new is None:
            out.append(f"the {split} split was {'added' if old is None else 'removed'}")
        elif not isinstance(old, dict) or old.get("sha256") != new["sha256"]:
            was, is_ = _describe(old), _describe(new)
            how = f"{was} -> {is_}" if was != is_ else f"{is_}, other text of the same size"
            out.append(f"the {split} split ({how})")
    return out


def _describe(entry: object) -> str:
    """``'train.jsonl' 60,123 bytes, 3,000 pairs``, from an entry that may be damaged."""
    if not isinstance(entry, dict):
        return excerpt(entry)
    parts = []
    files = entry.get("files")
    for item in files[:2] if isinstance(files, list) else []:
        if isinstance(item, dict):
            size = item.get("size")
            bytes_ = f" {size:,} bytes" if isinstance(size, int) else ""
            parts.append(f"{excerpt(item.get('name'))}{bytes_}")
    pairs = entry.get("pairs")
    parts.append(f"{pairs:,} pairs" if isinstance(pairs, int) else "pairs unknown")
    return ", ".join(parts)
