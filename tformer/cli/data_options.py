"""The options of the commands that read a split of data or check a checkpoint's family:
``--data`` and its columns, ``--split``, ``--limit``, and which data a checkpoint goes with."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer
from rich.markup import escape

from tformer import checkpoint as ckpt
from tformer.checkpoint.trained_on import trained_on
from tformer.checkpoint.training_state import saved_record
from tformer.cli.console import err_console
from tformer.config import FAMILY_RECORDS, TrainConfig, article
from tformer.errors import ConfigError, DataError
from tformer.model.families import FAMILIES

if TYPE_CHECKING:  # importing the tokenizers library is slow: only commands that need it do
    from tformer.data.sources import TextPair
    from tformer.model import TransformerBase

from tformer.cli.options import default, field_help

_TRAIN_DEFAULTS = TrainConfig()
LIMIT = typer.Option(None, "--limit", help="Only the first N pairs.", show_default=False)


def check_limit(limit: int | None) -> None:
    """Refuse a ``--limit`` below 1 before anything is read."""
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit {limit} must be >= 1")


class DataChoice(typing.NamedTuple):
    """The data a command reads a split of, and its columns."""

    data: str | None
    source_field: str
    target_field: str
    text_field: str


def data_of(
    checkpoint: Path,
    data: str | None,
    source_field: str = _TRAIN_DEFAULTS.source_field,
    target_field: str = _TRAIN_DEFAULTS.target_field,
    text_field: str = _TRAIN_DEFAULTS.text_field,
) -> DataChoice:
    """``--data`` as given, or when it is not, the data ``checkpoint`` was trained on (with
    the columns it was read by, where the column options were left at their defaults).

    The bundled data is read only for a checkpoint that was trained on it: a checkpoint
    trained on other data, or an import (which records none), is never scored on the bundled
    set for want of ``--data`` (``tformer.checkpoint.trained_on``).

    Raises:
        DataError: ``--data`` is not given and the checkpoint records no data, or the data
            recorded cannot be found here.
    """
    given = DataChoice(data, source_field, target_field, text_field)
    if data is not None:
        return given
    folder = ckpt.resolve(checkpoint)
    train = trained_on(checkpoint)
    if train.data is None:
        return given  # trained on the bundled data
    path = Path(train.data).expanduser()
    if not path.exists() and _local(train.data, saved_record(folder, "data")):
        raise DataError(
            f"{checkpoint} was trained on --data {train.data}, which is not found here; "
            "give --data with that data (or the data to read)"
        )
    err_console.print(
        f"no --data: reading {escape(str(train.data))}, the data "
        f"{escape(str(checkpoint))} was trained on",
        highlight=False,
        soft_wrap=True,
    )

    def recorded(name: str, value: str) -> str:
        return getattr(train, name) if value == getattr(_TRAIN_DEFAULTS, name) else value

    return DataChoice(
        train.data,
        recorded("source_field", source_field),
        recorded("target_field", target_field),
        recorded("text_field", text_field),
    )


def _local(spec: str, fingerprint: dict[str, Any] | None) -> bool:
    """Whether ``--data spec`` named files (not a hub data set): a path's spelling, or files
    in the fingerprint the training recorded of its data."""
    if spec.startswith((".", "/", "~")) or Path(spec).suffix:
        return True
    splits = (fingerprint or {}).get("splits")
    return isinstance(splits, dict) and any(
        isinstance(split, dict) and split.get("files") for split in splits.values()
    )


def split_pairs(
    data: str | None,
    split: str,
    *,
    source_field: str,
    target_field: str,
    limit: int | None = None,
) -> list[TextPair]:
    """The (first ``limit``) text pairs of ``split`` in ``--data`` (the bundled dates when
    None), or one line naming the splits there are."""
    from tformer.data.prepare import text_splits  # reads data: only commands that need it

    splits = text_splits(data, source_field=source_field, target_field=target_field)
    if split not in splits:
        raise DataError(f"--split {split}: not in the data (splits: {', '.join(splits)})")
    pairs = splits[split]
    return list(pairs[:limit] if limit else pairs)


def language_split(data: str | None, text_field: str, split: str, limit: int | None) -> list[str]:
    """The (first ``limit``) documents of ``split`` in ``--data`` (the bundled text when
    None), or one line naming the splits there are."""
    from tformer.data.lm import load_texts  # reads data: only commands that need it

    splits = load_texts(data, text_field)
    if split not in splits:
        raise DataError(f"--split {split}: not in the data (splits: {', '.join(splits)})")
    return splits[split][:limit] if limit else splits[split]


def split_examples(
    data: str | None,
    split: str,
    *,
    pairs: bool,
    source_field: str,
    target_field: str,
    text_field: str,
    limit: int | None = None,
) -> list[TextPair] | list[str]:
    """The (first ``limit``) examples of ``split`` as the model's family reads them: text
    pairs for a translation model (``pairs``), documents for a language model."""
    if pairs:
        return split_pairs(
            data, split, source_field=source_field, target_field=target_field, limit=limit
        )
    return language_split(data, text_field, split, limit)


Capability = Literal["reads_source", "generates", "continues_prompts", "fills_masks"]


def checkpoint_family(
    checkpoint: Path, command: str, needs: Capability | None = None
) -> type[TransformerBase]:
    """The model class of ``checkpoint``'s family (read from its verified config.json, before
    any weights), refused in one line unless it has what ``command`` ``needs``."""
    config = ckpt.read_verified_config(ckpt.resolve(checkpoint))
    model = config.get("model") or {}
    arch = str(model.get("arch", "encoder-decoder")) if isinstance(model, dict) else ""
    family = FAMILIES.get(arch)
    if family is None or (needs is not None and not getattr(family, needs)):
        allowed = [name for name, cls in FAMILIES.items() if needs is None or getattr(cls, needs)]
        hint = FAMILY_RECORDS[arch].purpose if arch in FAMILY_RECORDS else ""
        raise ConfigError(
            f"tformer {command} works on {' or '.join(allowed)} models; {checkpoint} is "
            f"{article(arch)} {arch} model" + (f" ({hint})" if hint else "")
        )
    return family


SPLIT = typer.Option("test", "--split", help="train, validation or test.")
TEXT_FIELD = typer.Option(
    default(TrainConfig, "text_field"), "--text-field", help=field_help(TrainConfig, "text_field")
)
