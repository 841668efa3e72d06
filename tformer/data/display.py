"""How a token is shown: the one spelling of attention maps, score, explain and fill-mask tables.

- tformer's special ids (``<pad> <bos> <eos> <unk> <mask>``) under the names the imported
  tokenizer gives them, where the checkpoint records them (BERT's ``[CLS]`` and ``[SEP]``,
  T5's and Marian's ``</s>``, GPT-2's ``<|endoftext|>``); else under tformer's names;
- a byte-level BPE piece (GPT-2's ``Ġman``) as the text it stands for, its spaces written
  ``▁`` as SentencePiece's pieces and tformer's own write them (``▁man``), a line break as
  ``\\n``, and a byte of a character split across pieces as ``<0xC3>``;
- every other piece as the vocabulary writes it (``▁the``, ``##ing``).

Text decoded from ids (``Tokenizer.decode``) is unaffected: this is how a token is shown, not
what it means.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from tformer.config import MASK, MASK_ID, SPECIAL_TOKENS
from tformer.data.tokenizer import Tokenizer

SPACE = "\u2581"  # "▁": a space inside a shown token
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# The shown name of each special token met so far -> the tformer names it stands for, so a
# table can style a special token, and find the <eos> column, by the name it shows.
_SHOWN: dict[str, set[str]] = {name: {name} for name in (*SPECIAL_TOKENS, MASK)}


def display_token(tokenizer: Tokenizer, i: int) -> str:
    """Token ``i`` of ``tokenizer`` as tables and maps show it (see the module's docstring)."""
    i = int(i)
    piece = tokenizer.id_to_token(i)
    if i < len(SPECIAL_TOKENS) or (i == MASK_ID and piece == MASK):
        name = tokenizer.special_names.get(i, piece)
        _SHOWN.setdefault(name, set()).add(piece)
        return name
    return _byte_text(piece) if tokenizer.byte_level else piece


def display_tokens(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """Each of ``ids`` as :func:`display_token` shows it."""
    return [display_token(tokenizer, i) for i in ids]


def is_special(token: str) -> bool:
    """Whether a shown ``token`` is a special token (tformer's names, or those shown for them)."""
    return token in _SHOWN


def stands_for(token: str, name: str) -> bool:
    """Whether a shown ``token`` is tformer's special token ``name`` ("</s>" for "<eos>")."""
    return name in _SHOWN.get(token, ())


def mask_names(tokenizer: Tokenizer) -> list[str]:
    """How a text may write the mask token: ``<mask>``, and the imported tokenizer's own name
    for it (BERT's ``[MASK]``) where the checkpoint records one."""
    own = tokenizer.special_names.get(MASK_ID)
    return [MASK, *([own] if own and own != MASK else [])]


@functools.cache
def _byte_of() -> dict[str, int]:
    """The byte each character of a byte-level piece spells (GPT-2's ``bytes_to_unicode``,
    inverted): printable bytes stand for themselves, the others for 256 + n."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable} | {b: chr(256 + n) for n, b in enumerate(others)}
    return {char: b for b, char in chars.items()}


def _byte_text(piece: str) -> str:
    """The text a byte-level ``piece`` spells, shown; ``piece`` itself if it spells no bytes
    (an added token)."""
    byte_of = _byte_of()
    if not piece or any(char not in byte_of for char in piece):
        return piece
    data = bytes(byte_of[char] for char in piece)
    shown: list[str] = []
    while data:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            text = data[: error.start].decode("utf-8")
            text += "".join(f"<0x{b:02X}>" for b in data[error.start : error.end])
            data = data[error.end :]
        else:
            data = b""
        shown.append(text)
    return "".join(_ESCAPES.get(char, char) for char in "".join(shown)).replace(" ", SPACE)


__all__ = [
    "SPACE",
    "display_token",
    "display_tokens",
    "is_special",
    "mask_names",
    "stands_for",
]
