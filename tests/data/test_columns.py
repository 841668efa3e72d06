"""Text pairs read into Arrow columns, not Python lists: the same pairs, read a slice at a
time, and the same one-line errors."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tformer.checkpoint import Tokenizers
from tformer.data.columns import SLICE, TextColumns, side
from tformer.data.sources import _check_utf8, load_text_pairs
from tformer.data.tokenizer import train_tokenizer
from tformer.errors import DataError
from tformer.training.inputs import encode_splits


def test_columns_read_back_as_pairs_in_slices() -> None:
    n = 2 * SLICE + 5
    sources = [f"s{i}" for i in range(n)]
    targets = [f"t{i}" for i in range(n)]
    chunked = pa.chunked_array([sources[:100], sources[100:]])  # as datasets stores them
    columns = TextColumns(chunked, pa.array(targets, type=pa.large_string()))
    pairs = list(zip(sources, targets, strict=True))
    assert len(columns) == n and list(columns) == pairs and columns == pairs
    assert columns[0] == pairs[0] and columns[-1] == pairs[-1] and columns[99:102] == pairs[99:102]
    assert columns[::SLICE] == pairs[::SLICE]
    assert list(side(columns, 1)) == targets and side(columns, 0)[5:7] == sources[5:7]
    with pytest.raises(IndexError):
        columns[n]
    with pytest.raises(ValueError, match="2 sources but 1 targets"):
        TextColumns(pa.array(["a", "b"]), pa.array(["c"]))


def test_paired_files_and_json_lines_load_as_columns(tmp_path: Path) -> None:
    (tmp_path / "train.en").write_text("a b\nc d\n")
    (tmp_path / "train.de").write_text("A B\nC D\n")
    pairs = load_text_pairs(str(tmp_path), source_field="en", target_field="de")["train"]
    assert isinstance(pairs, TextColumns) and list(pairs) == [("a b", "A B"), ("c d", "C D")]
    jsonl = tmp_path / "j" / "train.jsonl"
    jsonl.parent.mkdir()
    jsonl.write_text('{"source": "x", "target": "y"}\n{"source": "", "target": "z"}\n')
    pairs = load_text_pairs(str(jsonl))["train"]
    assert isinstance(pairs, TextColumns) and list(pairs) == [("x", "y"), ("", "z")]


@pytest.mark.parametrize("block", [1, 2, 5, 1 << 20])
def test_invalid_utf8_is_found_block_by_block_with_its_line(tmp_path: Path, block: int) -> None:
    path = tmp_path / "train.en"
    path.write_bytes("één\ntwee\n".encode() + b"dr\xffie\n")
    with pytest.raises(DataError, match=r"train.en: line 3: invalid UTF-8 \(byte 13\)"):
        _check_utf8(path, block)
    path.write_bytes("één\ntwee\ndrie\n".encode())
    _check_utf8(path, block)  # multi-byte letters cut by a block edge are fine
    path.write_bytes(b"")
    with pytest.raises(DataError, match="the file is empty"):
        _check_utf8(path, block)


def test_a_text_column_of_another_type_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"source": ["a", "b"], "target": [1, 2]}), path)
    with pytest.raises(DataError, match="row 1: 'source' and 'target' must be text, got string"):
        load_text_pairs(str(path))


def test_the_training_split_keeps_no_texts() -> None:
    """Only validation and test texts are read after encoding (BLEU, samples), so the train
    split holds no reference to its texts and they can be freed."""
    texts = {
        "train": [("a b c", "c b a")] * 20,
        "validation": [("b c", "c b"), ("a", "a")],
    }
    tok = train_tokenizer([t for pair in texts["train"] for t in pair], vocab_size=40)
    splits = encode_splits(texts, Tokenizers(tok, tok), 16, None, strict=False)
    assert len(splits["train"].pairs) == 20 and len(splits["train"].texts) == 0
    assert list(splits["validation"].texts) == texts["validation"]
