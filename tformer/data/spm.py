"""SentencePiece models as tformer tokenizers: plain model files and Marian (OPUS-MT) folders.

The model's own normaliser (its precompiled character map and whitespace rules), pieces and
scores are turned into a Hugging Face ``tokenizers`` model by ``transformers``' SentencePiece
converter, so a text is cut into the pieces ``sentencepiece`` itself would choose. Only the ids
change: tformer's special tokens ``<pad> <bos> <eos> <unk>`` must have ids 0..3, so a foreign
vocabulary enters through :func:`special_first_order`, which puts its special tokens first and
keeps every other piece in its order. A model imported with such a tokenizer has its embedding
rows permuted the same way, so it computes the same function.

``transformers``, ``sentencepiece`` and ``protobuf`` are optional (``pip install
"tformer[import]"``) and imported only by the functions that read a model. (The module is
named ``spm``, as SentencePiece's tools and files are, so as not to shadow the package.)
"""

from __future__ import annotations

import inspect
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex

from tformer.config import SPECIAL_TOKENS, UNK
from tformer.data.tokenizer import Tokenizer
from tformer.errors import CheckpointError, ConfigError
from tformer.source_files import TOKENIZER_BYTES, read_bytes

INSTALL = 'pip install "tformer[import]"'
# The first transformers whose SentencePiece converter builds sentencepiece's pre-tokenizer.
TRANSFORMERS_FOR_SPM = "5.24"
SPM_SUFFIXES = (".spm", ".model")
# Marian's tokenizer files (``MarianTokenizer.save_pretrained``).
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
VOCAB, TARGET_VOCAB, TOKENIZER_CONFIG = "vocab.json", "target_vocab.json", "tokenizer_config.json"

# sentencepiece_model.proto: ModelProto.SentencePiece.Type and TrainerSpec.ModelType.
_NORMAL, _UNKNOWN, _USER_DEFINED = 1, 2, 4
_UNIGRAM, _BPE = 1, 2
_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}
_SPACE = "\u2581"  # sentencepiece's word-boundary marker
_ENDS = Regex(r"\A\s+|\s+\z")  # whitespace at either end of a text
_LANGUAGE_CODE = re.compile(r">>.+<<")  # MarianTokenizer's target-language tokens: >>de<<


def special_first_order(
    size: int, *, pad: int | None, bos: int | None, eos: int | None, unk: int
) -> list[int | None]:
    """The ids of a foreign vocabulary of ``size`` tokens in tformer's id order.

    tformer id ``i`` is foreign id ``order[i]``: ``[pad, bos, eos, unk]`` first (tformer's
    ``<pad> <bos> <eos> <unk>`` = 0..3), then every other foreign id in ascending order. None
    marks a special token the foreign vocabulary lacks: a new row. ``weights[order]`` (new rows
    filled in) lays a foreign embedding out for tformer; ``[order.index(i) for i in ids]`` maps
    foreign ids to tformer's. A vocabulary whose specials are already 0..3 keeps its order.

    Raises:
        ValueError: a special id outside ``0..size-1``, or two specials on one id.
    """
    specials = [pad, bos, eos, unk]
    given = [i for i in specials if i is not None]
    if any(not 0 <= i < size for i in given):
        raise ValueError(f"special ids {specials} must lie in 0..{size - 1}")
    if len(set(given)) != len(given):
        raise ValueError(f"special ids {specials} must be distinct")
    taken = set(given)
    return [*specials, *(i for i in range(size) if i not in taken)]


def is_sentencepiece(path: Path) -> bool:
    """Whether ``path`` names a SentencePiece model rather than a tokenizer JSON: a ``.spm`` /
    ``.model`` file, or (under another name than ``.json``) one that starts as a model does."""
    if path.suffix.lower() in SPM_SUFFIXES:
        return True
    if path.suffix.lower() == ".json" or not path.is_file():
        return False
    try:
        with path.open("rb") as file:
            head = file.read(64)
    except OSError:
        return False
    # A model starts with the tag of ModelProto's first field (pieces), a newline byte; a JSON
    # file may start with a newline too, but then with "{".
    return head[:1] == b"\x0a" and not head.lstrip().startswith(b"{")


def load_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer in ``path``: a tformer tokenizer JSON or a SentencePiece model.

    Raises:
        CheckpointError: the file is missing, unreadable, or neither.
    """
    return spm_tokenizer(path) if is_sentencepiece(path) else Tokenizer.load(path)


def spm_tokenizer(path: Path) -> Tokenizer:
    """A SentencePiece model (from OpenNMT, fairseq, Marian, ``spm_train``) as a tformer tokenizer.

    The pieces are those of ``sentencepiece``'s own ``encode(text, out_type=str)``, unigram and
    BPE models both (with the model's normaliser, ``--byte_fallback`` and user-defined symbols);
    the ids are the model's mapped through :func:`special_first_order`, and literally the model's
    when it was trained with ``--pad_id 0 --bos_id 1 --eos_id 2 --unk_id 3``. A special token the
    model lacks (``--pad_id -1``, sentencepiece's default) becomes a new id. What differs: the
    specials are named ``<pad> <bos> <eos> <unk>`` (``<s>`` is ``<bos>``), and those four names
    in a text are read as the special tokens, as with every tformer tokenizer; a run of unknown
    characters is the piece ``<unk>`` where sentencepiece shows the characters themselves.

    Raises:
        CheckpointError: the file is missing, not a SentencePiece model, or a model of a kind
            other than unigram / BPE.
        ConfigError: the optional packages are not installed.
    """
    _converter()  # the optional packages, before any work
    proto = read_model(path)
    spec = proto.trainer_spec
    order = special_first_order(
        len(proto.pieces),
        pad=_optional_id(spec.pad_id),
        bos=_optional_id(spec.bos_id),
        eos=_optional_id(spec.eos_id),
        unk=spec.unk_id,
    )
    pieces = [piece.piece for piece in proto.pieces]
    names = _tformer_names(order, pieces, str(path))
    inner = _library_tokenizer(proto, _renamed(pieces, order, names))
    data = json.loads(inner.to_str())
    model = data["model"]
    if model["type"] == "Unigram":
        scores = {name: score for name, score in model["vocab"]}
        model["vocab"] = [[name, scores.get(name, 0.0)] for name in names]
        model["unk_id"] = SPECIAL_TOKENS.index(UNK)
    else:
        model["vocab"] = {name: i for i, name in enumerate(names)}
        model["unk_token"] = UNK
    return _finish(tokenizers.Tokenizer.from_str(json.dumps(data)), str(path))


def read_model(path: Path) -> Any:
    """The ``ModelProto`` of a SentencePiece model file.

    Raises:
        CheckpointError: the file is missing, unreadable, not a SentencePiece model, or a
            word / char model (only unigram and BPE are supported).
        ConfigError: the optional packages are not installed.
    """
    model_pb2 = _model_pb2()
    if not os.path.lexists(path):
        raise CheckpointError(f"{path}: SentencePiece model not found")
    blob = read_bytes(path, TOKENIZER_BYTES)
    proto = model_pb2.ModelProto()
    try:
        proto.ParseFromString(blob)
    except Exception as error:  # protobuf's DecodeError, or a RuntimeError from its C++ side
        raise CheckpointError(
            f"{path}: not a SentencePiece model (it does not parse); pass the .model / .spm "
            "file that spm_train wrote, or a tokenizer.json"
        ) from error
    spec = proto.trainer_spec
    kind = _MODEL_TYPES.get(spec.model_type)
    unk = spec.unk_id
    if not proto.pieces or not 0 <= unk < len(proto.pieces):
        raise CheckpointError(
            f"{path}: not a SentencePiece model (no pieces, or no unknown piece); pass the "
            ".model / .spm file that spm_train wrote, or a tokenizer.json"
        )
    if proto.pieces[unk].type != _UNKNOWN:
        raise CheckpointError(
            f"{path}: a damaged SentencePiece model (piece {unk}, its unknown piece, is not "
            "one); pass the .model / .spm file that spm_train wrote"
        )
    if spec.model_type not in (_UNIGRAM, _BPE):
        raise CheckpointError(
            f"{path}: a SentencePiece {kind or 'unknown-type'} model; only unigram and BPE "
            "models are supported"
        )
    return proto


# -- shared ------------------------------------------------------------------------------------


def _optional_id(i: int) -> int | None:
    return None if i < 0 else i


def _tformer_names(order: Sequence[int | None], pieces: Sequence[str], where: str) -> list[str]:
    """The vocabulary in tformer's order: ``pieces`` (indexed by foreign id) with the four
    special tokens renamed to tformer's names.

    Raises:
        CheckpointError: an ordinary piece already has one of those names.
    """
    names = [*SPECIAL_TOKENS, *(pieces[i] for i in order[len(SPECIAL_TOKENS) :] if i is not None)]
    clash = sorted(set(names[len(SPECIAL_TOKENS) :]) & set(SPECIAL_TOKENS))
    if clash:
        raise CheckpointError(
            f"{where}: the piece {clash[0]} is an ordinary piece here, but tformer reserves that "
            f"name for its special token; such a model cannot be used"
        )
    return names


def _renamed(pieces: Sequence[str], order: Sequence[int | None], names: Sequence[str]) -> Any:
    """``pieces`` (foreign order) with the specials given their tformer names."""
    renamed = list(pieces)
    for foreign, name in zip(order, names, strict=False):
        if foreign is not None:
            renamed[foreign] = name
    return renamed


def _library_tokenizer(proto: Any, pieces: Sequence[str]) -> tokenizers.Tokenizer:
    """``transformers``' SentencePiece converter: normaliser, pre-tokeniser, model and decoder
    that encode as sentencepiece does (``pieces``: the model's, in its order, maybe renamed)."""
    vocab: Any
    if proto.trainer_spec.model_type == _BPE:
        vocab = {piece: i for i, piece in enumerate(pieces)}
    else:
        vocab = [(piece, p.score) for piece, p in zip(pieces, proto.pieces, strict=True)]
    return _converter().build_tokenizer_from_spm_proto(proto, vocab, legacy=True)


def _finish(inner: tokenizers.Tokenizer, where: str) -> Tokenizer:
    """The tformer tokenizer of ``inner``: its special tokens registered as such (so decoding
    leaves them out), then through JSON as every loaded tokenizer is."""
    inner.add_special_tokens(
        [AddedToken(name, normalized=False, special=True) for name in SPECIAL_TOKENS]
    )
    return Tokenizer.from_str(inner.to_str(), source=where)


def _model_pb2() -> Any:
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as error:
        raise ConfigError(
            f"reading a SentencePiece model needs the sentencepiece and protobuf packages; "
            f"{INSTALL}"
        ) from error
    return sentencepiece_model_pb2


def _converter() -> Any:
    try:
        import transformers
        from transformers.convert_slow_tokenizer import SpmConverter
    except ImportError as error:
        raise ConfigError(
            f"converting a SentencePiece model needs the transformers package; {INSTALL}"
        ) from error
    # Older converters build no pre-tokenizer: their tokenizers would split text otherwise
    # than sentencepiece does, so they are refused rather than used.
    build = SpmConverter.build_tokenizer_from_spm_proto
    if "legacy" not in inspect.signature(build).parameters:
        raise ConfigError(
            f"converting a SentencePiece model needs transformers {TRANSFORMERS_FOR_SPM} or "
            f"newer (this is {transformers.__version__}); {INSTALL}"
        )
    return SpmConverter


__all__ = [
    "is_sentencepiece",
    "load_tokenizer",
    "read_model",
    "special_first_order",
    "spm_tokenizer",
]
