"""A Marian (OPUS-MT) folder's tokenizers as tformer tokenizers: ``source.spm``, ``target.spm``
and ``vocab.json`` (``target_vocab.json`` with separate vocabularies), their pieces kept and
their ids moved so that the special tokens come first (``special_first_order``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

from tformer.config import SPECIAL_TOKENS, UNK
from tformer.data.hf_tokenizers import check_ids, own_names
from tformer.data.spm import (
    _ENDS,
    _LANGUAGE_CODE,
    _NORMAL,
    _SPACE,
    _UNIGRAM,
    _USER_DEFINED,
    SOURCE_SPM,
    TARGET_SPM,
    TARGET_VOCAB,
    TOKENIZER_CONFIG,
    VOCAB,
    _converter,
    _finish,
    _library_tokenizer,
    _tformer_names,
    read_model,
    special_first_order,
)
from tformer.data.tokenizer import Tokenizer
from tformer.errors import CheckpointError
from tformer.source_files import TOKENIZER_BYTES, read_json

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
