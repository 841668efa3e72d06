"""Where text pairs come from: the bundled data, local files (JSON Lines, CSV / TSV, Parquet,
paired plain-text files) or Hugging Face datasets -> {split: [(source, target), ...]}.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tformer.data.columns import TextColumns
from tformer.data.dates import write_splits
from tformer.data.layout import LOADERS, SPLIT_NAMES, paired_text_files, split_files_of
from tformer.errors import DataError
from tformer.paths import excerpt, excerpt_list

SPLITS = ("train", "validation", "test")
TextPair = tuple[str, str]
Pairs = Sequence[TextPair]  # a list, or TextColumns over Arrow arrays


def bundled_data_dir() -> Path:
    """The date-normalisation data set: ``data/`` of a source checkout, else generated once."""
    repo_data = Path(__file__).resolve().parents[2] / "data"  # tformer/data/ -> the checkout
    if (repo_data / "train.jsonl").is_file():
        return repo_data
    # Installed from a wheel: regenerate the same files (the generator is deterministic).
    cache = Path.home() / ".cache" / "tformer" / "dates"
    if not (cache / "train.jsonl").is_file():
        write_splits(cache)
    return cache


def data_name(spec: str | None) -> str:
    """A short name for a data set, used for the default output folder."""
    if spec is None:
        return "dates"
    path = Path(spec)
    name = path.stem if path.is_file() else path.name
    return name.replace("/", "-") or "data"


# -- loading ----------------------------------------------------------------------------------


def load_text_pairs(
    spec: str | None, *, source_field: str = "source", target_field: str = "target"
) -> dict[str, Pairs]:
    """Load every available split as (source, target) text pairs.

    Args:
        spec: None for the bundled data; a folder with ``train.jsonl`` / ``validation.jsonl`` /
            ``test.jsonl`` (or .csv / .tsv / .parquet); one such file (it becomes the train
            split); or a Hugging Face hub data set name.

    Raises:
        DataError: naming the file or data set and what is wrong.
    """
    if spec is None:
        return _load_folder(bundled_data_dir(), source_field, target_field)
    path = Path(spec).expanduser()
    if path.is_dir():
        return _load_folder(path, source_field, target_field)
    if path.is_file():
        return {"train": _load_file(path, source_field, target_field)}
    if path.exists():
        raise DataError(
            f"--data {spec}: not a regular file or folder (a FIFO, device or socket); "
            "give a data file or folder"
        )
    if path.suffix.lower() in LOADERS or spec.startswith((".", "/", "~")):
        raise DataError(f"--data {spec}: no such file or folder")
    return _load_hub(spec, source_field, target_field)


def _load_paired_text(source: Path, target: Path) -> TextColumns:
    """Two line-aligned text files -> pairs, through the HF datasets ``text`` loader, kept as
    its memory-mapped Arrow columns."""
    datasets: Any = _quiet_datasets()
    sides = []
    for path in (source, target):
        _check_utf8(path)
        loaded = datasets.load_dataset("text", data_files=str(path), split="train")
        sides.append(loaded.data.column("text"))
    if len(sides[0]) != len(sides[1]):
        raise DataError(
            f"{source} has {len(sides[0]):,} lines but {target} has {len(sides[1]):,}; "
            "paired files must be aligned line by line"
        )
    return TextColumns(*sides)


def _check_utf8(path: Path, block: int = 1 << 24) -> None:
    """Refuse an empty file or invalid UTF-8 (naming the line), reading a block at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    lines = offset = 0
    with open(path, "rb") as handle:
        while True:
            raw = handle.read(block)
            try:
                decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as error:
                line = lines + raw[: max(error.start, 0)].count(b"\n") + 1
                byte = offset + max(error.start, 0)
                raise DataError(f"{path}: line {line}: invalid UTF-8 (byte {byte})") from error
            if not raw:
                break
            lines += raw.count(b"\n")
            offset += len(raw)
    if offset == 0:
        raise DataError(f"{path}: the file is empty")


def _load_folder(folder: Path, source_field: str, target_field: str) -> dict[str, Pairs]:
    paired = paired_text_files(folder, source_field, target_field)
    if "train" in paired:
        return {split: _load_paired_text(*files) for split, files in paired.items()}
    files = split_files_of(folder)
    if "train" not in files:
        raise DataError(_no_train_file(folder, source_field, target_field))
    return {split: _load_file(path, source_field, target_field) for split, path in files.items()}


def _no_train_file(folder: Path, source_field: str, target_field: str) -> str:
    """Why ``folder`` has no training split: paired text files in other languages than the
    fields name (saying which flags to give), or no train file at all."""
    langs = sorted(
        p.suffix[1:]
        for p in folder.glob("train.*")
        if p.is_file() and p.suffix[1:].isalnum() and p.suffix.lower() not in LOADERS
    )
    if len(langs) >= 2:
        named = ", ".join(f"train.{lang}" for lang in langs[:4])
        src = source_field if source_field in langs else langs[0]
        tgt = next(lang for lang in langs if lang != src)
        return (
            f"--data {folder}: holds paired text files ({named}) but none for --src-lang "
            f"{excerpt(source_field)} / --tgt-lang {excerpt(target_field)}; give the languages, "
            f"e.g. --src-lang {src} --tgt-lang {tgt}"
        )
    return (
        f"--data {folder}: no train file; expected train.jsonl (or .csv, .tsv, .parquet) with "
        "optional validation.* and test.*, or paired text files (train.en + train.de with "
        "--src-lang en --tgt-lang de)"
    )


def _quiet_datasets() -> object:
    """Import HF datasets with its per-file progress bars off: the CLI has its own display."""
    import datasets  # lazy: slow to import, and only file / hub loading needs it

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:  # the hub client logs each failed request itself; our error says it once
        from huggingface_hub.utils import logging as hub_logging

        hub_logging.set_verbosity_error()
    except ImportError:
        pass
    return datasets


def _load_file(path: Path, source_field: str, target_field: str) -> Pairs:
    loader = LOADERS.get(path.suffix.lower())
    if loader is None:
        raise DataError(
            f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .json, .csv, .tsv "
            "or .parquet"
        )
    if path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty")
    if loader == "json":
        return _pairs_from_columns(
            _read_json_lines(path, source_field, target_field),
            str(path),
            source_field,
            target_field,
        )
    if loader == "csv":
        return _read_delimited(path, source_field, target_field)
    datasets: Any = _quiet_datasets()
    try:
        dataset = datasets.load_dataset(loader, data_files=str(path), split="train")
    except Exception as error:  # datasets raises many types; all mean "cannot parse"
        raise DataError(f"{path}: cannot be read as {loader}: {_first_line(error)}") from error
    return _pairs_from_columns(dataset, str(path), source_field, target_field)


def _utf8_text(path: Path) -> str:
    """The file's text; invalid UTF-8 is an error naming the line."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise DataError(f"{path}: cannot be read ({error.strerror or error})") from error
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise DataError(f"{path}: line {line}: invalid UTF-8 (byte {error.start})") from error


def _read_delimited(path: Path, source_field: str, target_field: str) -> list[TextPair]:
    """CSV / TSV with a header line, read with the standard library so every cell stays text
    exactly as written ("NA", "007" and "2025-03-06" are not turned into nulls, numbers or
    dates, as a type-inferring reader would)."""
    kind = "TSV" if path.suffix.lower() == ".tsv" else "CSV"
    text = _utf8_text(path).removeprefix("\ufeff")
    # strict: a quote left open, or text after a closing quote, is an error, not a cell that
    # silently swallows the lines after it.
    reader = csv.DictReader(
        io.StringIO(text, newline=""), delimiter="\t" if kind == "TSV" else ",", strict=True
    )
    limit = csv.field_size_limit()
    csv.field_size_limit(2**31 - 1)  # a very long line is data, not an error
    try:
        columns = list(reader.fieldnames or [])
        if not columns:
            raise DataError(f"{path}: no header line naming the columns")
        for option, field in (("--source-field", source_field), ("--target-field", target_field)):
            if field not in columns:
                raise DataError(
                    f"{path}: no column {excerpt(field)} ({option}); columns are "
                    f"{excerpt_list(columns)}"
                )
        pairs = []
        for number, row in enumerate(reader, start=1):
            _check_cells(path, number, reader.line_num, row, len(columns), kind)
            pairs.append((row[source_field], row[target_field]))
    except csv.Error as error:
        hint = "; a quote is left open" if "unexpected end of data" in str(error) else ""
        raise DataError(
            f"{path}: line {reader.line_num}: invalid {kind} ({error}{hint})"
        ) from error
    finally:
        csv.field_size_limit(limit)
    if not pairs:
        raise DataError(f"{path}: no rows")
    return pairs


def _check_cells(
    path: Path, number: int, line: int, row: dict[Any, Any], columns: int, kind: str
) -> None:
    """Refuse a row with more or fewer cells than the header has columns, naming it."""
    extra = row.get(None)  # csv.DictReader's key for cells past the header's columns
    if extra:
        raise DataError(
            f"{path}: row {number} (line {line}): {columns + len(extra)} cells but the header "
            f"has {columns} columns; quote cells that hold the {kind} delimiter"
        )
    missing = [name for name, value in row.items() if value is None]
    if missing:
        raise DataError(
            f"{path}: row {number} (line {line}): no value for {excerpt(missing[0])} (fewer cells "
            f"than the header's {columns} columns)"
        )


def _read_json_lines(path: Path, source_field: str, target_field: str) -> Any:
    """JSON Lines -> an Arrow table, the two text fields read as strings.

    The generic JSON loader infers types, which turns a target like "2025-03-06" into a
    timestamp; an explicit Arrow schema for the text fields keeps the text exactly. Arrow reads
    the file itself: HF datasets (and the pandas it loads) are not imported for it.
    """
    import pyarrow as pa  # lazy: comes with datasets, needed only for JSON Lines
    import pyarrow.json as paj

    _utf8_text(path)
    schema = pa.schema([(source_field, pa.string()), (target_field, pa.string())])
    options = paj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
    try:
        table = paj.read_json(path, parse_options=options)
    except pa.ArrowInvalid as error:
        message = str(error)
        match = re.search(r"in row (\d+)", message)
        where = f"line {int(match.group(1)) + 1}: " if match else ""
        message = re.sub(r"^JSON parse error: | in row \d+", "", message)
        raise DataError(f"{path}: {where}invalid JSON Lines ({message})") from error
    if table.num_rows == 0:
        raise DataError(f"{path}: no records (only blank lines); expected one JSON object a line")
    for name in dict.fromkeys((source_field, target_field)):  # once each (a text column: one)
        # A field no record has (e.g. "en" in {"translation": {...}} records) is not a column.
        if table.column(name).null_count == table.num_rows:
            table = table.drop_columns([name])
    return table


def _load_hub(name: str, source_field: str, target_field: str) -> dict[str, Pairs]:
    datasets: Any = _quiet_datasets()

    # NAME[:CONFIG][@REVISION], e.g. "wmt16:de-en@main".
    spec, _, revision = name.partition("@")
    repo, _, config = spec.partition(":")
    try:
        loaded = datasets.load_dataset(repo, config or None, revision=revision or None)
    except Exception as error:
        raise DataError(
            f"--data {name}: not a local file or folder, and loading it from the Hugging Face "
            f"hub failed ({_first_line(error)}); check the name, or the network / cache"
        ) from error
    splits: dict[str, Pairs] = {}
    for split, names in SPLIT_NAMES.items():
        for candidate in names:
            if candidate in loaded:
                splits[split] = _pairs_from_columns(
                    loaded[candidate], f"{name}[{candidate}]", source_field, target_field
                )
                break
    if "train" not in splits:
        raise DataError(
            f"--data {name}: has no train split (splits: {excerpt_list(list(loaded))})"
        )
    return splits


def _pairs_from_columns(
    dataset: object, where: str, source_field: str, target_field: str
) -> Sequence[TextPair]:
    """The pairs of a ``datasets.Dataset`` or a pyarrow ``Table`` (JSON Lines)."""
    columns = list(getattr(dataset, "column_names", []))
    # A Dataset keeps its Arrow table in ``data``; a pyarrow Table is one.
    table: Any = getattr(dataset, "data", dataset)
    if "translation" in columns and source_field not in columns:
        records = table.column("translation").to_pylist()
        return _pairs_from_translation(records, where, source_field, target_field)
    for option, field in (("--source-field", source_field), ("--target-field", target_field)):
        if field not in columns:
            raise DataError(
                f"{where}: no column {excerpt(field)} ({option}); columns are "
                f"{excerpt_list(columns)}"
            )
    sources, targets = table.column(source_field), table.column(target_field)
    if len(sources) == 0:
        raise DataError(f"{where}: no rows")
    _check_text_columns(where, (source_field, sources), (target_field, targets))
    return TextColumns(sources, targets)


def _check_text_columns(where: str, *named: tuple[str, Any]) -> None:
    """Both columns text, with no null: else one line naming the first row that is not."""
    import pyarrow as pa  # lazy: comes with datasets
    import pyarrow.compute as pc

    options = ("--source-field", "--target-field")
    for option, (field, column) in zip(options, named, strict=True):
        if column.null_count == len(column):
            raise DataError(f"{where}: no field {field!r} ({option}) in any row")
    nulls = [
        int(pc.index(pc.is_null(column), True).as_py()) if column.null_count else len(column)
        for _, column in named
    ]
    row = min(nulls)
    if row < len(named[0][1]):
        missing = named[0][0] if nulls[0] == row else named[1][0]
        raise DataError(
            f"{where}: row {row + 1}: {missing!r} is null or missing; give it a text value "
            '(an empty text is "")'
        )
    kinds = [column.type for _, column in named]
    if not all(pa.types.is_string(k) or pa.types.is_large_string(k) for k in kinds):
        raise DataError(
            f"{where}: row 1: {named[0][0]!r} and {named[1][0]!r} must be text, "
            f"got {kinds[0]} and {kinds[1]}"
        )


def _pairs_from_translation(
    records: list[Any], where: str, src_lang: str, tgt_lang: str
) -> list[TextPair]:
    """Records shaped ``{"translation": {"en": ..., "de": ...}}`` (the HF translation layout)."""
    pairs = []
    for row, record in enumerate(records, start=1):
        if not isinstance(record, dict) or src_lang not in record or tgt_lang not in record:
            keys = (
                excerpt_list(sorted(map(str, record)))
                if isinstance(record, dict)
                else type(record).__name__
            )
            raise DataError(
                f"{where}: row {row}: 'translation' has no {excerpt(src_lang)} / "
                f"{excerpt(tgt_lang)} (--src-lang / --tgt-lang); it has {keys}"
            )
        pairs.append((str(record[src_lang]), str(record[tgt_lang])))
    if not pairs:
        raise DataError(f"{where}: no rows")
    return pairs


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
