"""The word cache gives exactly the ids the tokenizer gives each text whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizers
from tokenizers import models, pre_tokenizers, trainers

from tformer.config import SPECIAL_TOKENS
from tformer.data.tokenizer import TOKENIZER_KINDS, Tokenizer, train_tokenizer
from tformer.data.wordcache import WordCache

ROOT = Path(__file__).resolve().parents[2]

# Texts where splitting at spaces could go wrong: spaces at the ends or doubled, the "▁" marker,
# special tokens inside and between words, characters NFKC turns into spaces or digits,
# combining marks at a word's start, ligatures, other whitespace, scripts without spaces.
TRICKY = [
    "",
    " ",
    "   ",
    "plain words only",
    " leading space",
    "trailing space ",
    "double  space and   triple",
    "a\u00a0no-break space, and\u00a0 one before a space",
    "\u00a0starts with a no-break space",
    "ideographic\u3000space and \u3000 at a word start",
    "the marker ▁ alone and in▁side and ▁before",
    "<eos> alone, in<eos>side, <unk>, <pad><bos> and <eo s>",
    "\u0301combining acute at the start, a\u0301 composed, u\u0308ber",
    "\u00b4acute accent that NFKC turns into a space plus a mark",
    "the \ufb01ne ligature and full-width ＡＢＣ １２３",
    "digits 2025-03-06 and 3.14159 and ٣٤٥ arabic-indic",
    "tab\tinside and new\nline inside",
    "emoji 🙂 and 👩‍👩‍👧 family",
    "日本語の文には空白がない",
    "Ein Hund läuft über die Straße.",
    "x" * 300 + " a very long word",
]


def _corpus() -> list[str]:
    lines = []
    for name in ("train.jsonl",):
        for line in (ROOT / "data" / name).read_text(encoding="utf-8").splitlines()[:400]:
            record = json.loads(line)
            lines += [record["source"], record["target"]]
    return lines + TRICKY


@pytest.fixture(scope="module", params=TOKENIZER_KINDS)
def tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    plain = [text for text in _corpus() if "<" not in text]
    return train_tokenizer(plain * 3, kind=request.param, vocab_size=300)


def _whole(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [tokenizer.encode(text) for text in texts]


def test_packed_and_batch_ids_equal_encoding_each_text_whole(tokenizer: Tokenizer) -> None:
    texts = _corpus()
    packed = tokenizer.encode_packed(texts)
    assert [packed.row(i) for i in range(len(texts))] == _whole(tokenizer, texts)
    assert tokenizer.encode_batch(texts) == _whole(tokenizer, texts)
    words = tokenizer._words
    assert words is not None and words.enabled  # the cache did the work, and agreed
    assert words.words["words"] is not None  # an ordinary word is cached
    for uncacheable in ("", "in▁side", "in<eos>side,", "\u00a0starts"):
        assert words.words[uncacheable] is None


def test_a_full_cache_starts_again_and_still_gives_the_same_ids(tokenizer: Tokenizer) -> None:
    texts = _corpus()
    cache = WordCache(tokenizer.inner, SPECIAL_TOKENS, capacity=30)
    for start in range(0, len(texts), 4):  # the cache holds at least one call's words
        chunk = texts[start : start + 4]
        values, lengths = cache.encode(chunk)
        distinct = len({w for text in chunk for w in text.split(" ")})
        assert len(cache.words) <= max(30, distinct)
        expected = _whole(tokenizer, chunk)
        assert lengths.tolist() == [len(ids) for ids in expected]
        assert values.tolist() == [i for ids in expected for i in ids]
    assert cache.enabled


def _merging_across_spaces() -> tokenizers.Tokenizer:
    """A BPE whose pieces span spaces (no split at them): words are not independent."""
    inner = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always", split=False)
    trainer = trainers.BpeTrainer(vocab_size=60, special_tokens=list(SPECIAL_TOKENS))
    inner.train_from_iterator(["ab cd"] * 50 + ["cd ab"] * 50, trainer=trainer)
    return inner


def test_a_tokenizer_whose_words_interact_is_caught_and_encoded_whole() -> None:
    inner = _merging_across_spaces()
    texts = ["ab cd"] * 3 + ["cd ab"]
    expected = [inner.encode(t, add_special_tokens=False).ids for t in texts]
    cache = WordCache(inner, SPECIAL_TOKENS, enabled=True)
    values, lengths = cache.encode(texts)
    assert not cache.enabled  # the sampled comparison found the difference
    assert lengths.tolist() == [len(ids) for ids in expected]
    assert values.tolist() == [i for ids in expected for i in ids]
    # Word by word would have been wrong, so the check was needed.
    assert inner.encode("ab", add_special_tokens=False).ids != expected[0][: len(expected[0])]


def test_a_tokenizer_made_elsewhere_never_uses_the_cache(tmp_path: Path) -> None:
    inner = _merging_across_spaces()
    path = tmp_path / "tokenizer.json"
    inner.save(str(path))
    tokenizer = Tokenizer.load(path)
    texts = ["ab cd", "cd ab", "ab  cd "]
    assert tokenizer.encode_batch(texts) == _whole(tokenizer, texts)
    assert tokenizer._words is not None and not tokenizer._words.enabled
    assert tokenizer._words.words == {}
