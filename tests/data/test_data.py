"""Loading real files through HF datasets, teacher-forcing batches and token-budget bucketing."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import digit_pairs, write_jsonl
from tformer.config import BOS_ID, EOS_ID, PAD_ID
from tformer.data.batching import BatchPlan, bucket_batches, collate, pad, shift_right
from tformer.data.pairs import encode_pairs
from tformer.data.sources import load_text_pairs
from tformer.data.tokenizer import train_tokenizer
from tformer.errors import DataError


def test_shift_right_feeds_bos_plus_target_and_predicts_target_plus_eos() -> None:
    dec_in, labels = shift_right([7, 8, 9])
    assert dec_in == [BOS_ID, 7, 8, 9]
    assert labels == [7, 8, 9, EOS_ID]
    assert dec_in[1:] == labels[:-1]  # labels are the input shifted left by one


def test_collate_pads_and_aligns() -> None:
    batch = collate([([5, 6, 7], [8]), ([9], [10, 11, 12])])
    assert batch.src.tolist() == [[5, 6, 7], [9, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 8, PAD_ID, PAD_ID], [BOS_ID, 10, 11, 12]]
    assert batch.tgt_out.tolist() == [[8, EOS_ID, PAD_ID, PAD_ID], [10, 11, 12, EOS_ID]]
    assert batch.n_target_tokens == 6


@pytest.mark.parametrize("kind", ["lists", "int32 arrays", "int64 arrays"])
def test_pad_puts_each_row_left_and_pads_the_rest(kind: str) -> None:
    rows: list = [[5, 6, 7], [], [9], [1, 2, 3, 4, 70_000]]
    if kind != "lists":
        rows = [np.array(r, dtype=np.int32 if kind == "int32 arrays" else np.int64) for r in rows]
    padded = pad(rows, value=-1)
    want = torch.full((4, 5), -1, dtype=torch.long)
    for i, row in enumerate(rows):  # one row at a time: the plain reading of "right-pad"
        want[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    assert padded.dtype == torch.long and torch.equal(padded, want)
    assert pad([[3, 4]]).tolist() == [[3, 4]] and pad([[], []]).shape == (2, 0)


def test_bucketing_respects_the_budget_and_covers_every_example() -> None:
    lengths = [((i * 7) % 23 + 1, (i * 5) % 19 + 1) for i in range(500)]
    batches = [b.tolist() for b in bucket_batches(lengths, max_tokens=200, seed=3)]
    seen = sorted(i for b in batches for i in b)
    assert seen == list(range(500))
    for b in batches:
        longest = max(max(lengths[i][0], lengths[i][1] + 1) for i in b)
        assert len(b) * longest <= 200 or len(b) == 1
    # Same seed, same batches; another seed, another order.
    assert batches == [b.tolist() for b in bucket_batches(lengths, 200, seed=3)]
    assert batches != [b.tolist() for b in bucket_batches(lengths, 200, seed=4)]


def test_bucketing_keeps_padding_small() -> None:
    pairs = [([4] * ((i % 30) + 1), [5] * ((i * 7) % 30 + 1)) for i in range(2000)]
    plan = BatchPlan(pairs, max_tokens=1024, seed=0)
    assert plan.padding_share() < 0.35
    assert [b.tolist() for b in plan.epoch(1)] != [b.tolist() for b in plan.epoch(0)]


def test_load_folder_and_single_file(toy_data: Path) -> None:
    splits = load_text_pairs(str(toy_data))
    assert set(splits) == {"train", "validation", "test"}
    assert len(splits["train"]) == 3000
    assert splits["train"][0] == (
        digit_pairs(1, seed=1)[0]["source"],
        digit_pairs(1, seed=1)[0]["target"],
    )
    single = load_text_pairs(str(toy_data / "test.jsonl"))
    assert list(single) == ["train"] and len(single["train"]) == 200


def test_bundled_data_keeps_iso_dates_as_text() -> None:
    splits = load_text_pairs(None)
    assert len(splits["train"]) == 20000
    src, tgt = splits["test"][0]
    assert isinstance(tgt, str) and len(tgt) == 10 and tgt[4] == "-"


def test_csv_tsv_parquet_load_the_same_pairs(tmp_path: Path) -> None:
    records = [{"en": r["source"], "de": r["target"]} for r in digit_pairs(50, seed=9)]
    for suffix, delimiter in ((".csv", ","), (".tsv", "\t")):
        with open(tmp_path / f"train{suffix}", "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, ["en", "de"], delimiter=delimiter)
            writer.writeheader()
            writer.writerows(records)
    import datasets

    datasets.Dataset.from_list(records).to_parquet(str(tmp_path / "train.parquet"))
    expected = [(r["en"], r["de"]) for r in records]
    for suffix in (".csv", ".tsv", ".parquet"):
        got = load_text_pairs(
            str(tmp_path / f"train{suffix}"), source_field="en", target_field="de"
        )["train"]
        assert got == expected, suffix


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty"),
        ('{"source": "a", "target": "b"}\n{"source": "a" "target": "b"}\n', "line 2"),
        ('{"src": "a", "target": "b"}\n', "'source' (--source-field)"),
    ],
)
def test_bad_files_raise_clear_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_text_pairs(str(path))


def test_invalid_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"source": "a", "target": "b"}\n{"source": "\xff", "target": "b"}\n')
    with pytest.raises(DataError, match="line 2: invalid UTF-8"):
        load_text_pairs(str(path))


def test_missing_paths_and_folders_without_train(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_text_pairs(str(tmp_path / "nope.jsonl"))
    write_jsonl(tmp_path / "test.jsonl", digit_pairs(3, seed=0))
    with pytest.raises(DataError, match="no train file"):
        load_text_pairs(str(tmp_path))


def test_encode_pairs_drops_what_does_not_fit() -> None:
    texts = [("1 2 3", "one two three"), ("1 2 3 4 5 6 7 8 9", "x"), ("", "y")]
    tok = train_tokenizer([t for pair in texts for t in pair] * 3, vocab_size=60)
    split = encode_pairs(texts, tok, tok, max_len=8)
    assert split.dropped == 2
    assert list(split.texts) == [texts[0]]
    assert tok.decode(split.pairs[0][1]) == "one two three"


SHARED_MULTI30K = Path(__file__).resolve().parents[3] / "shared" / "data" / "multi30k"


def _paired_folder(tmp_path: Path, records: list[dict[str, str]]) -> Path:
    folder = tmp_path / "paired"
    folder.mkdir()
    for split, part in (("train", records[:30]), ("val", records[30:40]),
                        ("test2016", records[40:])):
        (folder / f"{split}.en").write_text("".join(r["source"] + "\n" for r in part))
        (folder / f"{split}.de").write_text("".join(r["target"] + "\n" for r in part))
    return folder


def test_every_data_shape_loads_the_same_pairs(tmp_path: Path) -> None:
    records = digit_pairs(50, seed=4)
    expected = [(r["source"], r["target"]) for r in records]
    paired = load_text_pairs(str(_paired_folder(tmp_path, records)), source_field="en",
                             target_field="de")
    assert [*paired["train"], *paired["validation"], *paired["test"]] == expected
    translation = write_jsonl(tmp_path / "tr" / "train.jsonl",
                              [{"translation": {"en": s, "de": t}} for s, t in expected])
    assert load_text_pairs(str(translation), source_field="en",
                           target_field="de")["train"] == expected
    plain = write_jsonl(tmp_path / "plain.jsonl", records)
    assert load_text_pairs(str(plain))["train"] == expected


def test_paired_files_with_different_line_counts_are_refused(tmp_path: Path) -> None:
    folder = _paired_folder(tmp_path, digit_pairs(50, seed=4))
    with open(folder / "train.de", "a") as handle:
        handle.write("one more line\n")
    with pytest.raises(DataError, match="has 30 lines but .* has 31"):
        load_text_pairs(str(folder), source_field="en", target_field="de")


def test_translation_records_missing_a_language(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"translation": {"en": "a", "fr": "b"}}])
    with pytest.raises(DataError, match="no 'en' / 'de'"):
        load_text_pairs(str(path), source_field="en", target_field="de")


@pytest.mark.skipif(not SHARED_MULTI30K.is_dir(),
                    reason="../shared/data/multi30k is not present beside the project")
def test_multi30k_folder_loads_with_languages() -> None:
    splits = load_text_pairs(str(SHARED_MULTI30K), source_field="en", target_field="de")
    assert {k: len(v) for k, v in splits.items()} == {"train": 29000, "validation": 1014,
                                                      "test": 1000}
    assert splits["test"][0][0].startswith("A man")


@pytest.mark.slow
def test_hub_name_offline_gives_a_clear_error(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run(
        [sys.executable, "-m", "tformer", "train", "--data", "someone/no-such-set:cfg@v1",
         "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 3
    assert proc.stderr.startswith("error: --data someone/no-such-set:cfg@v1: not a local file")
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_json_lines_are_read_without_importing_hf_datasets(tmp_path: Path) -> None:
    """Arrow reads JSON Lines itself: a run on local files does not pay for importing HF
    datasets and the pandas it loads (about a second a process)."""
    import subprocess
    import sys

    write_jsonl(tmp_path / "plain" / "train.jsonl", digit_pairs(20, seed=5))
    write_jsonl(tmp_path / "tr" / "train.jsonl",
                [{"translation": {"en": "a b", "de": "c"}}, {"translation": {"en": "d", "de": ""}}])
    code = (
        "import sys; from tformer.data.sources import load_text_pairs\n"
        f"plain = load_text_pairs({str(tmp_path / 'plain')!r})['train']\n"
        f"tr = load_text_pairs({str(tmp_path / 'tr')!r}, source_field='en', target_field='de')\n"
        "print(len(plain), list(tr['train']), 'datasets' in sys.modules, 'pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "20 [('a b', 'c'), ('d', '')] False False"


def test_encode_pairs_strict_names_the_first_pair_that_does_not_fit() -> None:
    texts = [("1 2", "one two"), ("1 2 3 4 5 6 7 8 9", "x"), ("3", "")]
    tok = train_tokenizer([t for pair in texts for t in pair] * 3, vocab_size=60)
    with pytest.raises(DataError, match=r"pairs.jsonl: pair 2: the source is \d+ tokens, over "
                                        r"--max-len 8 \(--strict\)"):
        encode_pairs(texts, tok, tok, max_len=8, strict=True, where="pairs.jsonl")
    with pytest.raises(DataError, match="pair 2: the target is empty"):
        encode_pairs([texts[0], texts[2]], tok, tok, max_len=8, strict=True)


def test_csv_and_tsv_keep_every_cell_as_written(tmp_path: Path) -> None:
    rows = [("NA", "null"), ("007", "2025-03-06"), ("a, \"quoted\"\nline", "1.50"), ("", "x")]
    for suffix, delimiter in ((".csv", ","), (".tsv", "\t")):
        path = tmp_path / f"train{suffix}"
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, delimiter=delimiter)
            writer.writerow(["source", "target"])
            writer.writerows(rows)
        assert load_text_pairs(str(path))["train"] == rows, suffix


def test_invalid_utf8_in_csv_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    path.write_bytes(b"source,target\n1,one\n2,tw\xc3\x28o\n")
    with pytest.raises(DataError, match="train.csv: line 3: invalid UTF-8"):
        load_text_pairs(str(path))
    path.write_bytes(b"source,target\n1\n")
    with pytest.raises(DataError, match=r"\(line 2\): no value for 'target'"):
        load_text_pairs(str(path))
