"""``tformer filter``: the folder it writes is a corpus the project's loader reads (the kept
pairs, the other splits as they were) with its report; bad options, a language model and an
occupied --out are refused in one line with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.analysis.test_measures import language_model
from tests.conftest import digit_pairs, write_jsonl
from tests.test_hostile_files import TINY, cli, refused, snapshot
from tformer.cli import filter_corpus
from tformer.data.sources import load_text_pairs

TRAIN_PAIRS = 60


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A corpus (train, validation, test) and a tiny model trained two steps on it: the
    command's files need weights, not skill."""
    root = tmp_path_factory.mktemp("filter")
    write_jsonl(root / "data" / "train.jsonl", digit_pairs(TRAIN_PAIRS, seed=7))
    write_jsonl(root / "data" / "validation.jsonl", digit_pairs(6, seed=8))
    write_jsonl(root / "data" / "test.jsonl", digit_pairs(5, seed=9))
    result = cli("train", "--data", root / "data", "--out", root / "run", *TINY,
                 "--max-steps", "2")  # fmt: skip
    assert result.exit_code == 0, result.output
    return root


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_filter_writes_a_corpus_train_reads_and_its_report(world: Path, tmp_path: Path) -> None:
    out = tmp_path / "clean"
    result = cli("filter", world / "run", "--data", world / "data", "--out", out,
                 "--reverse", world / "run", "--keep", "0.75", "--worst", "4")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "kept 45 of 60 pairs" in " ".join(result.stdout.split())
    loaded = load_text_pairs(str(out))  # what `tformer train --data OUT` reads
    given = load_text_pairs(str(world / "data"))
    assert set(loaded) == {"train", "validation", "test"}
    for split in ("validation", "test"):
        assert list(loaded[split]) == list(given[split])
    scores = _lines(out / "scores.jsonl")
    assert [s["index"] for s in scores] == list(range(TRAIN_PAIRS))
    assert {"score", "h_a", "h_b", "exp_neg_score", "kept"} <= set(scores[0])
    kept = [given["train"][i] for i, s in enumerate(scores) if s["kept"]]
    assert list(loaded["train"]) == kept and len(kept) == 45
    cut = max(float(s["score"]) for s in scores if s["kept"])  # type: ignore[arg-type]
    assert all(float(s["score"]) >= cut for s in scores if not s["kept"])  # type: ignore[arg-type]
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "dual conditional cross-entropy" in report and "| median |" in report
    assert "## The 4 worst pairs" in report and "--keep 0.75" in report
    assert (out / "report.png").read_bytes().startswith(b"\x89PNG")
    marker = json.loads((out / "tformer-filter.json").read_text())
    assert marker["kept"] == 45 and "train.jsonl" in marker["files"]


def test_contrast_scores_by_the_gain_and_says_so(world: Path, tmp_path: Path) -> None:
    out = tmp_path / "contrast"
    result = cli("filter", world / "run", "--data", world / "data", "--out", out,
                 "--reverse", world / "run", "--contrast", "--keep", "0.5")  # fmt: skip
    assert result.exit_code == 0, result.output
    scores = _lines(out / "scores.jsonl")
    for s in scores:
        gain = float(s["h_a"]) - float(s["h_a_other"])  # type: ignore[arg-type]
        gain += float(s["h_b"]) - float(s["h_b_other"])  # type: ignore[arg-type]
        assert float(s["score"]) == pytest.approx(gain, abs=1e-6)  # type: ignore[arg-type]
        assert s["exp_neg_score"] is None  # a gain is no cross-entropy
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "the source's gain (--contrast)" in report and "exp(-score)" not in report
    assert "| H_A, another source | H_B, another target |" in report
    assert json.loads((out / "tformer-filter.json").read_text())["contrast"] is True


def test_threshold_keeps_exactly_the_pairs_scored_under_it(world: Path, tmp_path: Path) -> None:
    first = tmp_path / "first"
    assert cli("filter", world / "run", "--data", world / "data", "--out", first,
               "--keep", "1").exit_code == 0  # fmt: skip
    scores = [float(s["score"]) for s in _lines(first / "scores.jsonl")]  # type: ignore[arg-type]
    threshold = sorted(scores)[20]
    out = tmp_path / "under"
    result = cli("filter", world / "run", "--data", world / "data", "--out", out,
                 "--threshold", str(threshold))  # fmt: skip
    assert result.exit_code == 0, result.output
    want = [p for p, s in zip(load_text_pairs(str(world / "data"))["train"], scores,
                              strict=True) if s <= threshold]  # fmt: skip
    assert list(load_text_pairs(str(out))["train"]) == want
    # again over the same folder: an earlier filtering is replaced only with --overwrite
    again = ["filter", world / "run", "--data", world / "data", "--out", out, "--keep", "0.5"]
    before = snapshot(tmp_path)
    refused(cli(*again), 2, str(out), "--overwrite")
    assert snapshot(tmp_path) == before
    assert cli(*again, "--overwrite").exit_code == 0
    assert len(load_text_pairs(str(out))["train"]) == TRAIN_PAIRS // 2


def test_copies_are_dropped_and_reported_unless_keep_copies(world: Path, tmp_path: Path) -> None:
    pairs = digit_pairs(TRAIN_PAIRS, seed=7)
    for i in (3, 10, 11):  # untranslated: the target is the source
        pairs[i] = {"source": pairs[i]["source"], "target": pairs[i]["source"] + " ."}
    write_jsonl(tmp_path / "data" / "train.jsonl", pairs)
    for split in ("validation", "test"):
        (tmp_path / "data" / f"{split}.jsonl").write_text(
            (world / "data" / f"{split}.jsonl").read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp_path / "no-copies"
    result = cli("filter", world / "run", "--data", tmp_path / "data", "--out", out,
                 "--keep", "1")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "kept 57 of 60 pairs of train (3 copies dropped)" in " ".join(result.stdout.split())
    scores = _lines(out / "scores.jsonl")
    assert [s["index"] for s in scores if s["copy"]] == [3, 10, 11]
    assert [s["index"] for s in scores if not s["kept"]] == [3, 10, 11]
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "Copies (the target is the source, case and punctuation aside): 3, never kept" in report
    everything = tmp_path / "with-copies"
    result = cli("filter", world / "run", "--data", tmp_path / "data", "--out", everything,
                 "--keep", "1", "--keep-copies")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(load_text_pairs(str(everything))["train"]) == TRAIN_PAIRS
    marker = json.loads((everything / "tformer-filter.json").read_text())
    assert marker["rule"].endswith("with --keep-copies")


@pytest.mark.parametrize(
    ("args", "code", "part"),
    [
        ([], 2, "exactly one of --keep"),
        (["--keep", "0.5", "--threshold", "2"], 2, "exactly one of --keep"),
        (["--keep", "0"], 2, "--keep 0 must be"),
        (["--keep", "2"], 2, "--keep 2 must be"),
        (["--threshold", "nan"], 2, "--threshold nan"),
        (["--keep", "0.5", "--worst", "0"], 2, "--worst 0"),
        (["--keep", "0.5", "--split", "dev"], 3, "--split dev: not in --data"),
        (["--threshold", "0.0001"], 2, "keeps no pair"),
    ],
)
def test_bad_options_are_refused_in_one_line(
    world: Path, tmp_path: Path, args: list[str], code: int, part: str
) -> None:
    before = snapshot(tmp_path)
    result = cli("filter", world / "run", "--data", world / "data", "--out", tmp_path / "o",
                 *args)  # fmt: skip
    refused(result, code, part)
    assert snapshot(tmp_path) == before


def test_an_occupied_out_is_refused(world: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("years of work\n")
    before = snapshot(tmp_path)
    for extra in ([], ["--overwrite"]):
        result = cli("filter", world / "run", "--data", world / "data", "--out", mine,
                     "--keep", "0.5", *extra)  # fmt: skip
        refused(result, 2, str(mine))
    assert snapshot(tmp_path) == before


def test_a_language_model_is_refused_as_either_model(world: Path, tmp_path: Path) -> None:
    lm = language_model("decoder-only", tmp_path / "lm").path
    for args in ([lm], [world / "run", "--reverse", lm]):
        result = cli("filter", *args, "--data", world / "data", "--out", tmp_path / "o",
                     "--keep", "0.5")  # fmt: skip
        refused(result, 2, "works on encoder-decoder models", str(lm), "decoder-only")
    assert not (tmp_path / "o").exists()


def test_a_long_corpus_says_its_progress(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filter_corpus, "PROGRESS_PAIRS", 10)
    result = cli("filter", world / "run", "--data", world / "data", "--out", tmp_path / "o",
                 "--keep", "0.5")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"forward model: {TRAIN_PAIRS} / {TRAIN_PAIRS} pairs scored" in result.stderr
