"""Tokenisation through datasets.map: the same ids as direct encoding, cached, parallel."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import digit_pairs, write_jsonl
from tformer.cli.commands import app
from tformer.data.store import TokenIds
from tformer.data.tokenized import encode_texts, texts_key
from tformer.data.tokenizer import Tokenizer, train_tokenizer

TEXTS = [f"{p['source']} = {p['target']}" for p in digit_pairs(400, seed=5)]


def rows(ids: TokenIds) -> list[list[int]]:
    return [ids.row(i) for i in range(len(ids))]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer(TEXTS, vocab_size=80)


def test_cached_ids_equal_direct_encoding_and_are_reused(
    tokenizer: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct = tokenizer.encode_batch(TEXTS)
    assert rows(encode_texts(TEXTS, tokenizer, cache_dir=tmp_path)) == direct
    files = list(tmp_path.glob("ids-*.arrow"))
    assert len(files) == 1

    def refuse(self: Tokenizer, texts: list[str]) -> list[list[int]]:
        raise AssertionError("tokenised again instead of reading the cache")

    monkeypatch.setattr(Tokenizer, "encode_batch", refuse)
    assert rows(encode_texts(TEXTS, tokenizer, cache_dir=tmp_path)) == direct


def test_the_cache_key_covers_every_text_and_the_tokenizer(tokenizer: Tokenizer) -> None:
    other = train_tokenizer(TEXTS, kind="wordpiece", vocab_size=80)
    assert other.sha256() != tokenizer.sha256()
    key = texts_key(TEXTS, tokenizer)
    assert texts_key(TEXTS, other) != key
    assert texts_key([*TEXTS[:-1], TEXTS[-1] + "!"], tokenizer) != key
    assert texts_key(["ab", "c"], tokenizer) != texts_key(["a", "bc"], tokenizer)


def test_several_processes_give_the_same_ids(tokenizer: Tokenizer, tmp_path: Path) -> None:
    many = TEXTS * 30  # 12,000 texts: enough for worker processes to be used
    assert rows(encode_texts(many, tokenizer, cache_dir=tmp_path, num_proc=2)) == (
        tokenizer.encode_batch(many)
    )
    assert rows(encode_texts(many, tokenizer)) == tokenizer.encode_batch(many)  # no cache


def test_train_fills_the_cache_and_a_second_run_reads_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "train.jsonl", digit_pairs(200, seed=1))
    write_jsonl(data / "validation.jsonl", digit_pairs(20, seed=2))
    cache = tmp_path / "cache"
    args = ["train", "--data", str(data), "--preset", "tiny", "--vocab-size", "60",
            "--max-steps", "2", "--max-tokens", "256", "--cache-dir", str(cache)]  # fmt: skip
    first = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    cached = sorted(p.name for p in cache.glob("ids-*.arrow"))
    assert len(cached) == 4  # source and target of two splits
    second = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "b")])
    assert second.exit_code == 0, second.output
    assert sorted(p.name for p in cache.glob("ids-*.arrow")) == cached
    losses = [(tmp_path / r / "metrics.jsonl").read_text() for r in ("a", "b")]
    assert '"loss"' in losses[0]
    no_cache = CliRunner().invoke(
        app, [*args[:-2], "--no-cache", "--cache-dir", str(tmp_path / "c"), "--out",
              str(tmp_path / "c-run")],
    )  # fmt: skip
    assert no_cache.exit_code == 0, no_cache.output
    assert not (tmp_path / "c").exists()
