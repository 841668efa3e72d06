"""--streaming: data read a slice at a time gives the pairs, ids and runs of loading it whole;
the id cache is found again without reading the stream; offline, one line."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tests.conftest import digit_pairs, write_jsonl
from tformer.cli.commands import app
from tformer.data import parallel, prepare
from tformer.data.sources import load_text_pairs
from tformer.data.streaming import stream_splits
from tformer.errors import DataError

ROOT = Path(__file__).resolve().parents[2]
PAIRS = [(p["source"], p["target"]) for p in digit_pairs(300, seed=3)]


def _layouts(folder: Path) -> dict[str, Path]:
    """The same pairs as JSON Lines, CSV, TSV, Parquet and paired text files."""
    out = {}
    write_jsonl(folder / "jsonl" / "train.jsonl", [{"source": s, "target": t} for s, t in PAIRS])
    out["jsonl"] = folder / "jsonl"
    for kind, delimiter in (("csv", ","), ("tsv", "\t")):
        (folder / kind).mkdir()
        with open(folder / kind / f"train.{kind}", "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, delimiter=delimiter)
            writer.writerow(["source", "target"])
            writer.writerows(PAIRS)
        out[kind] = folder / kind
    (folder / "parquet").mkdir()
    table = pa.table({"source": [s for s, _ in PAIRS], "target": [t for _, t in PAIRS]})
    pq.write_table(table, folder / "parquet" / "train.parquet", row_group_size=50)
    out["parquet"] = folder / "parquet"
    (folder / "paired").mkdir()
    for side, lang in ((0, "en"), (1, "de")):
        text = "".join(pair[side] + "\n" for pair in PAIRS)
        (folder / "paired" / f"train.{lang}").write_text(text, encoding="utf-8")
    out["paired"] = folder / "paired"
    return out


@pytest.mark.parametrize("kind", ["jsonl", "csv", "tsv", "parquet", "paired"])
def test_every_local_format_streams_the_pairs_loading_gives(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel, "SLICE", 64)  # several slices
    folder = _layouts(tmp_path)[kind]
    fields = ("en", "de") if kind == "paired" else ("source", "target")
    streams = stream_splits(str(folder), *fields)
    slices = list(streams["train"])
    assert [len(s) for s in slices] == [64, 64, 64, 64, 44]
    streamed = [pair for chunk in slices for pair in chunk]
    assert streamed == list(load_text_pairs(str(folder), source_field=fields[0],
                                            target_field=fields[1])["train"]) == PAIRS  # fmt: skip


def test_a_streamed_prepared_folder_equals_a_loaded_one(tmp_path: Path) -> None:
    data = _layouts(tmp_path)["jsonl"]
    whole = prepare.prepare(str(data), tmp_path / "whole", vocab_size=60)
    streamed = prepare.prepare(str(data), tmp_path / "streamed", vocab_size=60, streaming=True)
    for name in ("train.source.ids", "train.target.offsets", "tokenizer.json"):
        assert (whole.folder / name).read_bytes() == (streamed.folder / name).read_bytes()
    assert whole.manifest["fingerprint"] == streamed.manifest["fingerprint"]


def test_bad_records_in_a_stream_are_named(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text('{"source": "a", "target": "b"}\n{"source": "c", "target": 7}\n')
    with pytest.raises(DataError, match=r"train.jsonl: line 2: 'target' \(--target-field\) is "
                                        r"not text \(int\)"):  # fmt: skip
        prepare.prepare(str(path), tmp_path / "out", vocab_size=60, streaming=True)
    assert not (tmp_path / "out").exists()
    (tmp_path / "en").mkdir()
    (tmp_path / "en" / "train.en").write_text("a\nb\n")
    (tmp_path / "en" / "train.de").write_text("a\n")
    with pytest.raises(DataError, match="different numbers of lines"):
        list(stream_splits(str(tmp_path / "en"), "en", "de")["train"])


@pytest.mark.slow
def test_train_streams_once_into_the_cache_and_matches_the_loaded_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _layouts(tmp_path)["jsonl"]
    write_jsonl(data / "validation.jsonl", digit_pairs(20, seed=4))
    cache = tmp_path / "cache"
    args = ["train", "--data", str(data), "--preset", "tiny", "--vocab-size", "60",
            "--max-steps", "4", "--max-tokens", "256", "--log-every", "1",
            "--cache-dir", str(cache)]  # fmt: skip
    streamed = CliRunner().invoke(app, [*args, "--streaming", "--out", str(tmp_path / "a")])
    assert streamed.exit_code == 0, streamed.output
    assert len(list(cache.glob("stream-*.json"))) == 1

    def refuse(*args: object) -> object:
        raise AssertionError("the stream was read again")

    with monkeypatch.context() as patched:
        patched.setattr(prepare, "stream_splits", refuse)
        again = CliRunner().invoke(app, [*args, "--streaming", "--out", str(tmp_path / "b")])
        assert again.exit_code == 0, again.output
        resumed = CliRunner().invoke(
            app, ["train", "--resume", str(tmp_path / "a"), "--max-steps", "6",
                  "--cache-dir", str(cache)],
        )  # fmt: skip
        assert resumed.exit_code == 0, resumed.output
    loaded = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "c")])
    assert loaded.exit_code == 0, loaded.output

    def losses(run: str) -> list[float]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["loss"] for line in lines if '"loss"' in line]

    assert losses("a")[:4] == losses("b") == losses("c") and len(losses("a")) == 6
    refused = CliRunner().invoke(app, [*args, "--streaming", "--no-cache",
                                       "--out", str(tmp_path / "d")])  # fmt: skip
    assert refused.exit_code == 2 and "leave out --no-cache" in refused.output


@pytest.mark.slow
def test_a_hub_stream_offline_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "tformer", "train", "--data", "someone/no-such-data",
         "--streaming", "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "c")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot be streamed from the Hugging Face hub" in lines[0]
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()
