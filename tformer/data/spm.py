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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

from tformer.config import SPECIAL_TOKENS, UNK
from tformer.data.hf_tokenizers import check_ids, own_names
from tformer.data.tokenizer import Tokenizer
from tformer.errors import CheckpointError, ConfigError
from tformer.source_files import TOKENIZER_BYTES, read_bytes, read_json

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


# -- Marian ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MarianTokenizers:
    """A Marian folder's tokenizers and the id orders that map its vocabularies onto them.

    ``source_order[i]`` is the Marian id of the source tokenizer's id ``i`` (None: a new row,
    tformer's ``<pad>``), likewise ``target_order``; with a joint vocabulary (``joint``) they
    are one list and the two tokenizers have the same vocabulary (each cuts text with its own
    side's SentencePiece model). An id may appear twice: a piece that a side's SentencePiece
    model produces but the vocabulary lacks is a row of its own after the vocabulary, standing
    for Marian's ``<unk>`` (``MarianTokenizer`` maps it to ``<unk>``), so its order entry is the
    ``<unk>`` id (:func:`unk_stand_ins` lists them); give such a target row a -inf logit bias
    to keep the model's function.
    """

    source: Tokenizer
    target: Tokenizer
    source_order: list[int | None]
    target_order: list[int | None]
    joint: bool


def marian_tokenizers(
    folder: Path, *, pad_id: int, eos_id: int, decoder_start_id: int
) -> MarianTokenizers:
    """The tokenizers of a ``MarianTokenizer.save_pretrained`` folder (source.spm, target.spm,
    vocab.json [+ target_vocab.json with ``separate_vocabs``], tokenizer_config.json).

    ``pad_id``, ``eos_id`` and ``decoder_start_id`` are the model config's ``pad_token_id``,
    ``eos_token_id`` and ``decoder_start_token_id`` (target vocabulary ids). tformer's ``<bos>``
    is the decoder start, ``<eos>`` Marian's ``</s>``, ``<unk>`` its ``<unk>``; Marian's
    ``<pad>`` is its decoder start too (OPUS-MT), so tformer's ``<pad>`` is a new row, unless
    the two differ. A separate source vocabulary maps the same way with its own ``<pad>`` and
    ``</s>`` ids. Ids equal ``MarianTokenizer``'s mapped through the orders, without the
    ``</s>`` it appends to every text (tformer's data pipeline adds its own specials), for
    ``>>xx<<`` language tokens at the start of a text too (which tformer recognises anywhere).

    Raises:
        CheckpointError: a file is missing or unreadable, or the vocabulary lacks a special
            token or disagrees with the ids given.
        ConfigError: the optional packages are not installed.
    """
    _converter()  # the optional packages, before any work
    settings = _read_json(folder / TOKENIZER_CONFIG)
    names = {
        key: _token_name(settings.get(f"{key}_token"), default)
        for key, default in (("eos", "</s>"), ("unk", "<unk>"), ("pad", "<pad>"))
    }
    joint = not settings.get("separate_vocabs", False)
    source_vocab = _read_vocab(folder / VOCAB)
    target_vocab = source_vocab if joint else _read_vocab(folder / TARGET_VOCAB)
    source_proto = read_model(folder / SOURCE_SPM)
    target_proto = read_model(folder / TARGET_SPM)
    for where, proto in ((SOURCE_SPM, source_proto), (TARGET_SPM, target_proto)):
        if proto.trainer_spec.model_type != _UNIGRAM or proto.trainer_spec.byte_fallback:
            raise CheckpointError(
                f"{folder / where}: only unigram SentencePiece models without byte fallback "
                "are supported in a Marian folder (as OPUS-MT models have)"
            )
    target_ids = _special_ids(folder / (VOCAB if joint else TARGET_VOCAB), target_vocab, names)
    for name, given, option in (("eos", eos_id, "eos_token_id"), ("pad", pad_id, "pad_token_id")):
        if target_ids[name] != given:
            raise CheckpointError(
                f"{folder}: {names[name]} has id {target_ids[name]} in the vocabulary but the "
                f"model's {option} is {given}"
            )
    if not 0 <= decoder_start_id < len(target_vocab):
        raise CheckpointError(
            f"{folder}: decoder_start_token_id {decoder_start_id} lies outside the "
            f"vocabulary of {len(target_vocab)} tokens"
        )
    target_side = _MarianSide(target_proto, target_vocab, target_ids, decoder_start_id)
    if joint:
        source_side = _MarianSide(source_proto, source_vocab, target_ids, decoder_start_id)
        extra = _missing_pieces([source_side, target_side])
        order = source_side.order(extra)
        source = source_side.tokenizer(order, extra, str(folder / SOURCE_SPM))
        target = target_side.tokenizer(order, extra, str(folder / TARGET_SPM))
        return MarianTokenizers(source, target, order, order, joint=True)
    source_ids = _special_ids(folder / VOCAB, source_vocab, names)
    source_side = _MarianSide(source_proto, source_vocab, source_ids, source_ids["pad"])
    source_extra = _missing_pieces([source_side])
    target_extra = _missing_pieces([target_side])
    source_order = source_side.order(source_extra)
    target_order = target_side.order(target_extra)
    return MarianTokenizers(
        source_side.tokenizer(source_order, source_extra, str(folder / SOURCE_SPM)),
        target_side.tokenizer(target_order, target_extra, str(folder / TARGET_SPM)),
        source_order,
        target_order,
        joint=False,
    )


def unk_stand_ins(order: Sequence[int | None]) -> list[int]:
    """The ids after tformer's specials that stand for the foreign ``<unk>`` (``order[3]``):
    pieces a Marian vocabulary lacks (see :class:`MarianTokenizers`)."""
    return [i for i in range(len(SPECIAL_TOKENS), len(order)) if order[i] == order[3]]


class _MarianSide:
    """One side of a Marian folder: its SentencePiece model and its vocabulary."""

    def __init__(
        self, proto: Any, vocab: dict[str, int], specials: dict[str, int], start: int
    ) -> None:
        self.proto = proto
        self.vocab = vocab
        self.specials = specials
        self.start = start
        # The pieces sentencepiece can choose (control pieces like <s> are never matched).
        self.own = {p.piece: p.score for p in proto.pieces if p.type in (_NORMAL, _USER_DEFINED)}

    def order(self, extra: Sequence[str]) -> list[int | None]:
        pad = self.specials["pad"]
        order = special_first_order(
            len(self.vocab),
            pad=None if pad == self.start else pad,
            bos=self.start,
            eos=self.specials["eos"],
            unk=self.specials["unk"],
        )
        return order + [self.specials["unk"]] * len(extra)

    def tokenizer(self, order: list[int | None], extra: Sequence[str], where: str) -> Tokenizer:
        """A tokenizer over ``order`` (+ ``extra`` pieces) that cuts text as this side's model.

        Pieces the model lacks get a score lower than any path of its own pieces, so they are
        never chosen where its pieces can cut the text. A run of characters the model lacks
        (which sentencepiece returns whole as one unknown piece, and Marian looks up in its
        vocabulary) is made a word of its own; where the run is not a vocabulary entry the
        normaliser replaces it by one character no piece has, so it is one ``<unk>``.
        """
        pieces = [""] * len(self.vocab)
        for piece, i in self.vocab.items():
            pieces[i] = piece
        names = _tformer_names(order[: len(order) - len(extra)], pieces, where) + list(extra)
        alphabet = {char for piece in self.own for char in piece}
        longest = max((len(p) for p in names), default=1)
        lowest = min([*self.own.values(), -1.0])
        never = (longest + 1) * lowest - 1.0  # below any path of own pieces over a piece's span
        vocab = [(name, self.own.get(name, never)) for name in names]
        for i, name in enumerate(SPECIAL_TOKENS):
            vocab[i] = (name, never)
        inner = _library_tokenizer(self.proto, [p.piece for p in self.proto.pieces])
        built = tokenizers.Tokenizer(models.Unigram(vocab, SPECIAL_TOKENS.index(UNK), False))
        outside = [name for name in names if not set(name) & alphabet]
        built.normalizer = normalizers.Sequence(
            [n for n in (inner.normalizer, _unknown_runs(alphabet, outside, names)) if n]
        )
        built.pre_tokenizer = pre_tokenizers.Sequence(
            [p for p in (inner.pre_tokenizer, _split_runs(alphabet)) if p]
        )
        # MarianTokenizer strips the decoded text at both ends (a skipped <unk> leaves a space).
        built.decoder = decoders.Sequence(
            [decoders.Replace(_SPACE, " "), decoders.Fuse(), decoders.Replace(_ENDS, "")]
        )
        codes = [name for name in names if _LANGUAGE_CODE.fullmatch(name)]
        built.add_tokens([AddedToken(code, normalized=False, special=False) for code in codes])
        tokenizer = _finish(built, where)
        tokenizer.special_names = own_names(order, dict(enumerate(pieces)), SPECIAL_TOKENS)
        return tokenizer


def _missing_pieces(sides: Iterable[_MarianSide]) -> list[str]:
    """The pieces the sides' SentencePiece models can produce that the vocabulary lacks, in
    the models' order (each once)."""
    missing: dict[str, None] = {}
    for side in sides:
        for piece in side.own:
            if piece not in side.vocab:
                missing[piece] = None
    return list(missing)


def _literal(text: str) -> str:
    """``text`` as an Oniguruma pattern matching exactly it (every character as a code point)."""
    return "".join(f"\\x{{{ord(c):x}}}" for c in text)


def _char_class(chars: Iterable[str], negate: bool = False) -> str:
    body = _literal("".join(sorted(chars)))
    return f"[{'^' if negate else ''}{body}]" if body else ("[\\s\\S]" if negate else "[^\\s\\S]")


def _split_runs(alphabet: set[str]) -> pre_tokenizers.PreTokenizer:
    """Runs of characters outside ``alphabet`` become words of their own."""
    return pre_tokenizers.Split(Regex(f"{_char_class(alphabet, negate=True)}+"), "isolated")


def _unknown_runs(
    alphabet: set[str], outside: Sequence[str], names: Sequence[str]
) -> normalizers.Normalizer:
    """Replace each whole run of characters outside ``alphabet`` that is not one of the
    ``outside`` pieces by one character that no piece has (it then reads as one <unk>)."""
    used = {char for name in names for char in name}
    mark = next(chr(c) for c in range(0xE000, 0x110000) if chr(c) not in used)
    other = _char_class(alphabet, negate=True)
    pieces = "|".join(_literal(p) for p in sorted(outside, key=len, reverse=True))
    keep = f"(?!(?:{pieces})(?!{other}))" if pieces else ""
    # The run's first character is checked before the pieces: most positions fail at once.
    return normalizers.Replace(Regex(f"(?<!{other})(?={other}){keep}{other}+"), mark)


def _special_ids(path: Path, vocab: dict[str, int], names: dict[str, str]) -> dict[str, int]:
    ids = {}
    for key, name in names.items():
        if name not in vocab:
            raise CheckpointError(f"{path}: the special token {name} is not in the vocabulary")
        ids[key] = vocab[name]
    return ids


def _token_name(value: Any, default: str) -> str:
    if isinstance(value, dict):  # an AddedToken as tokenizer_config.json stores it
        value = value.get("content")
    return value if isinstance(value, str) else default


def _read_json(path: Path) -> dict[str, Any]:
    return read_json(path, TOKENIZER_BYTES, "a Marian folder needs its tokenizer files")


def _read_vocab(path: Path) -> dict[str, int]:
    vocab = _read_json(path)
    check_ids(path, vocab.items())
    return vocab


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
    "MarianTokenizers",
    "is_sentencepiece",
    "load_tokenizer",
    "marian_tokenizers",
    "read_model",
    "special_first_order",
    "spm_tokenizer",
    "unk_stand_ins",
]
