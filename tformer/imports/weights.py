"""The weights of a published model: ``model.safetensors`` or the shards an index names,
read one tensor at a time, every name, shape and dtype checked against the headers first
(floating point, finite values only), and vocabulary rows put in tformer's id order."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError, safe_open

from tformer.errors import CheckpointError
from tformer.paths import excerpt, excerpt_list, first_line
from tformer.source_files import TOKENIZER_BYTES, file_size, read_json

WEIGHTS, PICKLED = "model.safetensors", "pytorch_model.bin"
SHARD_INDEX = "model.safetensors.index.json"
SAVED = "a folder written by save_pretrained has it"
FLOATS = ("F16", "BF16", "F32", "F64")
FINITE_BLOCK = 1 << 24  # values checked for NaN / inf at a time (a bool per value, no more)


# -- weights --------------------------------------------------------------------------------


def _plain_name(name: object) -> bool:
    """Whether ``name`` is a file name inside a folder (no path, no way out of it)."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in ("/", "\\", "\x00"))
    )


@contextmanager
def open_weights(folder: Path, prefix: str = "") -> Iterator[Tensors]:
    """The folder's weights, read one tensor at a time: ``model.safetensors``, or the shards
    ``model.safetensors.index.json`` names; their names lose ``prefix``.

    Raises:
        CheckpointError: no safetensors weights (a pickled ``pytorch_model.bin`` is not read),
            a file that is not a regular one, a shard name that leaves the folder, or a file
            safetensors cannot read.
    """
    single, index = folder / WEIGHTS, folder / SHARD_INDEX
    if os.path.lexists(single) or not os.path.lexists(index):
        if not os.path.lexists(single):
            pickled = os.path.lexists(folder / PICKLED)
            why = f"{PICKLED} is a pickle, which" if pickled else "a pickle"
            raise CheckpointError(
                f"{single}: missing; {why} tformer does not load: load the model with "
                "transformers, save it with save_pretrained (safetensors, the default) and "
                "import that folder"
            )
        yield Tensors(_Safetensors({single: None}, prefix), single)
        return
    weight_map = read_json(index, TOKENIZER_BYTES).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: has no weight_map (tensor name -> shard file)")
    shards: dict[Path, set[str]] = {}
    for name, shard in weight_map.items():
        if not _plain_name(shard):
            raise CheckpointError(
                f"{index}: the shard {excerpt(shard)} of {excerpt(name)} is not a file name "
                "inside the folder"
            )
        shards.setdefault(folder / shard, set()).add(name)
    yield Tensors(_Safetensors(shards, prefix, index), index)


class _Safetensors:
    """One or more safetensors files read as one: their headers (names, shapes, dtypes) read
    once, each tensor then from a map of its own, unmapped when the tensor is let go. The pages
    a map has read stay resident while it is open, so reading every tensor through one map kept
    the whole file in memory beside the model being built. (A write to such a tensor goes to a
    private copy, never to the file.)"""

    def __init__(
        self, files: Mapping[Path, set[str] | None], prefix: str, index: Path | None = None
    ) -> None:
        # name (less the prefix) -> shape, dtype, file, name in the file
        self.headers: dict[str, tuple[tuple[int, ...], str, Path, str]] = {}
        for path, names in files.items():
            file_size(path, missing=f"{index.name} names it" if index else SAVED)
            try:
                with safe_open(str(path), framework="pt") as handle:
                    held = set(handle.keys())
                    for name in held if names is None else names & held:
                        part = handle.get_slice(name)  # the header only: no data page is read
                        shape, dtype = tuple(part.get_shape()), part.get_dtype()
                        self.headers[name.removeprefix(prefix)] = (shape, dtype, path, name)
            except (SafetensorError, OSError) as error:
                raise CheckpointError(f"{path}: unreadable ({first_line(error)})") from error
            lacking = sorted((names or set()) - held)
            if lacking:
                raise CheckpointError(
                    f"{path}: has no tensor {excerpt_list(lacking)}, which {SHARD_INDEX} "
                    "places there"
                )

    def keys(self) -> list[str]:
        return list(self.headers)

    def shape(self, key: str) -> tuple[int, ...]:
        return self.headers[key][0]

    def dtype(self, key: str) -> str:
        return self.headers[key][1]

    def where(self, key: str) -> Path:
        return self.headers[key][2]

    def get_tensor(self, key: str) -> torch.Tensor:
        path, name = self.headers[key][2:]
        try:
            with safe_open(str(path), framework="pt") as handle:
                tensor: torch.Tensor = handle.get_tensor(name)  # keeps its map open while alive
        except (SafetensorError, OSError) as error:
            raise CheckpointError(f"{path}: unreadable ({first_line(error)})") from error
        return tensor


class Tensors:
    """A model's tensors, read one at a time (as float32), each checked first: present, of
    the shape config.json makes it, floating point, then finite. ``headers()`` is a view
    that checks the same from the headers alone and hands out shapes on the meta device."""

    def __init__(self, handle: Any, path: Path, *, headers_only: bool = False) -> None:
        self.handle = handle
        self.left = set(handle.keys())
        self.used: set[str] = set()
        self.path = path
        self.headers_only = headers_only

    def headers(self) -> Tensors:
        """The same tensors, checked without reading a value (see :func:`read_state`)."""
        return Tensors(self.handle, self.path, headers_only=True)

    def take(
        self, name: str, shape: tuple[int, ...], *fallbacks: str, infinite: bool = False
    ) -> torch.Tensor:
        """The tensor ``name`` (or the first of ``fallbacks`` present: a tied one saved once);
        ``infinite`` lets -inf / inf through (a logits bias masking tokens), never NaN."""
        key = next((k for k in (name, *fallbacks) if k in self.left), None)
        if key is None:
            raise CheckpointError(
                f"{self.path}: has no tensor {name}; the weights do not match config.json"
            )
        self.used.add(key)
        where = self.handle.where(key)
        found = tuple(self.handle.shape(key))
        if found != shape:
            raise CheckpointError(
                f"{where}: {key} has shape {found} but config.json makes it "
                f"{shape}; the weights do not match their config"
            )
        dtype = self.handle.dtype(key)
        if dtype not in FLOATS:
            raise CheckpointError(
                f"{where}: {key} holds {dtype} values; a model's weights are floating point "
                f"({', '.join(FLOATS)})"
            )
        if self.headers_only:
            return torch.empty(shape, device="meta")
        tensor = self.handle.get_tensor(key).float()
        for block in tensor.reshape(-1).split(FINITE_BLOCK):
            if (block.isnan() if infinite else ~block.isfinite()).any():
                raise CheckpointError(
                    f"{where}: {key} holds NaN or infinite values; a model with them computes "
                    "nothing usable (saved from a training that diverged?)"
                )
        return tensor

    def done(self, unused: Callable[[str], bool]) -> None:
        """Refuse tensors left over: neither read nor ``unused`` (a copy of a tied matrix, a
        buffer some versions save, a table computed from the config)."""
        left = sorted(key for key in self.left - self.used if not unused(key))
        if left:
            raise CheckpointError(
                f"{self.path}: tensors {excerpt_list(left)} have no place in a model of its "
                "config.json (a variant tformer cannot express)"
            )


State = TypeVar("State")


def read_state(
    weights: Tensors, convert: Callable[[Tensors], State], unused: Callable[[str], bool]
) -> State:
    """``convert(weights)``, run first on the headers alone: every name, shape and dtype
    ``convert`` takes is checked, and what it leaves over refused (``unused`` aside), before a
    tensor is read or a model built, so a config.json that disagrees with its weights is
    refused in one line, at once."""
    headers = weights.headers()
    convert(headers)
    headers.done(unused)
    state = convert(weights)
    weights.done(unused)
    return state


# -- vocabularies ---------------------------------------------------------------------------


def rows_in_order(matrix: torch.Tensor, order: list[int | None]) -> torch.Tensor:
    """``matrix``'s rows (a foreign vocabulary's) in tformer's id order; a new row is zeros."""
    out = matrix.new_empty(len(order), *matrix.shape[1:])
    fill_rows_in_order(out, matrix, order)
    return out


def fill_rows_in_order(
    dest: torch.Tensor,
    matrix: torch.Tensor,
    order: list[int | None],
    columns: torch.Tensor | None = None,
    block: int = 4096,
) -> None:
    """``dest`` = ``matrix``'s rows in tformer's id order (new rows zeros), and with
    ``columns`` its columns in that order too; a block of rows at a time, so no temporary of
    the matrix's size is made."""
    if matrix.is_meta:  # a check of the headers: the shapes are all there is
        return
    index = torch.tensor([0 if i is None else i for i in order])
    for start in range(0, len(order), block):
        rows = index[start : start + block]
        part = matrix[rows] if columns is None else matrix[rows[:, None], columns[None, :]]
        dest[start : start + block].copy_(part)
    dest[[row for row, i in enumerate(order) if i is None]] = 0.0


def never_rows(order: list[int | None]) -> list[int]:
    """Rows tformer must never predict: new rows, and repeats of an earlier foreign id (a
    piece a SentencePiece model produces that the vocabulary lacks, standing for <unk>)."""
    seen: set[int] = set()
    rows = []
    for row, i in enumerate(order):
        if i is None or i in seen:
            rows.append(row)
        else:
            seen.add(i)
    return rows
