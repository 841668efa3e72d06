"""Tokenisation through Hugging Face ``datasets.map``: batched, parallel and cached on disk.

Each text column is tokenised once per (texts, tokenizer) pair and the ids are kept in an Arrow
file named by a hash of both, so a second run over the same data with the same tokenizer
memory-maps the ids instead of tokenising again, and ``num_proc`` worker processes share the
work of a large corpus. The hash covers every text and the tokenizer file byte for byte, so a
changed data set or tokenizer can never be served stale ids.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tformer.data.columns import TextColumn
from tformer.data.store import TokenIds
from tformer.data.tokenizer import Tokenizer

CACHE_ENV = "TFORMER_CACHE"


def default_cache_dir() -> Path:
    """``$TFORMER_CACHE``, else ``$XDG_CACHE_HOME/tformer``, else ``~/.cache/tformer``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tformer"


def texts_key(texts: Sequence[str], tokenizer: Tokenizer) -> str:
    digest = hashlib.sha256(tokenizer.sha256().encode())
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")  # so ["ab", "c"] and ["a", "bc"] differ
    return digest.hexdigest()[:32]


class _Encode:
    """The map function: a class so worker processes get the tokenizer as its JSON text."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.text = tokenizer.to_str()
        self.tokenizer: Tokenizer | None = tokenizer

    def __getstate__(self) -> dict[str, Any]:
        return {"text": self.text}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.text, self.tokenizer = state["text"], None

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        if self.tokenizer is None:
            self.tokenizer = Tokenizer.from_str(self.text)
        return {"ids": self.tokenizer.encode_batch(batch["text"])}


def encode_texts(
    texts: Sequence[str],
    tokenizer: Tokenizer,
    *,
    cache_dir: Path | None = None,
    num_proc: int | None = None,
) -> TokenIds:
    """Token ids of ``texts``; through a ``datasets.map`` cache in ``cache_dir`` when given.

    Returned packed (:class:`TokenIds`): 4 bytes a token, never a list per text.
    """
    if cache_dir is None:
        return tokenizer.encode_packed(texts)
    import datasets  # lazy: slow to import, and only a cached corpus needs it

    key = texts_key(texts, tokenizer)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"ids-{key}.arrow"
    if path.is_file():  # memory-map the ids: no tokenisation, no copy of the texts
        return _packed(datasets.Dataset.from_file(str(path)))
    table = _text_table(datasets, texts)
    # Several processes only pay off for a large corpus: starting each costs a second or so.
    procs = num_proc if num_proc and num_proc > 1 and len(texts) >= 10_000 else None
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # tformer shows its own progress
    try:
        encoded = table.map(
            _Encode(tokenizer),
            batched=True,
            batch_size=1000,
            num_proc=procs,
            remove_columns=["text"],
            cache_file_name=str(path),
            new_fingerprint=key,  # no hashing of the function: the key says it all
        )
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
    return _packed(encoded)


def _text_table(datasets: Any, texts: Sequence[str]) -> Any:
    """A one-column ``datasets`` table of ``texts``: Arrow columns are passed as they are."""
    if isinstance(texts, TextColumn):
        import pyarrow as pa

        return datasets.Dataset(pa.table({"text": texts.array}))
    return datasets.Dataset.from_dict({"text": list(texts)})


def _packed(dataset: Any) -> TokenIds:
    """The ``ids`` column of a ``datasets`` table as :class:`TokenIds`, chunk by chunk
    from Arrow's own buffers (no Python list per row)."""
    import pyarrow.compute as pc

    values, lengths = [], []
    for chunk in dataset.data.column("ids").chunks:
        values.append(chunk.flatten().to_numpy(zero_copy_only=False).astype(np.int32))
        lengths.append(pc.list_value_length(chunk).to_numpy(zero_copy_only=False))
    return TokenIds.concatenate(values, [n.astype(np.int64) for n in lengths])
