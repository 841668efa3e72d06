"""``tformer generate`` and ``tformer compare`` end to end on the trained tiny model."""

from __future__ import annotations

import json

import pytest
from click.testing import Result
from typer.testing import CliRunner

from tests.conftest import refusal_lines
from tformer.cli.commands import app
from tformer.training.run import TrainResult

runner = CliRunner()


def invoke(*args: str, input: str | None = None) -> Result:
    return runner.invoke(app, list(args), input=input, catch_exceptions=False)


def records(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines()]


@pytest.fixture(scope="module")
def run(trained: TrainResult) -> str:
    return str(trained.run_dir)


def test_greedy_outputs_in_input_order(run: str) -> None:
    result = invoke("generate", run, "3 1 4", "7", "2 7")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["three one four", "seven", "two seven"]


def test_beam_n_best_json(run: str) -> None:
    result = invoke(
        "generate",
        run,
        "3 1 4",
        "9 2",
        "-b",
        "4",
        "--n-best",
        "3",
        "--length-penalty",
        "0.6",
        "--json",
    )
    assert result.exit_code == 0, result.output
    rows = records(result.stdout)
    assert [(r["input"], r["rank"]) for r in rows] == [("3 1 4", i) for i in range(3)] + [
        ("9 2", i) for i in range(3)
    ]
    assert rows[0]["output"] == "three one four"
    for r in rows:
        assert r["logprob"] == pytest.approx(sum(r["token_logprobs"]), abs=1e-4)
        length = len(r["token_logprobs"])  # the tokens and <eos>
        assert r["score"] == pytest.approx(r["logprob"] / length**0.6, abs=1e-4)
    for start in (0, 3):
        scores = [r["score"] for r in rows[start : start + 3]]
        assert scores == sorted(scores, reverse=True)


def test_sampling_json_is_reproducible(run: str) -> None:
    cmd = (
        "generate",
        run,
        "2 7",
        "--json",
        "-t",
        "2.0",
        "--top-p",
        "0.95",
        "--min-p",
        "0.01",
        "-n",
        "3",
        "--seed",
        "5",
    )
    first = invoke(*cmd)
    assert first.exit_code == 0, first.output
    assert [r["sample"] for r in records(first.stdout)] == [0, 1, 2]
    assert invoke(*cmd).stdout == first.stdout


def test_stream_prints_the_same_text(run: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = invoke("generate", run, "3 1 4", "-t", "3", "-n", "2", "--seed", "1")
    streamed = invoke("generate", run, "3 1 4", "-t", "3", "-n", "2", "--seed", "1", "--stream")
    assert streamed.exit_code == 0, streamed.output
    assert streamed.stdout == plain.stdout
    # One input to a terminal streams by itself (and still prints the same text).
    calls: list[bool] = []
    import tformer.cli.generate as generate

    def terminal() -> bool:
        calls.append(True)
        return True

    monkeypatch.setattr(generate, "stdout_is_terminal", terminal)
    auto = invoke("generate", run, "3 1 4")
    assert auto.stdout == "three one four\n" and calls


def test_interactive_keeps_reading_until_exit(run: str) -> None:
    result = invoke("generate", run, "--interactive", "--no-stream", input="3 1\n4 1 5\nexit\n9\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["three one", "four one five"]
    assert result.stderr.count("> ") == 3
    empty_line = invoke("generate", run, "--interactive", input="7\n\n9\n")
    assert empty_line.stdout.splitlines() == ["seven"]
    eof = invoke("generate", run, "--interactive", "--json", input="7")
    assert records(eof.stdout)[0]["output"] == "seven"


def test_explain_table(run: str) -> None:
    result = invoke(
        "generate", run, "3 1 4", "-t", "0.8", "--top-k", "3", "--explain", "--seed", "0"
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    for header in ("token", "p model", "p T=0.8", "p top-k 3", "alternatives", "source"):
        assert header in out
    assert "▁three" in out and "<eos>" in out
    beam = invoke("generate", run, "3 1 4", "-b", "2", "--explain")
    assert beam.exit_code == 0 and "beam search" in beam.stdout


def test_compare_table_and_json(run: str) -> None:
    table = invoke("generate", run, "3 1 4", "--compare")
    assert table.exit_code == 0, table.output
    for label in ("greedy", "beam 4", "T=0.5", "T=1.5", "top-p 0.9", "three one four"):
        assert label in table.stdout
    cmd = ("compare", run, "3 1 4", "7", "--temperatures", "0.7,2", "--beam-size", "3", "--json")
    rows = records(invoke(*cmd).stdout)
    assert [r["setting"] for r in rows[:5]] == ["greedy", "beam 3", "T=0.7", "T=2", "top-p 0.9"]
    assert [r["input"] for r in rows] == ["3 1 4"] * 5 + ["7"] * 5
    assert invoke(*cmd).stdout == invoke(*cmd).stdout  # fixed seeds


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["x", "-b", "4", "-n", "2"], "--num-samples 2 does not apply to beam search"),
        (["x", "-b", "4", "-t", "0.7"], "--temperature 0.7 with --beam-size 4"),
        (["x", "-b", "2", "--n-best", "3"], "--n-best 3 exceeds --beam-size 2"),
        (["x", "--min-new-tokens", "9", "--max-new-tokens", "4"], "--min-new-tokens 9 exceeds"),
        (["x", "--top-k", "5"], "--top-k 5 only apply when sampling"),
        (["x", "--length-penalty", "0.6"], "--length-penalty 0.6 only applies to beam search"),
        (["x", "--stream", "--json"], "--stream prints plain text"),
        (["x", "--stream", "-b", "2"], "--stream with --beam-size 2"),
        (["x", "--explain", "--compare"], "--explain and --compare do not combine"),
        (["x", "y", "--explain"], "--explain shows one input at a time; got 2"),
        (["x", "--interactive"], "--interactive reads inputs at a prompt"),
    ],
)
def test_bad_combinations_are_refused(run: str, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["generate", run, *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_compare_refuses_bad_temperatures(run: str) -> None:
    result = runner.invoke(app, ["compare", run, "x", "--temperatures", "0.5,hot"])
    assert result.exit_code == 2 and "--temperatures '0.5,hot'" in result.stderr


@pytest.mark.slow
def test_a_reader_that_goes_away_ends_generate_quietly(run: str, tmp_path) -> None:
    """`tformer generate ... | head -1`: no error line and no traceback once the pipe closes."""
    import subprocess
    import sys

    inputs = tmp_path / "inputs.txt"
    inputs.write_text("".join(f"{n:05d}\n" for n in range(3000)))
    script = "from tformer.cli import main; main()"
    child = subprocess.Popen(
        [sys.executable, "-c", script, "generate", run, "--input-file", str(inputs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.readline()
    child.stdout.close()
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=120) == 1
    assert refusal_lines(stderr) == []
