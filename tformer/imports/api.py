"""``import_model``: a published model (a folder or a hub id) as an ordinary tformer checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tformer.checkpoint.files import (
    OPTIMIZER,
    TRAINER_STATE,
    written_files,
)
from tformer.checkpoint.store import read_origin, write_checkpoint_files
from tformer.config import TrainConfig
from tformer.errors import CheckpointError, ConfigError
from tformer.folders import MarkedFolder
from tformer.imports.bert import read_bert
from tformer.imports.common import CONFIG, Imported, read_config
from tformer.imports.gpt2 import read_gpt2
from tformer.imports.hub import local_folder
from tformer.imports.marian import read_marian
from tformer.imports.t5 import read_t5
from tformer.paths import excerpt, inside
from tformer.version import __version__


def _earlier_import(folder: Path) -> set[str] | None:
    """The files of an earlier import in ``folder``: a checkpoint whose config.json records
    where its weights came from and no training state; None for anything else (a training
    run's checkpoint above all)."""
    files = written_files(folder)
    if files is None or {OPTIMIZER, TRAINER_STATE} & files:
        return None
    try:
        return files if read_origin(folder) is not None else None
    except CheckpointError:
        return None


# The import's output folder: a checkpoint whose config.json names its origin, so --overwrite
# replaces an earlier import and nothing else.
IMPORT = MarkedFolder(
    marker="config.json",
    format="tformer-import",
    version=1,
    noun="import",
    command="`tformer import`",
    recognise=_earlier_import,
    unmarked="not a checkpoint whose config.json records an import",
)


def check_out(out: Path, *, overwrite: bool) -> None:
    """Refuse an OUT the import may not write. Checks only: nothing is written.

    Raises:
        ConfigError: OUT is not a folder, or is a non-empty folder without ``overwrite``, or
            (with it) is not an earlier import holding only what it wrote.
    """
    IMPORT.check_out(out)
    IMPORT.check_replace(out, overwrite=overwrite)


# config.json's model_type -> the reader of that architecture (one module each).
READERS: dict[str, Callable[..., Imported]] = {
    "marian": read_marian,  # MarianMTModel (OPUS-MT): encoder-decoder
    "gpt2": read_gpt2,  # GPT2LMHeadModel: decoder-only
    "bert": read_bert,  # BertForMaskedLM: encoder-only
    "t5": read_t5,  # T5ForConditionalGeneration (v1.0): encoder-decoder
}
MODELS = (
    "MarianMTModel (marian), GPT2LMHeadModel (gpt2), BertForMaskedLM (bert), "
    "T5ForConditionalGeneration (t5)"
)


def read_model(folder: Path, *, source: str) -> Imported:
    """The model of ``folder`` by its config.json's ``model_type``.

    Raises:
        CheckpointError: config.json is missing, not a regular file or unreadable, the folder
            is a tformer checkpoint, or config.json names a model type tformer does not read.
    """
    model_type = read_config(folder).get("model_type")
    reader = READERS.get(model_type) if isinstance(model_type, str) else None
    if reader is None:
        raise CheckpointError(
            f"{folder / CONFIG}: model_type {excerpt(model_type)} is not supported; tformer "
            f"import reads {MODELS}"
        )
    return reader(folder, source=source)


def import_model(source: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """Import a Hugging Face ``MarianMTModel`` (OPUS-MT), ``T5ForConditionalGeneration``,
    ``GPT2LMHeadModel`` or ``BertForMaskedLM`` as a tformer checkpoint (encoder-decoder,
    decoder-only, encoder-only).

    Args:
        source: a folder written by ``save_pretrained`` (the model and its tokenizer, or a
            tformer export), or a hub id such as ``Helsinki-NLP/opus-mt-en-de``, ``gpt2`` or
            ``bert-base-uncased`` (fetched through ``huggingface_hub``'s cache).
        out: the checkpoint folder to create (absent or empty; with ``overwrite``, an
            earlier import).
        overwrite: replace an earlier import in ``out`` (never anything else: a training
            run's checkpoint, an export or a folder of the user's is refused).

    Returns:
        The checkpoint folder: ``tformer verify``, ``generate``, ``train --init-from`` ...
        take it as any other.

    Raises:
        ConfigError: OUT may not be written (or another process is writing it), a package is
            missing, or the hub is unreachable.
        CheckpointError: another model type, missing tokenizer files, weights that do not
            match their config, or a variant tformer cannot express.
    """
    out = Path(out).expanduser()
    check_out(out, overwrite=overwrite)
    folder = local_folder(str(source))
    if inside(folder, out):
        raise ConfigError(f"OUT {out}: lies inside SOURCE {folder}; choose a folder outside it")
    imported = read_model(folder, source=str(source))
    origin = {**imported.origin, "tformer_version": __version__}

    with IMPORT.staging(out, overwrite=overwrite) as tmp:
        write_checkpoint_files(
            tmp,
            model=imported.model,
            train_config=TrainConfig(),
            tokenizers=imported.tokenizers,
            origin=origin,
        )
    return out
