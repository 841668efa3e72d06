"""Writing a prepared folder's splits: token ids appended a slice at a time into flat arrays
with their offsets and lengths, the kept texts, and what the manifest records of each."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from tformer.data.fingerprint import PairsDigest
from tformer.data.pairs import unfit
from tformer.data.parallel import Pairs, encoded_slices
from tformer.data.prepared import SIDES, Progress, id_dtype
from tformer.data.store import TokenIds
from tformer.data.tokenizer import Tokenizer
from tformer.errors import DataError

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
