"""Tests for tformer.data.tokenizer: training, round trips, persistence and error messages."""

from __future__ import annotations

import random
import unicodedata
from pathlib import Path

import pytest
import tokenizers
from tokenizers import models, pre_tokenizers, trainers

from tformer.config import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID
from tformer.data.tokenizer import TOKENIZER_KINDS, Tokenizer, train_tokenizer
from tformer.errors import CheckpointError, ConfigError, DataError

VOCAB_SIZE = 400

SUBJECTS = ["the man", "a woman", "the dog", "my neighbour", "a small child", "the fine cat"]
VERBS = ["walks", "runs", "sleeps", "waits", "sings", "reads quietly", "jumps"]
PLACES = ["in the garden", "over the bridge", "near the river", "at home", "on Friday"]
GERMAN = ["Ein Mann läuft.", "Eine Frau singt.", "Der Hund schläft über der Brücke."]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = (
    "January February March April May June July August September October November December".split()
)


def sentence(rng: random.Random) -> str:
    text = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(PLACES)}"
    return text[0].upper() + text[1:] + rng.choice([".", "!", "?"])


def date_pair(rng: random.Random) -> tuple[str, str]:
    year, month, day = rng.randint(1900, 2099), rng.randint(1, 12), rng.randint(1, 28)
    spoken = f"{rng.choice(DAYS)}, {day} {MONTHS[month - 1]} {year}"
    return spoken, f"{year}-{month:02d}-{day:02d}"


def corpus(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    texts: list[str] = []
    for _ in range(n):
        texts.append(sentence(rng))
        texts.extend(date_pair(rng))
        texts.append(rng.choice(GERMAN))
    return texts


TRAIN = corpus(seed=0, n=300)
HELD_OUT = [
    *corpus(seed=1, n=20),
    "Thursday, 6 March 2025",
    "2025-03-06",
    "Ein Mann läuft.",
]


@pytest.fixture(scope="module", params=TOKENIZER_KINDS)
def tok(request: pytest.FixtureRequest) -> Tokenizer:
    # A generator checks that training needs only one pass over the texts.
    return train_tokenizer(iter(TRAIN), kind=request.param, vocab_size=VOCAB_SIZE)


def test_kind_and_special_ids(tok: Tokenizer) -> None:
    assert tok.kind in TOKENIZER_KINDS
    assert [tok.inner.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD_ID, BOS_ID, EOS_ID, UNK_ID]
    assert [PAD_ID, BOS_ID, EOS_ID, UNK_ID] == [0, 1, 2, 3]
    assert tok.tokens([BOS_ID, EOS_ID, PAD_ID]) == ["<bos>", "<eos>", "<pad>"]


def test_vocab_size_respected(tok: Tokenizer) -> None:
    assert len(SPECIAL_TOKENS) < tok.vocab_size <= VOCAB_SIZE


@pytest.mark.parametrize("text", HELD_OUT)
def test_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert UNK_ID not in ids
    assert BOS_ID not in ids and EOS_ID not in ids
    assert tok.decode(ids) == unicodedata.normalize("NFKC", text)


def test_batch_matches_single(tok: Tokenizer) -> None:
    batch = tok.encode_batch(HELD_OUT)
    assert batch == [tok.encode(text) for text in HELD_OUT]
    assert tok.decode_batch(batch) == HELD_OUT


def test_decode_skips_special_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("2025-03-06")
    assert tok.decode([BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]) == "2025-03-06"


def test_digits_are_single_tokens(tok: Tokenizer) -> None:
    tokens = tok.tokens(tok.encode("2025-03-06"))
    assert [t for t in tokens if any(c.isdigit() for c in t)] == list("20250306")
    tokens = tok.tokens(tok.encode("Thursday, 6 March 2025"))
    assert [t for t in tokens if any(c.isdigit() for c in t)] == list("62025")


@pytest.mark.parametrize("text", ["☃", "中", "The dog ☃ runs 中."])
def test_unknown_characters_map_to_unk(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert UNK_ID in ids
    assert all(0 <= i < tok.vocab_size for i in ids)
    tok.decode(ids)  # must not raise


def test_nfkc_normalisation(tok: Tokenizer) -> None:
    assert tok.encode("The ﬁne cat") == tok.encode("The fine cat")
    assert tok.encode("２０２５") == tok.encode("2025")
    assert tok.decode(tok.encode("２０２５")) == "2025"


def test_save_load_round_trip(tok: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    assert list(tmp_path.iterdir()) == [path]  # no temp files left behind
    loaded = Tokenizer.load(path)
    assert loaded.kind == tok.kind
    assert loaded.sha256() == tok.sha256()
    assert loaded.inner.get_vocab() == tok.inner.get_vocab()
    assert loaded.encode_batch(HELD_OUT) == tok.encode_batch(HELD_OUT)
    # Saving a loaded tokenizer again writes the same bytes, so the hash never drifts.
    again = tmp_path / "again.json"
    loaded.save(again)
    assert again.read_bytes() == path.read_bytes()
    assert Tokenizer.load(again).sha256() == tok.sha256()


def test_save_overwrites_atomically(tok: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "sub" / "tokenizer.json"
    path.parent.mkdir()
    path.write_text("old")
    tok.save(path)
    assert path.read_text(encoding="utf-8") == tok.to_str()
    assert list(path.parent.iterdir()) == [path]


def test_load_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(CheckpointError, match="nope.json"):
        Tokenizer.load(path)


@pytest.mark.parametrize("garbage", ["{not json", '{"version": "1.0"}', ""])
def test_load_garbage(tmp_path: Path, garbage: str) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(garbage)
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        Tokenizer.load(path)


def test_load_foreign_special_ids(tmp_path: Path) -> None:
    inner = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Metaspace()
    reordered = ["<unk>", "<pad>", "<bos>", "<eos>"]
    trainer = trainers.BpeTrainer(vocab_size=100, special_tokens=reordered, show_progress=False)
    inner.train_from_iterator(TRAIN[:50], trainer=trainer)
    path = tmp_path / "foreign.json"
    inner.save(str(path))
    with pytest.raises(CheckpointError, match="foreign.json.*special tokens"):
        Tokenizer.load(path)


def test_unsupported_model_type() -> None:
    inner = tokenizers.Tokenizer(
        models.WordLevel({t: i for i, t in enumerate(SPECIAL_TOKENS)}, unk_token="<unk>")
    )
    with pytest.raises(CheckpointError, match="WordLevel"):
        Tokenizer(inner, source="x.json")


def test_vocab_size_must_exceed_specials() -> None:
    with pytest.raises(ConfigError, match="--vocab-size 4 is too small"):
        train_tokenizer(TRAIN, vocab_size=4)


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_vocab_size_smaller_than_alphabet(kind: str) -> None:
    with pytest.raises(ConfigError, match="--vocab-size 20 is too small"):
        train_tokenizer(TRAIN, kind=kind, vocab_size=20)


def test_unknown_kind() -> None:
    with pytest.raises(ConfigError, match="--tokenizer-kind.*bpe, unigram, wordpiece"):
        train_tokenizer(TRAIN, kind="spm")


@pytest.mark.parametrize("texts", [[], ["", "  ", "\n"]])
def test_empty_texts(texts: list[str]) -> None:
    with pytest.raises(DataError, match="no text to train the tokenizer on"):
        train_tokenizer(texts)
