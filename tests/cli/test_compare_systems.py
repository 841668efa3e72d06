"""`tformer compare-systems`: two systems' outputs of one test set, from hypothesis files or
`tformer evaluate` card folders; the table, --json, and refusals in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.analysis.test_significance import BETTER, REFS, WORSE, write_lines
from tformer.cli.commands import app
from tformer.training.reporting import TrainResult

runner = CliRunner()


def invoke(*args: str | Path) -> Any:
    return runner.invoke(app, ["compare-systems", *map(str, args)], catch_exceptions=False)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "ref": write_lines(tmp_path / "ref.txt", REFS),
        "a": write_lines(tmp_path / "a.txt", WORSE),
        "b": write_lines(tmp_path / "b.txt", BETTER),
    }


def test_the_table_shows_scores_difference_p_and_the_verdict(files: dict[str, Path]) -> None:
    result = invoke(files["a"], files["b"], "-r", files["ref"], "--n-samples", "200")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "paired bootstrap resampling, 200 samples, seed 12345, 200 lines" in out
    for row in ("BLEU", "chrF2"):
        line = next(x for x in out.splitlines() if x.startswith(f"│ {row} "))
        assert " +" in line and " *" in line  # B - A > 0, marked significant
    assert "BLEU signature: nrefs:1|bs:200|seed:12345|case:mixed" in out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("at p < 0.05, BLEU: B is significantly better than A (p = ")


def test_json_is_the_library_result(files: dict[str, Path]) -> None:
    result = invoke(files["a"], files["b"], "-r", files["ref"], "--paired-ar",
                    "--n-samples", "300", "--seed", "7", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["test"], doc["n_samples"], doc["seed"], doc["lines"]) == ("paired-ar", 300, 7, 200)
    assert doc["system_a"] == str(files["a"]) and doc["references"] == str(files["ref"])
    bleu = doc["metrics"][0]
    assert bleu["metric"] == "BLEU" and "ar:300" in bleu["signature"]
    assert bleu["difference"] > 0 and bleu["p_value"] < 0.05 and bleu["significant"] is True
    assert bleu["a"]["ci_low"] < bleu["a"]["score"] < bleu["a"]["ci_high"]


def test_identical_systems_are_not_significant(files: dict[str, Path]) -> None:
    result = invoke(files["a"], files["a"], "-r", files["ref"], "--json", "--n-samples", "100")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["identical"] is True
    assert all(m["difference"] == 0 and m["p_value"] == 1.0 for m in doc["metrics"])


def refused(*args: str | Path, code: int, message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert "Traceback" not in result.output


def test_refusals_are_one_line(files: dict[str, Path], tmp_path: Path) -> None:
    a, b, ref = files["a"], files["b"], files["ref"]
    short = write_lines(tmp_path / "short.txt", BETTER[:150])
    refused(a, short, "-r", ref, code=3, message=f"{short}: 150 lines, but {a}: 200 lines")
    refused(a, b, "-r", short, code=3, message=f"{a}: 200 lines, but {short}: 150 lines")
    refused(tmp_path / "no.txt", b, "-r", ref, code=3, message=f"{tmp_path / 'no.txt'}: missing")
    (tmp_path / "empty.txt").write_bytes(b"")
    refused(tmp_path / "empty.txt", b, "-r", ref, code=3, message="empty.txt: is empty")
    (tmp_path / "latin1.txt").write_bytes("ok\ncafé\n".encode("latin-1"))
    refused(tmp_path / "latin1.txt", b, "-r", ref, code=3,
            message="latin1.txt: line 2: not UTF-8 text")  # fmt: skip
    refused(a, b, code=2, message="give --references FILE")
    refused(a, b, "-r", ref, "--n-samples", "100001", code=2,
            message="--n-samples 100001 is out of range; use 100 to 100,000")  # fmt: skip
    refused(a, b, "-r", ref, "--n-samples", "10", code=2, message="--n-samples 10 is out")
    refused(a, b, "-r", ref, "--seed", "0", code=2, message="--seed 0 is out of range")
    refused(a, b, "-r", ref, "--paired-bs", "--paired-ar", code=2, message="not both")
    refused(tmp_path, b, "-r", ref, code=3, message=f"{tmp_path / 'result.json'}: missing")
    refused("/dev/zero", b, "-r", ref, code=3, message="/dev/zero: is a device")


# -- two `tformer evaluate` cards -----------------------------------------------------------


def evaluate(run: Path, data: Path, split: str, out: Path, *decoding: str) -> Path:
    result = runner.invoke(app, ["evaluate", str(run), "--data", str(data), "--split", split,
                                 "--limit", "40", "--out", str(out), *decoding])  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def cards(
    trained: TrainResult, toy_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Greedy and sampled decodes of the toy test split, a card of its validation split, and
    a card of a copy of the data that is changed afterwards."""
    tmp = tmp_path_factory.mktemp("cards")
    run = trained.run_dir
    copied = tmp / "data"
    shutil.copytree(toy_data, copied)
    found = {
        "greedy": evaluate(run, toy_data, "test", tmp / "greedy"),
        "sampled": evaluate(run, toy_data, "test", tmp / "sampled",
                            "--temperature", "2", "--seed", "3"),  # fmt: skip
        "validation": evaluate(run, toy_data, "validation", tmp / "validation"),
        "changed": evaluate(run, copied, "test", tmp / "changed"),
    }
    test = copied / "test.jsonl"
    test.write_text(test.read_text().replace("one", "uno"))
    return found


@pytest.mark.slow
def test_two_cards_are_compared_on_the_references_of_their_split(
    cards: dict[str, Path], toy_data: Path, tmp_path: Path
) -> None:
    from_cards = invoke(cards["sampled"], cards["greedy"], "--json", "--n-samples", "200")
    assert from_cards.exit_code == 0, from_cards.output
    doc = json.loads(from_cards.stdout)
    assert doc["references"] == f"split 'test' of {toy_data}" and doc["lines"] == 40
    assert doc["system_b"] == str(cards["greedy"] / "hypotheses.txt")
    card = json.loads((cards["greedy"] / "result.json").read_text())
    assert doc["metrics"][0]["b"]["score"] == pytest.approx(card["metrics"]["bleu"], abs=0.01)
    assert doc["metrics"][1]["b"]["score"] == pytest.approx(card["metrics"]["chrf"], abs=0.01)
    targets = [json.loads(x)["target"] for x in (toy_data / "test.jsonl").open()][:40]
    refs = write_lines(tmp_path / "refs.txt", targets)
    mixed = invoke(cards["sampled"] / "hypotheses.txt", cards["greedy"], "-r", refs, "--json",
                   "--n-samples", "200")  # fmt: skip
    assert mixed.exit_code == 0, mixed.output
    assert json.loads(mixed.stdout)["metrics"] == doc["metrics"]
    table = invoke(cards["sampled"], cards["greedy"], "--n-samples", "200")
    assert table.exit_code == 0 and "at p < 0.05, BLEU: " in table.stdout


@pytest.mark.slow
def test_cards_of_other_test_sets_are_refused(cards: dict[str, Path]) -> None:
    refused(cards["greedy"], cards["validation"], code=3,
            message="measured split 'validation' of")  # fmt: skip
    refused(cards["changed"], cards["changed"], code=3,
            message="are no longer what it measured; give --references FILE")  # fmt: skip
