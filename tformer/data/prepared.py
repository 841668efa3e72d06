"""Prepared data: a corpus tokenised once into a folder that training memory-maps.

``tformer prepare --data D --out DIR`` reads the text a slice at a time, tokenises it and
appends each side's ids to flat files, so neither preparing nor training holds the corpus:
training maps the files and reads the pages of the pairs a batch needs. Per split and side:

- ``<split>.<side>.ids``: every kept pair's ids back to back (uint16 when the vocabulary fits
  in 16 bits, else int32), little-endian;
- ``<split>.<side>.offsets``: int64, where each pair starts (one more entry than pairs);
- ``<split>.<side>.lengths``: int32 tokens per pair, so batches are planned from two small
  arrays without touching the offsets;

plus ``<split>.texts.jsonl`` (the kept pairs' text) for the validation and test splits, which
BLEU and the samples read, and the tokenizer(s). Raw files with NumPy memmaps rather than Arrow:
a batch reads two slices of one array per side, which a memmap gives without any per-row
object, and the folder needs no library to read. ``tformer-prepared.json`` lists every file
with its size and SHA-256 (checked before training, so a file changed afterwards is refused),
the counts, ``max_len`` and the fingerprint of the text it came from, which is the one
``train --data`` on the text records: resuming a run across the two forms of the same data
passes the data check.
"""

from __future__ import annotations

import hashlib
import json
import mmap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from tformer.data.fingerprint import FINGERPRINTED, PairsDigest
from tformer.data.pairs import EncodedSplit, unfit
from tformer.data.parallel import Pairs, encoded_slices
from tformer.data.store import PairStore, TokenIds
from tformer.data.tokenizer import Tokenizer
from tformer.errors import DataError
from tformer.folders import MarkedFolder
from tformer.paths import excerpt, file_sha256

MANIFEST = "tformer-prepared.json"
PREPARED = MarkedFolder(
    marker=MANIFEST,
    format="tformer-prepared",
    version=1,
    noun="prepared folder",
    command="`tformer prepare`",
    option="--out",
)
SIDES = ("source", "target")
SPLITS = ("train", "validation", "test")
_SPLIT_FILES = tuple(f"{s}.{kind}" for s in SIDES for kind in ("ids", "offsets", "lengths"))
SHARED_TOKENIZER, SOURCE_TOKENIZER, TARGET_TOKENIZER = (
    "tokenizer.json",
    "source_tokenizer.json",
    "target_tokenizer.json",
)
Progress = Callable[[str, int, int], None]  # (split, pairs done, pairs in the split)


def is_prepared(spec: str | Path | None) -> bool:
    return spec is not None and (Path(spec).expanduser() / MANIFEST).is_file()


# -- writing ----------------------------------------------------------------------------------


class _Appender:
    """One output file written in pieces, hashed on the way."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle: BinaryIO = open(path, "wb")
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self.handle.write(data)
        self.digest.update(data)
        self.size += len(data)

    def close(self) -> dict[str, Any]:
        self.handle.close()
        return {"size": self.size, "sha256": self.digest.hexdigest()}


def id_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<i4")


@dataclass(frozen=True)
class PrepareOptions:
    max_len: int
    strict: bool = False
    where: str = "--data"  # names the data in errors
    progress: Progress | None = None
    num_proc: int | None = None  # worker processes that tokenise slices side by side


def write_split(
    folder: Path,
    name: str,
    texts: Pairs,
    tokenizers: tuple[Tokenizer, Tokenizer],
    options: PrepareOptions,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Tokenise one split into ``folder``: (its manifest entry, its files' sizes and hashes)."""
    dtype = id_dtype(max(t.vocab_size for t in tokenizers))
    files = {
        f"{s}.{kind}": _Appender(folder / f"{name}.{s}.{kind}")
        for s in SIDES
        for kind in ("ids", "offsets", "lengths")
    }
    texts_file = _Appender(folder / f"{name}.texts.jsonl") if name != "train" else None
    for s in SIDES:
        files[f"{s}.offsets"].write(np.zeros(1, "<i8").tobytes())
    ends = dict.fromkeys(SIDES, 0)
    digest, kept, dropped, empty = PairsDigest(), 0, 0, 0
    total = len(texts) if isinstance(texts, Sequence) else 0  # 0: a stream, length unknown
    if options.progress is not None:
        options.progress(name, 0, total)
    try:
        for start, sides, ids in encoded_slices(texts, tokenizers, options.num_proc):
            digest.update(*sides)
            keep, is_empty = _fits(ids, options, start)
            dropped += int((~keep).sum())
            empty += int(is_empty.sum())
            rows = np.flatnonzero(keep)
            kept += len(rows)
            for s, packed in zip(SIDES, ids, strict=True):
                chosen = packed.select(rows)
                files[f"{s}.ids"].write(chosen.values.astype(dtype).tobytes())
                files[f"{s}.offsets"].write((chosen.offsets[1:] + ends[s]).astype("<i8").tobytes())
                files[f"{s}.lengths"].write(chosen.lengths().astype("<i4").tobytes())
                ends[s] += int(chosen.offsets[-1])
            if texts_file is not None:
                texts_file.write(_json_lines(sides, rows))
            if options.progress is not None:
                options.progress(name, start + len(sides[0]), total)
    finally:
        written = {f"{name}.{key}": f.close() for key, f in files.items()}
        if texts_file is not None:
            written[f"{name}.texts.jsonl"] = texts_file.close()
    entry = {
        "pairs": kept,
        "dropped": dropped,
        "dropped_empty": empty,
        "tokens": ends,
        "text_pairs": digest.pairs,
        "text_sha256": digest.hexdigest(),
    }
    return entry, written


def _json_lines(sides: list[list[str]], rows: np.ndarray) -> bytes:
    lines = "".join(
        json.dumps({"source": sides[0][i], "target": sides[1][i]}, ensure_ascii=False) + "\n"
        for i in rows.tolist()
    )
    return lines.encode("utf-8", "surrogatepass")


def _fits(
    ids: list[TokenIds], options: PrepareOptions, start: int
) -> tuple[np.ndarray, np.ndarray]:
    """Which pairs of a slice fit ``max_len`` with no empty side, and which have one."""
    src_len, tgt_len = ids[0].lengths(), ids[1].lengths()
    empty = (src_len == 0) | (tgt_len == 0)
    fits = ~empty & (src_len <= options.max_len) & (tgt_len + 1 <= options.max_len)
    if options.strict and not fits.all():
        row = int(np.argmin(fits))
        problem = unfit(int(src_len[row]), int(tgt_len[row]), options.max_len)
        raise DataError(
            f"{options.where}: pair {start + row + 1}: {problem} (--strict); fix the pair, "
            "raise --max-len or drop --strict to skip and count such pairs"
        )
    return fits, empty


def tokenizer_files(tokenizers: tuple[Tokenizer, Tokenizer]) -> dict[str, str]:
    if tokenizers[0] is tokenizers[1]:
        return {"source": SHARED_TOKENIZER, "target": SHARED_TOKENIZER}
    return {"source": SOURCE_TOKENIZER, "target": TARGET_TOKENIZER}


# -- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """A prepared folder, checked: its tokenizers, manifest and split names."""

    folder: Path
    manifest: dict[str, Any]
    tokenizers: tuple[Tokenizer, Tokenizer]

    @property
    def max_len(self) -> int:
        return int(self.manifest["max_len"])

    @property
    def splits(self) -> list[str]:
        return list(self.manifest["splits"])

    def fingerprint(self) -> dict[str, Any]:
        """The fingerprint of the text it was prepared from (``tformer.data.fingerprint``)."""
        return dict(self.manifest["fingerprint"])

    def texts(self, split: str) -> list[tuple[str, str]]:
        """The kept pairs' text of a validation or test split."""
        path = self.folder / f"{split}.texts.jsonl"
        pairs = []
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                pairs.append((record["source"], record["target"]))
        return pairs

    def ids(self, split: str) -> PairStore:
        """A split's ids, memory-mapped."""
        dtype = np.dtype(self.manifest["dtype"])
        sides = []
        for s in SIDES:
            stem = f"{split}.{s}"
            maps = [
                _map(self.folder / f"{stem}.{kind}", kind_dtype)
                for kind, kind_dtype in (("ids", dtype), ("offsets", np.dtype("<i8")),
                                         ("lengths", np.dtype("<i4")))
            ]  # fmt: skip
            (values, ids_map), (offsets, offsets_map), (lengths, _) = maps
            held = tuple(m for m in (ids_map, offsets_map) if m is not None)
            sides.append(TokenIds(values, offsets, lengths, maps=held))
        return PairStore(*sides)

    def split(self, name: str, max_len: int, *, strict: bool) -> EncodedSplit:
        """An encoded split; pairs over a ``max_len`` smaller than the folder's are dropped
        (refused with ``strict``)."""
        entry = self.manifest["splits"][name]
        store = self.ids(name)
        texts = self.texts(name) if name != "train" else []
        dropped, empty = int(entry["dropped"]), int(entry["dropped_empty"])
        if max_len < self.max_len:
            src, tgt = store.lengths()
            fits = (src <= max_len) & (tgt + 1 <= max_len)
            if strict and not fits.all():
                row = int(np.argmin(fits))
                raise DataError(
                    f"--data {self.folder} ({name} split): kept pair {row + 1}: "
                    f"{unfit(int(src[row]), int(tgt[row]), max_len)} (--strict); prepare with "
                    "--max-len set as for training, or drop --strict"
                )
            kept = np.flatnonzero(fits)
            dropped += len(src) - len(kept)
            store = store.select(kept)
            texts = [texts[i] for i in kept.tolist()] if texts else texts
        return EncodedSplit(store, texts, dropped, empty)


def _map(path: Path, dtype: np.dtype) -> tuple[np.ndarray, mmap.mmap | None]:
    """The file as a read-only array over a memory map (and the map, to release its pages)."""
    if path.stat().st_size == 0:
        return np.zeros(0, dtype), None
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mapped, dtype=dtype), mapped


def open_prepared(spec: str | Path, *, check_hashes: bool = True) -> Prepared:
    """Read and check a prepared folder: every file listed, of its size and SHA-256.

    Raises:
        DataError: naming the folder and the first file that is missing, changed or foreign.
    """
    folder = Path(spec).expanduser()
    where = f"--data {folder}"
    manifest = PREPARED.read_marker(folder)
    if manifest is None or manifest.get("format_version") != PREPARED.version:
        raise DataError(
            f"{where}: {MANIFEST} is damaged or of another version; prepare the data again "
            "with `tformer prepare`"
        )
    hashes = manifest.get("hashes")
    splits = manifest.get("splits")
    needed = {
        f"{split}.{name}"
        for split in (splits if isinstance(splits, dict) else {})
        for name in (*_SPLIT_FILES, *(("texts.jsonl",) if split != "train" else ()))
    }
    if (
        not isinstance(hashes, dict)
        or set(hashes) != set(manifest["files"])
        or not isinstance(splits, dict)
        or "train" not in splits
        or not set(splits) <= set(SPLITS)
        or not needed <= set(hashes)
    ):
        raise DataError(
            f"{where}: {MANIFEST} does not list the files of every split with their hashes; "
            "prepare the data again with `tformer prepare`"
        )
    for name, entry in sorted(hashes.items()):
        path = folder / name
        if not path.is_file() or path.is_symlink():
            raise DataError(f"{where}: {excerpt(name)} is missing; prepare the data again")
        if path.stat().st_size != entry.get("size") or (
            check_hashes and file_sha256(path) != entry.get("sha256")
        ):
            raise DataError(
                f"{where}: {excerpt(name)} changed after it was prepared (its size or SHA-256 "
                f"differs from {MANIFEST}); prepare the data again"
            )
    names = manifest.get("tokenizers")
    listed = isinstance(names, dict) and {names.get("source"), names.get("target")} <= set(hashes)
    if not listed:
        raise DataError(
            f"{where}: {MANIFEST} names no listed tokenizer file; prepare the data again"
        )
    assert isinstance(names, dict)
    source = Tokenizer.load(folder / names["source"])
    target = (
        source if names["target"] == names["source"] else Tokenizer.load(folder / names["target"])
    )
    return Prepared(folder, manifest, (source, target))


def prepared_manifest(
    *,
    data: str | None,
    fingerprint: Mapping[str, Any],
    max_len: int,
    tokenizers: tuple[Tokenizer, Tokenizer],
    splits: Mapping[str, Mapping[str, Any]],
    hashes: Mapping[str, Mapping[str, Any]],
    fields: Mapping[str, str],
) -> dict[str, Any]:
    """The manifest's fields (the marker adds format, version and the list of files)."""
    return {
        "data": data,
        "fields": dict(fields),
        "max_len": max_len,
        "dtype": id_dtype(max(t.vocab_size for t in tokenizers)).str,
        "tokenizers": tokenizer_files(tokenizers),
        "tokenizer_sha256": {s: t.sha256() for s, t in zip(SIDES, tokenizers, strict=True)},
        "splits": dict(splits),
        "fingerprint": dict(fingerprint),
        "hashes": dict(hashes),
    }


__all__ = ["FINGERPRINTED", "MANIFEST", "PREPARED", "Prepared", "is_prepared", "open_prepared"]
