"""GPT-2's byte-level BPE and BERT's WordPiece (a ``transformers`` tokenizer folder) as tformer
tokenizers.

The folder's own ``tokenizers`` pipeline (normaliser, pre-tokeniser, model, decoder) is kept,
so a text is cut into the pieces ``transformers`` chooses; only the ids change, as for
SentencePiece models (:mod:`tformer.data.spm`): tformer's ``<pad> <bos> <eos>
<unk>`` (and an encoder-only model's ``<mask>``) take ids 0..3 (4) under those names, and every
other piece keeps its order. tformer id ``i`` is the folder's id ``order[i]``; None is a new
row. One foreign id may stand at two tformer ids (GPT-2's ``<|endoftext|>`` is both its
``<bos>`` and its ``<eos>``): a text is encoded to the first.

``transformers`` is optional (``pip install "tformer[import]"``) and imported only here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken

from tformer.config import MASK, SPECIAL_TOKENS, UNK_ID
from tformer.data.tokenizer import Tokenizer
from tformer.errors import CheckpointError, ConfigError
from tformer.paths import first_line

INSTALL = 'pip install "tformer[import]"'


def fast_tokenizer(folder: Path, kind: str) -> Any:
    """The folder's ``GPT2TokenizerFast`` or ``BertTokenizerFast`` (``kind``: gpt2 | bert),
    from tokenizer.json or the slow files (vocab.json + merges.txt; vocab.txt).

    Raises:
        CheckpointError: the tokenizer files are missing or unreadable.
        ConfigError: transformers is not installed.
    """
    try:
        # transformers 5 names the tokenizers-backed classes GPT2Tokenizer / BertTokenizer
        # (the *Fast names are aliases of them).
        from transformers import BertTokenizer, GPT2Tokenizer
    except ImportError as error:
        raise ConfigError(f"tformer import needs transformers; {INSTALL}") from error
    cls = GPT2Tokenizer if kind == "gpt2" else BertTokenizer
    files = "tokenizer.json or vocab.json + merges.txt" if kind == "gpt2" else (
        "tokenizer.json or vocab.txt"
    )
    try:
        return cls.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise CheckpointError(
            f"{folder}: no readable {cls.__name__} ({files}): {first_line(error)[:160]}"
        ) from error


def reordered_tokenizer(
    inner: tokenizers.Tokenizer,
    order: Sequence[int | None],
    *,
    mask: bool,
    where: str,
    keep: Sequence[str] = (),
) -> Tokenizer:
    """``inner`` (a BPE, WordPiece or Unigram pipeline) with its vocabulary in tformer's id
    ``order``; the added tokens named in ``keep`` (T5's sentinels) stay whole, as ordinary
    tokens that decoding shows.

    The first four rows (five with ``mask``) are named ``<pad> <bos> <eos> <unk>`` (``<mask>``)
    and registered as special tokens; the folder's own added tokens and post-processor
    ([CLS] ... [SEP] templates with the folder's ids) are dropped, since tformer frames texts
    itself.

    Raises:
        CheckpointError: an ordinary piece is named as one of tformer's special tokens.
    """
    data = json.loads(inner.to_str())
    model = data["model"]
    unigram = model["type"] == "Unigram"  # vocab: [piece, score] in id order
    scores: dict[str, float] = {}
    if unigram:
        scores = {piece: score for piece, score in model["vocab"]}
        pieces: dict[int, str] = {i: entry[0] for i, entry in enumerate(model["vocab"])}
    else:
        pieces = {i: piece for piece, i in model["vocab"].items()}
    pieces.update({token["id"]: token["content"] for token in data.get("added_tokens") or []})
    specials = [*SPECIAL_TOKENS, *((MASK,) if mask else ())]
    names = [*specials, *(pieces[i] for i in order[len(specials) :] if i is not None)]
    clash = sorted(set(names[len(specials) :]) & set(specials))
    if clash:
        raise CheckpointError(
            f"{where}: the piece {clash[0]} is an ordinary piece here, but tformer reserves that "
            "name for its special token; such a tokenizer cannot be used"
        )
    if unigram:
        model["vocab"] = [[name, scores.get(name, 0.0)] for name in names]
        model["unk_id"] = UNK_ID
    else:
        model["vocab"] = {name: i for i, name in enumerate(names)}
    if model.get("unk_token") is not None:
        model["unk_token"] = SPECIAL_TOKENS[3]
    data["added_tokens"] = []
    data["post_processor"] = None
    data["padding"] = None
    data["truncation"] = None
    built = tokenizers.Tokenizer.from_str(json.dumps(data))
    built.add_special_tokens(
        [AddedToken(name, normalized=False, special=True) for name in specials]
    )
    built.add_tokens([AddedToken(name, normalized=False, special=False) for name in keep])
    return Tokenizer.from_str(built.to_str(), source=where)


def to_tformer_ids(order: Sequence[int | None]) -> dict[int, int]:
    """Foreign id -> tformer id (the first row a foreign id stands at)."""
    ids: dict[int, int] = {}
    for mine, theirs in enumerate(order):
        if theirs is not None:
            ids.setdefault(theirs, mine)
    return ids


__all__ = ["fast_tokenizer", "reordered_tokenizer", "to_tformer_ids"]
