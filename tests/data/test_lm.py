"""Plain text for the language-model families: every source form read through its real loader,
the demo text's generator, and one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tformer.data.dates_text import generate_text_splits, write_text_splits
from tformer.data.lm import bundled_text_dir, load_texts
from tformer.errors import DataError


def test_a_txt_folder_gives_one_document_a_line(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text("first line\n\nsecond line\n", encoding="utf-8")
    (tmp_path / "test.txt").write_text("held out\n", encoding="utf-8")
    assert load_texts(str(tmp_path)) == {"train": ["first line", "second line"],
                                         "test": ["held out"]}
    assert load_texts(str(tmp_path / "train.txt")) == {"train": ["first line", "second line"]}


def test_jsonl_csv_and_parquet_are_read_from_the_text_field(tmp_path: Path) -> None:
    rows = [{"body": "one text", "id": 1}, {"body": "another, with a comma", "id": 2}]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_texts(str(tmp_path / "a.jsonl"), "body") == {"train": [r["body"] for r in rows]}
    (tmp_path / "b.csv").write_text('body,id\none text,1\n"another, with a comma",2\n')
    assert load_texts(str(tmp_path / "b.csv"), "body")["train"] == [r["body"] for r in rows]
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "c.parquet"))
    assert load_texts(str(tmp_path / "c.parquet"), "body")["train"] == [r["body"] for r in rows]
    with pytest.raises(DataError, match=r"no column 'text' \(--text-field\)"):
        load_texts(str(tmp_path / "a.jsonl"))


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"train.txt": ""}, "the file is empty"),
        ({"train.txt": "\n  \n"}, "the file is empty"),
        ({"train.txt": b"ok\n\xff\xfe\n"}, "line 2: invalid UTF-8"),
        ({"notes.txt": "text\n"}, "no train.txt"),
    ],
)
def test_bad_text_is_refused_in_one_line(tmp_path: Path, files: dict, message: str) -> None:
    for name, content in files.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DataError, match=message):
        load_texts(str(tmp_path))


def test_the_demo_text_is_what_its_generator_writes(tmp_path: Path) -> None:
    bundled = bundled_text_dir()
    write_text_splits(tmp_path)
    for split in ("train", "validation", "test"):
        assert (tmp_path / f"{split}.txt").read_bytes() == (bundled / f"{split}.txt").read_bytes()
    splits = generate_text_splits()
    dates = [{line.split(" = ")[1] for line in lines} for lines in splits.values()]
    assert sum(map(len, dates)) == len(set().union(*dates))  # no date in two splits
    line = splits["train"][0]
    day, month, year = line.split(" = ")[0].split(" ")
    assert line.split(" = ")[1] == f"{year}-{_MONTHS.index(month) + 1:02d}-{int(day):02d}"


_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]
