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
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken

from tformer.config import MASK, SPECIAL_TOKENS, UNK_ID
from tformer.data.tokenizer import Tokenizer
from tformer.errors import CheckpointError, ConfigError
from tformer.paths import excerpt, first_line, json_loads
from tformer.source_files import TOKENIZER_BYTES, parse_json, read_bytes, text_of

INSTALL = 'pip install "tformer[import]"'
FAST_TOKENIZER, VOCAB, MERGES = "tokenizer.json", "vocab.json", "merges.txt"
# Each family's tokenizer class, and the files it is read from: the first complete set.
FAMILIES: dict[str, tuple[str, tuple[tuple[str, ...], ...]]] = {
    "gpt2": ("GPT2Tokenizer", ((FAST_TOKENIZER,), (VOCAB, MERGES))),
    "bert": ("BertTokenizer", ((FAST_TOKENIZER,), ("vocab.txt",))),
    "t5": ("T5Tokenizer", ((FAST_TOKENIZER,), ("spiece.model",))),
}
# The settings read beside them, where the folder has them.
SETTINGS = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def fast_tokenizer(folder: Path, kind: str) -> Any:
    """The folder's ``GPT2TokenizerFast``, ``BertTokenizerFast`` or T5 tokenizer (``kind``:
    gpt2 | bert | t5), from tokenizer.json or the slow files (vocab.json + merges.txt;
    vocab.txt; spiece.model).

    transformers reads copies, in a private folder, of the files read through
    :mod:`tformer.source_files` (and checked: ids 0..n-1 once each, merges of known pieces),
    so it never opens what the folder holds itself.

    Raises:
        CheckpointError: the tokenizer files are missing, not regular files, too large, or
            unreadable.
        ConfigError: transformers is not installed.
    """
    try:
        import transformers
    except ImportError as error:
        raise ConfigError(f"tformer import needs transformers; {INSTALL}") from error
    # transformers 5 names the tokenizers-backed classes GPT2Tokenizer / BertTokenizer (the
    # *Fast names are aliases of them).
    name, choices = FAMILIES[kind]
    expected = " or ".join(" + ".join(files) for files in choices)
    files = next(
        (f for f in choices if all(os.path.lexists(folder / n) for n in f)), None
    )
    if files is None:
        raise CheckpointError(
            f"{folder}: no tokenizer files ({expected}); save the tokenizer into the folder "
            "too (tokenizer.save_pretrained)"
        )
    with tempfile.TemporaryDirectory(prefix="tformer-tokenizer-") as staged:
        read: dict[str, bytes] = {}
        for file in [*files, *(s for s in SETTINGS if os.path.lexists(folder / s))]:
            read[file] = read_bytes(folder / file, TOKENIZER_BYTES)
            _check_file(folder / file, read[file], read)
            (Path(staged) / file).write_bytes(read[file])
        try:
            return getattr(transformers, name).from_pretrained(staged)
        except Exception as error:  # whatever the library trips on in a file it was given
            why = first_line(error).replace(staged, str(folder))[:160]
            raise CheckpointError(f"{folder}: no readable {name} ({expected}): {why}") from error


def read_tokenizer_json(path: Path) -> tuple[str, dict[str, Any]]:
    """The text and data of a tokenizer.json, checked (see :func:`check_tokenizer`).

    Raises:
        CheckpointError: as :func:`tformer.source_files.read_json`, or the check's.
    """
    data = read_bytes(path, TOKENIZER_BYTES)
    _check_file(path, data, {})
    return data.decode("utf-8"), parse_json(path, data)


def _check_file(path: Path, data: bytes, read: dict[str, bytes]) -> None:
    """Refuse a tokenizer file the library would fail on, or read into a broken vocabulary
    (``read``: the files read before it, merges.txt needing vocab.json)."""
    if path.suffix == ".json":
        parsed = parse_json(path, data)
        if path.name == FAST_TOKENIZER:
            check_tokenizer(path, parsed)
        elif path.name == VOCAB:
            check_ids(path, parsed.items())
    elif path.name == MERGES:
        lines = text_of(path, data).splitlines()
        merges = [line.split(" ", 1) for line in lines if line and not line.startswith("#")]
        _check_merges(path, merges, set(json_loads(read[VOCAB])), "")
    elif path.name == "vocab.txt":
        # One id per piece, as the library reads it: a piece listed twice leaves a gap.
        lines = text_of(path, data).splitlines()
        check_ids(path, {piece: i for i, piece in enumerate(lines)}.items())


def check_ids(path: Path, pairs: Iterable[tuple[Any, Any]]) -> dict[int, str]:
    """id -> piece of a vocabulary's (piece, id) ``pairs``, which must give the ids 0..n-1
    one piece each (a piece may be listed twice with its one id: an added token).

    Raises:
        CheckpointError: an id that is not a whole number, one with two pieces, or a gap.
    """
    pieces: dict[int, str] = {}
    for piece, i in pairs:
        if not isinstance(i, int) or isinstance(i, bool) or not isinstance(piece, str):
            problem = f"{excerpt(piece)} has the id {excerpt(i)}"
        elif pieces.setdefault(i, piece) != piece:
            problem = f"id {i:,} is both {excerpt(pieces[i])} and {excerpt(piece)}"
        else:
            continue
        raise CheckpointError(f"{path}: the ids must be the integers 0..n-1, once each ({problem})")
    gap = next((i for i in range(len(pieces)) if i not in pieces), None)
    if gap is not None:
        raise CheckpointError(
            f"{path}: the ids must be the integers 0..{len(pieces) - 1}, once each (no piece "
            f"has id {gap:,}, yet there are ids up to {max(pieces):,})"
        )
    return pieces


def check_tokenizer(path: Path, data: dict[str, Any]) -> None:
    """Refuse a tokenizer.json whose ids are not 0..n-1 one piece each (the model's
    vocabulary and its added tokens together), whose merges name a piece the vocabulary lacks,
    or that the tokenizers library does not read.

    Raises:
        CheckpointError: naming ``path`` and the problem.
    """
    model = data.get("model")
    if not isinstance(model, dict):
        raise CheckpointError(f"{path}: has no tokenizer model")
    vocab = model.get("vocab")
    if model.get("type") == "Unigram":
        if not isinstance(vocab, list) or not all(
            isinstance(entry, list) and len(entry) == 2 for entry in vocab
        ):
            raise CheckpointError(f"{path}: model.vocab is not a list of [piece, score] pairs")
        pairs: list[tuple[Any, Any]] = [(entry[0], i) for i, entry in enumerate(vocab)]
    elif isinstance(vocab, dict):
        pairs = list(vocab.items())
    else:
        raise CheckpointError(f"{path}: model.vocab is not a mapping of pieces to ids")
    added = data.get("added_tokens") or []
    if not isinstance(added, list) or not all(isinstance(token, dict) for token in added):
        raise CheckpointError(f"{path}: added_tokens is not a list of tokens")
    check_ids(path, [*pairs, *((token.get("content"), token.get("id")) for token in added)])
    merges = model.get("merges")
    if model.get("type") == "BPE" and isinstance(merges, list):
        split = [m.split(" ", 1) if isinstance(m, str) else m for m in merges]
        prefix = model.get("continuing_subword_prefix") or ""
        _check_merges(path, split, set(vocab), prefix if isinstance(prefix, str) else "")
    try:
        tokenizers.Tokenizer.from_str(json.dumps(data))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:  # its errors, and a panic (pyo3's is a BaseException)
        raise CheckpointError(
            f"{path}: not a tokenizer the tokenizers library reads ({first_line(error)})"
        ) from error


def _check_merges(path: Path, merges: list[Any], vocab: set[str], prefix: str) -> None:
    """Refuse a merge of pieces the vocabulary lacks, or one making a piece it lacks (the
    library's rule: the second piece's continuing-subword prefix dropped)."""
    for merge in merges:
        pair = isinstance(merge, list) and len(merge) == 2
        if not pair or not all(isinstance(piece, str) for piece in merge):
            raise CheckpointError(f"{path}: the merge {excerpt(merge)} is not two pieces")
        first, second = merge
        if prefix and not second.startswith(prefix):
            raise CheckpointError(
                f"{path}: the merge {excerpt(merge)} has a second piece without the "
                f"continuing-subword prefix {excerpt(prefix)}"
            )
        merged = first + second[len(prefix) :]
        lacking = next((p for p in (first, second, merged) if p not in vocab), None)
        if lacking is not None:
            raise CheckpointError(
                f"{path}: the merge {excerpt(merge)} names {excerpt(lacking)}, which is not in "
                "the vocabulary"
            )


def reordered_tokenizer(
    inner: tokenizers.Tokenizer,
    order: Sequence[int | None],
    *,
    mask: bool,
    where: str,
    keep: Sequence[str] = (),
) -> Tokenizer:
    """``inner`` (a BPE, WordPiece or Unigram pipeline) with its vocabulary in tformer's id
    ``order``; the added tokens named in ``keep`` (T5's sentinels) stay whole, as special
    tokens that decoding leaves out (as transformers' ``skip_special_tokens`` does). The
    foreign names of the special tokens are kept as ``special_names``, for display.

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
    lacking = [i for i in order if i is not None and i not in pieces]
    if lacking:
        raise CheckpointError(
            f"{where}: the tokenizer has no piece with id {lacking[0]:,}, yet the model's "
            "vocabulary does; they do not belong together"
        )
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
    # Special, as transformers has them: decoding leaves them out, tables show them.
    built.add_special_tokens([AddedToken(name, normalized=False, special=True) for name in keep])
    tokenizer = Tokenizer.from_str(built.to_str(), source=where)
    tokenizer.special_names = own_names(order, pieces, specials)
    return tokenizer


def own_names(
    order: Sequence[int | None], pieces: Mapping[int, str], specials: Sequence[str]
) -> dict[int, str]:
    """tformer's special ids -> the foreign vocabulary's names of them (``pieces``: foreign id
    -> piece), where the two differ (``<bos>``: ``[CLS]``); a new row keeps tformer's name."""
    names = {i: pieces[j] for i, j in enumerate(order[: len(specials)]) if j is not None}
    return {i: name for i, name in names.items() if name != specials[i]}


def to_tformer_ids(order: Sequence[int | None]) -> dict[int, int]:
    """Foreign id -> tformer id (the first row a foreign id stands at)."""
    ids: dict[int, int] = {}
    for mine, theirs in enumerate(order):
        if theirs is not None:
            ids.setdefault(theirs, mine)
    return ids


__all__ = [
    "check_ids",
    "check_tokenizer",
    "fast_tokenizer",
    "read_tokenizer_json",
    "own_names",
    "reordered_tokenizer",
    "to_tformer_ids",
]
