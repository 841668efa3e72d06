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

import json
import mmap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tformer.data.fingerprint import FINGERPRINTED
from tformer.data.pairs import EncodedSplit, unfit
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
ID_DTYPES = ("<u2", "<i4")
CHECK_CHUNK = 1 << 22  # offsets compared with lengths this many at a time (bounded memory)
_SPLIT_FILES = tuple(f"{s}.{kind}" for s in SIDES for kind in ("ids", "offsets", "lengths"))
SHARED_TOKENIZER, SOURCE_TOKENIZER, TARGET_TOKENIZER = (
    "tokenizer.json",
    "source_tokenizer.json",
    "target_tokenizer.json",
)
TOKENIZER_NAMES = (SHARED_TOKENIZER, SOURCE_TOKENIZER, TARGET_TOKENIZER)
Progress = Callable[[str, int, int], None]  # (split, pairs done, pairs in the split)


def is_prepared(spec: str | Path | None) -> bool:
    return spec is not None and (Path(spec).expanduser() / MANIFEST).is_file()


def id_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<i4")


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
        """The kept pairs' text of a validation or test split.

        Raises:
            DataError: a line is not a pair of texts, or there are not as many as pairs.
        """
        name = f"{split}.texts.jsonl"
        pairs = []
        with open(self.folder / name, "rb") as handle:
            for number, line in enumerate(handle, start=1):
                pair = _text_pair(line)
                if pair is None:
                    raise DataError(
                        f"--data {self.folder}: {name} line {number} is not a JSON object of a "
                        "source and a target text; prepare the data again"
                    )
                pairs.append(pair)
        expected = self.manifest["splits"][split]["pairs"]
        if len(pairs) != expected:
            raise DataError(
                f"--data {self.folder}: {name} holds {len(pairs):,} pairs, not the {expected:,} "
                f"of {MANIFEST}; prepare the data again"
            )
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


def _text_pair(line: bytes) -> tuple[str, str] | None:
    """(source, target) of a line of ``texts.jsonl``, or None when it is not one."""
    try:
        # As written: a lone surrogate in the corpus is kept (see _json_lines).
        record = json.loads(line.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if not isinstance(record, dict):
        return None
    source, target = record.get("source"), record.get("target")
    return (source, target) if isinstance(source, str) and isinstance(target, str) else None


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
    foreign = sorted(set(hashes) - needed - set(TOKENIZER_NAMES))
    if foreign:  # hashing it could mean reading anything, however large
        raise DataError(
            f"{where}: {MANIFEST} lists {excerpt(foreign[0])}, which is not a file of a prepared "
            "folder; prepare the data again"
        )
    for name, entry in sorted(hashes.items()):
        path = folder / name
        if _through_link(folder, name):
            raise DataError(
                f"{where}: {excerpt(name)} is a link or lies behind one; a prepared folder holds "
                "its own files, so prepare the data again"
            )
        if not path.is_file():
            raise DataError(f"{where}: {excerpt(name)} is missing; prepare the data again")
        if not isinstance(entry, dict) or path.stat().st_size != entry.get("size") or (
            check_hashes and file_sha256(path) != entry.get("sha256")
        ):
            raise DataError(
                f"{where}: {excerpt(name)} changed after it was prepared (its size or SHA-256 "
                f"differs from {MANIFEST}); prepare the data again"
            )
    names = manifest.get("tokenizers")
    named = {names.get("source"), names.get("target")} if isinstance(names, dict) else {None}
    if not named <= set(hashes) or not named <= set(TOKENIZER_NAMES):
        raise DataError(
            f"{where}: {MANIFEST} names no listed tokenizer file; prepare the data again"
        )
    assert isinstance(names, dict)
    _check_fields(where, manifest)
    source = Tokenizer.load(folder / names["source"])
    target = (
        source if names["target"] == names["source"] else Tokenizer.load(folder / names["target"])
    )
    prepared = Prepared(folder, manifest, (source, target))
    check_contents(prepared)
    return prepared


def _through_link(folder: Path, name: str) -> bool:
    """Whether ``folder / name`` is a link, or is reached through a linked folder (which
    could lead out of ``folder``, to a device or a FIFO)."""
    path = folder
    for part in name.split("/"):
        path = path / part
        if path.is_symlink():
            return True
    return False


def _check_fields(where: str, manifest: dict[str, Any]) -> None:
    """Refuse a manifest whose values training reads are not of their kind (a hand-edited or
    forged one): the counts, ``max_len``, the id type and the fingerprint."""
    problem = _field_problem(manifest)
    if problem is not None:
        raise DataError(f"{where}: {MANIFEST}: {problem}; prepare the data again")


def _field_problem(manifest: dict[str, Any]) -> str | None:
    max_len = manifest.get("max_len")
    if not isinstance(max_len, int) or not _count(max_len) or max_len < 2:
        return f"max_len {excerpt(max_len)} is not a whole number of at least 2"
    if manifest.get("dtype") not in ID_DTYPES:
        return f"dtype {excerpt(manifest.get('dtype'))} is not one of {', '.join(ID_DTYPES)}"
    for name, entry in manifest["splits"].items():
        tokens = entry.get("tokens") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(tokens, dict):
            return f"the {name} split's entry is damaged"
        counts = [entry.get(key) for key in ("pairs", "dropped", "dropped_empty")]
        if not all(_count(n) for n in [*counts, *(tokens.get(side) for side in SIDES)]):
            return f"the {name} split's counts are not whole numbers"
    fingerprint = manifest.get("fingerprint")
    splits = fingerprint.get("splits") if isinstance(fingerprint, dict) else None
    if not isinstance(splits, dict) or not all(
        isinstance(entry, dict) and isinstance(entry.get("sha256"), str)
        for entry in splits.values()
    ):
        return "the fingerprint of the text is damaged"
    return None


def _count(value: object) -> bool:
    """A whole number of at least 0 (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_contents(prepared: Prepared) -> None:
    """Check what training relies on in every split, reading each array once: each file's
    size against the counts, offsets that start at 0, end at the number of ids and step by
    each pair's length, lengths from 1 to ``max_len`` (a target's with <eos>), and ids
    inside their tokenizer's vocabulary. Pages read are released afterwards.

    Raises:
        DataError: naming the folder, the file and what is wrong in it.
    """
    where = f"--data {prepared.folder}"
    dtype = np.dtype(prepared.manifest["dtype"])
    for split in prepared.splits:
        entry = prepared.manifest["splits"][split]
        pairs = entry["pairs"]
        for side in SIDES:
            tokens = entry["tokens"][side]
            sizes = {
                "ids": tokens * dtype.itemsize,
                "offsets": (pairs + 1) * 8,
                "lengths": pairs * 4,
            }
            for kind, size in sizes.items():
                found = (prepared.folder / f"{split}.{side}.{kind}").stat().st_size
                if found != size:
                    raise DataError(
                        f"{where}: {split}.{side}.{kind} has {found:,} bytes, not the {size:,} "
                        f"that {pairs:,} pairs of {tokens:,} tokens need; prepare the data again"
                    )
        store = prepared.ids(split)
        try:
            for side, ids, tokenizer in zip(
                SIDES, (store.source, store.target), prepared.tokenizers, strict=True
            ):
                room = prepared.max_len - (1 if side == "target" else 0)  # <eos> after a target
                problem = _array_problem(ids, tokenizer.vocab_size, room)
                if problem is not None:
                    raise DataError(f"{where}: {split}.{side}: {problem}; prepare the data again")
        finally:
            store.release()


def _array_problem(store: TokenIds, vocab: int, room: int) -> str | None:
    """What is wrong with one side's ids, offsets and lengths, or None."""
    offsets, lengths, values = store.offsets, store.lengths(), store.values
    if len(offsets) and (offsets[0] != 0 or offsets[-1] != len(values)):
        return f"its offsets run from {offsets[0]} to {offsets[-1]}, not 0 to {len(values):,}"
    if len(lengths) and (int(lengths.min()) < 1 or int(lengths.max()) > room):
        bad = int(np.flatnonzero((lengths < 1) | (lengths > room))[0])
        return f"pair {bad + 1} has {int(lengths[bad])} tokens, not 1 to {room}"
    for start in range(0, len(lengths), CHECK_CHUNK):
        steps = np.diff(offsets[start : start + CHECK_CHUNK + 1])
        if not np.array_equal(steps, lengths[start : start + CHECK_CHUNK]):
            bad = start + int(np.flatnonzero(steps != lengths[start : start + CHECK_CHUNK])[0])
            return f"pair {bad + 1}'s offsets do not match its length"
    if len(values) and (int(values.min()) < 0 or int(values.max()) >= vocab):
        bad = int(np.flatnonzero((values < 0) | (values >= vocab))[0])
        return f"id {int(values[bad])} (token {bad + 1:,}) is outside the vocabulary of {vocab:,}"
    return None


def prepared_manifest(
    *,
    data: str | None,
    fingerprint: Mapping[str, Any],
    max_len: int,
    tokenizers: tuple[Tokenizer, Tokenizer],
    splits: Mapping[str, Mapping[str, Any]],
    hashes: Mapping[str, Mapping[str, Any]],
    fields: Mapping[str, str],
    tokenizer_request: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest's fields (the marker adds format, version and the list of files);
    ``tokenizer_request``: how the tokenizers were trained (kind, vocab_size, shared, sample),
    None when they were given."""
    return {
        "tokenizer_request": None if tokenizer_request is None else dict(tokenizer_request),
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
