"""Subword tokenizers: train, load and save a Hugging Face ``tokenizers`` model.

Every tformer tokenizer shares one pipeline so that its output can be decoded back to the text:

* NFKC normalisation (ligatures and full-width forms fold to their plain spelling; case is kept);
* sentencepiece-style ``Metaspace`` pre-tokenisation, so spaces live inside the tokens as "▁" and
  decoding needs no guesswork about where they went;
* ``Digits(individual_digits=True)``, so every digit is its own token and copying numbers (dates,
  amounts) is a per-digit job the model can learn;
* one of three subword models (BPE, Unigram, WordPiece), trained with the special tokens first so
  ``<pad> <bos> <eos> <unk>`` always get ids 0..3. Loading checks this: the model code relies on it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from tformer.config import SPECIAL_TOKENS, UNK, check_text
from tformer.data.store import TokenIds
from tformer.data.wordcache import WordCache
from tformer.errors import CheckpointError, ConfigError, DataError
from tformer.native import interruptible
from tformer.paths import check_replaceable, first_line, follow_umask, replace_file

TOKENIZER_KINDS = ("bpe", "unigram", "wordpiece")
# Pairs a tokenizer is trained on at most: a sample this large gives the same vocabulary as
# the whole of a large corpus to within rare pieces, at a fraction of the time and memory.
DEFAULT_TOKENIZER_SAMPLE = 500_000
ENCODE_CHUNK = 16_384  # texts per call into Rust: large enough to keep every core busy

_SPACE = "▁"  # U+2581, the sentencepiece word-boundary marker
_WORDPIECE_PREFIX = "##"
_KIND_OF_MODEL = {models.BPE: "bpe", models.Unigram: "unigram", models.WordPiece: "wordpiece"}


class Tokenizer:
    """Thin wrapper over a `tokenizers.Tokenizer` with tformer's fixed special tokens.

    The wrapper keeps the JSON text it was built from: re-serialising a parsed Unigram model can
    change the last digit of its float scores, and the hash recorded in a checkpoint must not
    depend on how many times the file went through a load/save cycle.
    """

    def __init__(self, inner: tokenizers.Tokenizer, *, source: str | None = None) -> None:
        where = source or "tokenizer"
        if type(inner.model) not in _KIND_OF_MODEL:
            raise CheckpointError(
                f"{where}: a {type(inner.model).__name__} model is not supported; "
                f"tformer tokenizers are one of {', '.join(TOKENIZER_KINDS)}"
            )
        found = {token: inner.token_to_id(token) for token in SPECIAL_TOKENS}
        if list(found.values()) != list(range(len(SPECIAL_TOKENS))):
            got = ", ".join(f"{token}={i}" for token, i in found.items())
            raise CheckpointError(
                f"{where}: special tokens must have ids {', '.join(SPECIAL_TOKENS)} = 0..3 but "
                f"have {got}; it was not made by tformer, so train a new tokenizer with tformer"
            )
        self.inner = inner
        self._text = inner.to_str()
        self._words: WordCache | None = None
        # tformer's special ids under the names the imported tokenizer gives them (1: "[CLS]",
        # 2: "</s>"), where a checkpoint records them; only how a token is shown uses them.
        self.special_names: dict[int, str] = {}

    @property
    def vocab_size(self) -> int:
        return self.inner.get_vocab_size(with_added_tokens=True)

    @property
    def kind(self) -> str:
        return _KIND_OF_MODEL[type(self.inner.model)]

    @functools.cached_property
    def byte_level(self) -> bool:
        """Whether pieces spell bytes (GPT-2's byte-level BPE: "Ġman" is " man")."""
        decoder = json.loads(self._text).get("decoder") or {}
        return decoder.get("type") == "ByteLevel"

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; BOS/EOS are added by the data pipeline, not here.

        Raises:
            DataError: ``text`` is not valid Unicode (a lone surrogate), as for every encode.
        """
        try:
            return self.inner.encode(text, add_special_tokens=False).ids
        except TypeError:
            _refuse_invalid([text])
            raise

    def encodings(self, texts: Sequence[str]) -> list[tokenizers.Encoding]:
        """The library's full encodings of ``texts`` (tokens, character offsets), checked
        as :meth:`encode` is."""
        try:
            return self.inner.encode_batch(list(texts), add_special_tokens=False)
        except TypeError:
            _refuse_invalid(texts)
            raise

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, as :meth:`encode` gives them."""
        ids: list[list[int]] = []
        for start in range(0, len(texts), ENCODE_CHUNK):
            values, lengths = self._encode_chunk(texts[start : start + ENCODE_CHUNK])
            flat = values.tolist()
            ends = np.cumsum(lengths).tolist()
            ids.extend(flat[end - n : end] for end, n in zip(ends, lengths.tolist(), strict=True))
        return ids

    def encode_packed(self, texts: Sequence[str]) -> TokenIds:
        """Token ids of each text packed in flat arrays (4 bytes a token, no list per text)."""
        values, lengths = [], []
        for start in range(0, len(texts), ENCODE_CHUNK):
            chunk_values, chunk_lengths = self._encode_chunk(texts[start : start + ENCODE_CHUNK])
            values.append(chunk_values)
            lengths.append(chunk_lengths)
        return TokenIds.concatenate(values, lengths)

    def _encode_chunk(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        # One call per chunk, so Ctrl-C is seen between chunks. tformer's own pipeline goes
        # through the word cache (same ids, several times faster); any other through Rust.
        if self._words is None:
            self._words = WordCache(self.inner, SPECIAL_TOKENS, enabled=_is_own_pipeline(self))
        try:
            return self._words.encode(texts)
        except TypeError:  # what the tokenizers library raises for text it cannot take
            _refuse_invalid(texts)
            raise

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens (padding, BOS/EOS, unknowns) left out."""
        return self.inner.decode([int(i) for i in ids], skip_special_tokens=True)

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        lists = [[int(i) for i in ids] for ids in batch]
        return self.inner.decode_batch(lists, skip_special_tokens=True)

    def id_to_token(self, i: int) -> str:
        token = self.inner.id_to_token(int(i))
        if token is None:
            raise IndexError(f"token id {i} is outside the vocabulary (0..{self.vocab_size - 1})")
        return token

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """Token strings as stored in the vocabulary ("▁the", "##re", "<eos>"), e.g. for plots."""
        return [self.id_to_token(i) for i in ids]

    def to_str(self) -> str:
        return self._text

    def sha256(self) -> str:
        return hashlib.sha256(self._text.encode("utf-8")).hexdigest()

    def same_vocabulary(self, other: Tokenizer) -> bool:
        """Whether ``other`` maps every token to the same id (the same file, or another file
        with the same vocabulary)."""
        return (
            other is self
            or other.sha256() == self.sha256()
            or other.inner.get_vocab() == self.inner.get_vocab()
        )

    def save(self, path: str | Path) -> None:
        """Write the JSON atomically: a crash leaves either the old file or the new one.

        Raises:
            CheckpointError: ``path`` cannot be written, or exists and is not a regular file
                (a link, FIFO or device, which the rename would replace).
        """
        path = Path(path)
        check_replaceable(path)
        tmp: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            follow_umask(tmp)  # mkstemp makes it private; a tokenizer is an ordinary file
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as file:
                file.write(self._text)
                file.flush()
                os.fsync(file.fileno())
            replace_file(tmp, path)
        except OSError as error:
            raise CheckpointError(
                f"{path}: cannot write the tokenizer ({first_line(error)})"
            ) from error
        finally:
            if tmp is not None:  # already renamed on success; removes the leftover on failure
                Path(tmp).unlink(missing_ok=True)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(
                f"{path}: tokenizer file not found; pass the tokenizer.json saved next to the "
                "model, or train a new tokenizer"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise CheckpointError(
                f"{path}: cannot read the tokenizer ({first_line(error)})"
            ) from error
        return cls.from_str(text, source=str(path))

    @classmethod
    def from_str(cls, text: str, *, source: str | None = None) -> Tokenizer:
        try:
            inner = tokenizers.Tokenizer.from_str(text)
        except Exception as error:  # the Rust side raises a bare Exception for any parse error
            raise CheckpointError(
                f"{source or 'tokenizer'}: not a valid tokenizer JSON ({first_line(error)}); "
                "the file is truncated or not a tokenizer, so re-save or re-train it"
            ) from error
        tokenizer = cls(inner, source=source)
        tokenizer._text = text  # hash exactly what is on disk (see the class docstring)
        return tokenizer


# Bounds on tokenizer training. BPE's work grows with the square of a word's length: one
# 1 MB line without spaces took over ten minutes, with Ctrl-C ignored inside the native call.
# Texts longer than MAX_TEXT_CHARS are refused (naming the text); within a text, runs of more
# than MAX_WORD_CHARS non-space characters are cut into pieces of that length for training only
# (encoding later still sees the whole text; the merges learnt apply to it).
MAX_TEXT_CHARS = 100_000
MAX_WORD_CHARS = 100
_LONG_WORD = re.compile(rf"\S{{{MAX_WORD_CHARS + 1},}}")
MAX_VOCAB_SIZE = 2**24


def check_tokenizer_options(vocab_size: int, min_frequency: int) -> None:
    """Refuse a ``--vocab-size`` or ``--min-frequency`` no tokenizer can be trained with."""
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ConfigError(
            f"--vocab-size {vocab_size} is too small: it must exceed the {len(SPECIAL_TOKENS)} "
            "special tokens plus the characters of the text (a few hundred is a sensible minimum)"
        )
    if vocab_size > MAX_VOCAB_SIZE:
        raise ConfigError(
            f"--vocab-size {vocab_size} is over {MAX_VOCAB_SIZE:,} (2**24); lower --vocab-size"
        )
    if not 0 <= min_frequency <= 2**31 - 1:
        raise ConfigError(
            f"--min-frequency {min_frequency} must be a count from 0 to {2**31 - 1:,} "
            "(pieces seen fewer times are not kept)"
        )


def train_tokenizer(
    texts: Iterable[str],
    *,
    kind: str = "bpe",
    vocab_size: int = 8000,
    min_frequency: int = 2,
    show_progress: bool = False,
    where: str = "tokenizer training text",
    specials: Sequence[str] = (),
) -> Tokenizer:
    """Train a ``kind`` tokenizer of at most ``vocab_size`` tokens on ``texts`` (one pass).

    Args:
        where: names ``texts`` in errors ("--data x.csv, train split").
        specials: special tokens after tformer's four (ids 4, 5, ...), e.g. <mask>.

    Raises:
        ConfigError: unknown ``kind``, ``vocab_size`` too small for the specials or alphabet,
            or out of range options.
        DataError: ``texts`` holds no non-blank text, or a text over ``MAX_TEXT_CHARS``.
    """
    if kind not in TOKENIZER_KINDS:
        raise ConfigError(
            f"--tokenizer-kind {kind!r} is not supported; "
            f"choose one of {', '.join(TOKENIZER_KINDS)}"
        )
    check_tokenizer_options(vocab_size, min_frequency)
    inner = _pipeline(kind)
    trainer = _trainer(kind, vocab_size, min_frequency, show_progress, tuple(specials))
    refused: list[DataError] = []
    try:
        lines = _bounded(_non_empty(texts), where, refused)
        interruptible(lambda: inner.train_from_iterator(lines, trainer=trainer))
    except Exception as error:
        if refused:
            raise refused[0] from None
        # Unigram refuses outright when the alphabet does not fit; BPE/WordPiece overshoot instead.
        if "not large enough" not in str(error):
            raise
        raise _too_small(vocab_size, kind) from error
    if refused:  # raised here: an error inside the native training call would lose its type
        raise refused[0]
    trained_size = inner.get_vocab_size(with_added_tokens=True)
    if trained_size > vocab_size:
        raise _too_small(vocab_size, kind, trained_size)
    # Going through JSON makes the in-memory model identical to what a later load will see.
    tokenizer = Tokenizer.from_str(inner.to_str(), source="trained tokenizer")
    assert [tokenizer.inner.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    return tokenizer


def _refuse_invalid(texts: Sequence[str]) -> None:
    """Name the first of ``texts`` that is not valid Unicode; the check runs only after the
    tokenizer refused a batch, so valid text pays nothing for it."""
    for number, text in enumerate(texts, start=1):
        if isinstance(text, str):
            check_text(text, "the text" if len(texts) == 1 else f"text {number}")


def _non_empty(texts: Iterable[str]) -> Iterator[str]:
    """``texts`` unchanged, after checking (lazily, in a single pass) that one is not blank."""
    iterator = iter(texts)
    first = next((text for text in iterator if text.strip()), None)
    if first is None:
        raise DataError("no text to train the tokenizer on")
    return chain([first], iterator)


def _bounded(texts: Iterable[str], where: str, refused: list[DataError]) -> Iterator[str]:
    """``texts`` with over-long words cut into ``MAX_WORD_CHARS`` pieces. At a text over
    ``MAX_TEXT_CHARS``, or one that is not valid Unicode, it stops, with the refusal (naming
    the text, 1 = the first) in ``refused``."""
    for number, text in enumerate(texts, start=1):
        if len(text) > MAX_TEXT_CHARS:
            refused.append(
                DataError(
                    f"{where}: text {number} is {len(text):,} characters, over the "
                    f"{MAX_TEXT_CHARS:,} a tokenizer is trained on; split or drop that text"
                )
            )
            return
        try:
            check_text(text, f"{where}: text {number}")
        except DataError as error:
            refused.append(error)
            return
        yield _LONG_WORD.sub(_cut_word, text) if len(text) > MAX_WORD_CHARS else text


def _cut_word(match: re.Match[str]) -> str:
    word = match.group(0)
    return " ".join(word[i : i + MAX_WORD_CHARS] for i in range(0, len(word), MAX_WORD_CHARS))


def _is_own_pipeline(tokenizer: Tokenizer) -> bool:
    """Whether the normaliser and pre-tokeniser are the ones :func:`_pipeline` builds (what the
    word cache relies on), not those of a tokenizer.json made elsewhere."""
    data = json.loads(tokenizer.to_str())
    own = json.loads(_pipeline(tokenizer.kind).to_str())
    return all(data.get(key) == own.get(key) for key in ("normalizer", "pre_tokenizer"))


def _pipeline(kind: str) -> tokenizers.Tokenizer:
    metaspace: dict[str, Any] = {"replacement": _SPACE, "prepend_scheme": "always"}
    decoder: decoders.Decoder
    if kind == "bpe":
        inner = tokenizers.Tokenizer(models.BPE(unk_token=UNK))
        decoder = decoders.Metaspace(**metaspace)
    elif kind == "unigram":
        inner = tokenizers.Tokenizer(models.Unigram())
        decoder = decoders.Metaspace(**metaspace)
    else:
        inner = tokenizers.Tokenizer(
            models.WordPiece(unk_token=UNK, continuing_subword_prefix=_WORDPIECE_PREFIX)
        )
        # The WordPiece decoder strips "##" from continuation tokens but puts a space before
        # every other token. Those spaces are spurious: the Metaspace pre-tokenizer turned every
        # real " " into "▁", so they are dropped before Metaspace decoding restores the real ones.
        # Replace("##", "") would be wrong: it also eats "#" characters inside words ("a##").
        decoder = decoders.Sequence(
            [
                decoders.WordPiece(prefix=_WORDPIECE_PREFIX, cleanup=False),
                decoders.Replace(" ", ""),
                decoders.Metaspace(**metaspace),
            ]
        )
    inner.normalizer = normalizers.NFKC()
    inner.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(**metaspace), pre_tokenizers.Digits(individual_digits=True)]
    )
    inner.decoder = decoder
    return inner


def _trainer(
    kind: str, vocab_size: int, min_frequency: int, show_progress: bool, extra: tuple[str, ...]
) -> trainers.Trainer:
    # The specials go first and in this order: that is what gives them ids 0..3 (and the
    # extra ones 4, ...). BPE and WordPiece keep every character seen (limit_alphabet is
    # unset), so no initial_alphabet.
    specials = [*SPECIAL_TOKENS, *extra]
    if kind == "bpe":
        return trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            show_progress=show_progress,
            min_frequency=min_frequency,
        )
    if kind == "unigram":
        return trainers.UnigramTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            show_progress=show_progress,
            unk_token=UNK,
        )
    return trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        show_progress=show_progress,
        min_frequency=min_frequency,
        continuing_subword_prefix=_WORDPIECE_PREFIX,
    )


def _too_small(vocab_size: int, kind: str, needed: int | None = None) -> ConfigError:
    why = f"its characters alone take {needed} tokens" if needed else "it needs every character"
    return ConfigError(
        f"--vocab-size {vocab_size} is too small for this text with --tokenizer-kind {kind}: "
        f"{why}; raise --vocab-size"
    )
