"""Reading a data set as a stream (``--streaming``): a slice of pairs at a time, never whole.

A Hugging Face hub data set is read through ``datasets``' streaming mode, which downloads
records as they are iterated instead of the whole data set (and its Arrow conversion) first.
Local files are streamed too, by a reader per format, with the same exact-text rules as
``tformer.data.sources``: JSON Lines parsed line by line, CSV / TSV with the standard library,
Parquet a record batch at a time, paired text files a line at a time. Each split is an
iterator of slices (lists of pairs) that ``tformer.data.prepare`` tokenises as they come.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from itertools import islice, zip_longest
from pathlib import Path
from typing import Any

from tformer.data import parallel
from tformer.data.layout import LOADERS, SPLIT_NAMES, split_files
from tformer.data.sources import TextPair
from tformer.errors import DataError
from tformer.paths import excerpt, excerpt_list, first_line, json_loads

Stream = Iterator[list[TextPair]]


def stream_splits(spec: str, source_field: str, target_field: str) -> dict[str, Stream]:
    """Each split of ``spec`` (a local file or folder, or a hub data set) as a stream of
    slices; nothing is read until a stream is iterated (the hub's split names are)."""
    path = Path(spec).expanduser()
    if path.exists():
        files = split_files(path, source_field, target_field)
        if "train" not in files:
            raise DataError(f"--data {spec}: no train file to stream")
        return {
            split: _sliced(_local_records(found, source_field, target_field))
            for split, found in files.items()
        }
    return _hub_splits(spec, source_field, target_field)


def _sliced(records: Iterable[TextPair]) -> Stream:
    iterator = iter(records)
    while chunk := list(islice(iterator, parallel.SLICE)):
        yield chunk


def _local_records(files: list[Path], source_field: str, target_field: str) -> Iterator[TextPair]:
    try:
        yield from _records_of(files, source_field, target_field)
    except UnicodeDecodeError as error:
        names = " / ".join(str(f) for f in files)
        raise DataError(f"{names}: invalid UTF-8 (byte {error.start} of a block)") from error


def _records_of(files: list[Path], source_field: str, target_field: str) -> Iterator[TextPair]:
    if len(files) == 2:  # paired text files: line i of one with line i of the other
        yield from _paired_lines(*files)
        return
    path = files[0]
    loader = LOADERS.get(path.suffix.lower())
    if loader == "json":
        yield from _json_lines(path, source_field, target_field)
    elif loader == "csv":
        yield from _delimited(path, source_field, target_field)
    elif loader == "parquet":
        yield from _parquet(path, source_field, target_field)
    else:
        raise DataError(f"{path}: cannot be streamed; use .jsonl, .csv, .tsv or .parquet")


def _paired_lines(source: Path, target: Path) -> Iterator[TextPair]:
    with open(source, encoding="utf-8") as src, open(target, encoding="utf-8") as tgt:
        for s, t in zip_longest(src, tgt):
            if s is None or t is None:
                raise DataError(
                    f"{source} and {target} have different numbers of lines; paired files "
                    "must be aligned line by line"
                )
            yield s.rstrip("\n"), t.rstrip("\n")


def _json_lines(path: Path, source_field: str, target_field: str) -> Iterator[TextPair]:
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json_loads(line)
            except json.JSONDecodeError as error:
                raise DataError(
                    f"{path}: line {number}: invalid JSON Lines ({error.msg})"
                ) from error
            yield _pair(record, f"{path}: line {number}", source_field, target_field)


def _delimited(path: Path, source_field: str, target_field: str) -> Iterator[TextPair]:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle, delimiter=delimiter, strict=True)
        try:
            for record in reader:
                yield _pair(record, f"{path}: line {reader.line_num}", source_field, target_field)
        except csv.Error as error:
            raise DataError(f"{path}: line {reader.line_num}: invalid CSV ({error})") from error


def _parquet(path: Path, source_field: str, target_field: str) -> Iterator[TextPair]:
    import pyarrow.parquet as pq  # lazy: comes with datasets, needed only for Parquet

    try:
        handle = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises several types for a file it cannot parse
        raise DataError(f"{path}: cannot be read as Parquet: {first_line(error)}") from error
    row = 0
    for batch in handle.iter_batches(batch_size=parallel.SLICE, columns=None):
        for record in batch.to_pylist():
            row += 1
            yield _pair(record, f"{path}: row {row}", source_field, target_field)


def _hub_splits(name: str, source_field: str, target_field: str) -> dict[str, Stream]:
    import datasets  # lazy: slow to import, and only the hub needs it

    spec, _, revision = name.partition("@")
    repo, _, config = spec.partition(":")
    try:
        loaded = datasets.load_dataset(
            repo, config or None, revision=revision or None, streaming=True
        )
    except Exception as error:  # offline, unknown name, no access: all one line
        raise DataError(
            f"--data {name}: cannot be streamed from the Hugging Face hub ({first_line(error)});"
            " check the name, or the network (offline, use a local copy)"
        ) from error
    streams: dict[str, Stream] = {}
    for split, names in SPLIT_NAMES.items():
        for candidate in names:
            if candidate in loaded:
                where = f"{name}[{candidate}]"
                records = _hub_records(loaded[candidate], where, source_field, target_field)
                streams[split] = _sliced(records)
                break
    if "train" not in streams:
        raise DataError(f"--data {name}: has no train split (splits: {excerpt_list(list(loaded))})")
    return streams


def _hub_records(
    dataset: Iterable[dict[str, Any]], where: str, source_field: str, target_field: str
) -> Iterator[TextPair]:
    try:
        for row, record in enumerate(dataset, start=1):
            yield _pair(record, f"{where}: row {row}", source_field, target_field)
    except DataError:
        raise
    except Exception as error:  # the connection can fail half-way through a stream
        raise DataError(f"{where}: streaming stopped ({first_line(error)})") from error


def _pair(record: object, where: str, source_field: str, target_field: str) -> TextPair:
    """(source, target) of one record: two text fields, or ``translation`` with the two
    languages; anything else is one line naming the record."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected an object with fields, got {type(record).__name__}")
    fields: dict[str, Any] = record
    if source_field not in fields and isinstance(fields.get("translation"), dict):
        fields = fields["translation"]
    values = []
    for option, field in (("--source-field", source_field), ("--target-field", target_field)):
        value = fields.get(field)
        if not isinstance(value, str):
            what = "missing" if value is None else f"not text ({type(value).__name__})"
            raise DataError(
                f"{where}: {excerpt(field)} ({option}) is {what}; fields are "
                f"{excerpt_list(sorted(map(str, fields)))}"
            )
        values.append(value)
    return values[0], values[1]
