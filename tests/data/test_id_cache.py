"""The id cache: train prepares the data once, keyed by texts, tokenizer and max_len, and maps
it afterwards; worker processes give the same ids as one process."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import digit_pairs, write_jsonl
from tformer.cli.commands import app
from tformer.data import parallel
from tformer.data.parallel import encoded_slices
from tformer.data.prepare import TextSource, cached_prepared
from tformer.data.prepared_write import PrepareOptions
from tformer.data.tokenizer import Tokenizer, train_tokenizer

PAIRS = [(p["source"], p["target"]) for p in digit_pairs(400, seed=5)]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer([t for pair in PAIRS for t in pair], vocab_size=80)


def _ids(slices: object) -> list[tuple[list[int], list[int]]]:
    out = []
    for _, _, (src, tgt) in slices:  # type: ignore[attr-defined]
        out += [(src.row(i), tgt.row(i)) for i in range(len(src))]
    return out


def test_worker_processes_give_the_ids_of_one_process_in_order(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel, "SLICE", 37)  # eleven slices, several in flight
    expected = [(tokenizer.encode(s), tokenizer.encode(t)) for s, t in PAIRS]
    assert _ids(encoded_slices(PAIRS, (tokenizer, tokenizer))) == expected
    assert _ids(encoded_slices(PAIRS, (tokenizer, tokenizer), num_proc=2)) == expected
    starts = [start for start, _, _ in encoded_slices(PAIRS, (tokenizer, tokenizer), 2)]
    assert starts == list(range(0, len(PAIRS), 37))


def test_the_key_covers_every_text_the_tokenizer_and_max_len(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    def folder(pairs: list[tuple[str, str]], tok: Tokenizer, max_len: int) -> Path:
        prepared = cached_prepared(
            tmp_path, {"train": pairs}, (tok, tok), TextSource(None), PrepareOptions(max_len)
        )
        return prepared.folder

    first = folder(PAIRS, tokenizer, 64)
    assert folder(PAIRS, tokenizer, 64) == first  # found again
    other = train_tokenizer([t for pair in PAIRS for t in pair], kind="wordpiece", vocab_size=80)
    changed = [*PAIRS[:-1], (PAIRS[-1][0], PAIRS[-1][1] + "!")]
    assert len({first, folder(changed, tokenizer, 64), folder(PAIRS, other, 64),
                folder(PAIRS, tokenizer, 32)}) == 4  # fmt: skip
    # A damaged entry (a file cut short) is made again, not read.
    (first / "train.source.ids").write_bytes(b"")
    again = cached_prepared(
        tmp_path, {"train": PAIRS}, (tokenizer, tokenizer), TextSource(None), PrepareOptions(64)
    )
    assert again.folder == first and (first / "train.source.ids").stat().st_size > 0


def test_train_fills_the_cache_and_a_second_run_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    write_jsonl(data / "train.jsonl", digit_pairs(200, seed=1))
    write_jsonl(data / "validation.jsonl", digit_pairs(20, seed=2))
    cache = tmp_path / "cache"
    args = ["train", "--data", str(data), "--preset", "tiny", "--vocab-size", "60",
            "--max-steps", "4", "--max-tokens", "256", "--log-every", "1"]  # fmt: skip
    first = CliRunner().invoke(
        app, [*args, "--cache-dir", str(cache), "--out", str(tmp_path / "a")]
    )
    assert first.exit_code == 0, first.output
    cached = sorted(p.name for p in cache.iterdir())
    assert len(cached) == 1 and cached[0].startswith("prepared-")

    def refuse(self: Tokenizer, texts: object) -> object:
        raise AssertionError("tokenised again instead of reading the cache")

    with monkeypatch.context() as patched:
        patched.setattr(Tokenizer, "encode_packed", refuse)
        second = CliRunner().invoke(
            app, [*args, "--cache-dir", str(cache), "--out", str(tmp_path / "b")]
        )
    assert second.exit_code == 0, second.output
    assert sorted(p.name for p in cache.iterdir()) == cached
    no_cache = CliRunner().invoke(app, [*args, "--no-cache", "--out", str(tmp_path / "c")])
    assert no_cache.exit_code == 0, no_cache.output

    def losses(run: str) -> list[str]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [line.split('"loss": ')[1].split(",")[0] for line in lines if '"loss"' in line]

    assert losses("a") == losses("b") == losses("c") and len(losses("a")) == 4
