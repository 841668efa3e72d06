"""The real command line end to end: tokenizer, train, generate, inspect, info; errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tformer.cli.commands import app
from tformer.data.tokenizer import Tokenizer

runner = CliRunner()
TINY = [
    "--preset",
    "tiny",
    "--d-model",
    "32",
    "--n-heads",
    "2",
    "--n-layers",
    "1",
    "--d-ff",
    "64",
    "--max-len",
    "48",
    "--log-every",
    "5",
    "--eval-every",
    "10",
    "--save-every",
    "10",
    "--warmup-steps",
    "5",
    "--lr",
    "3e-3",
]


def invoke(*args: str, input: str | None = None) -> object:
    return runner.invoke(app, list(args), input=input, catch_exceptions=False)


@pytest.fixture(scope="module")
def cli_run(toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tokenizer -> train through the CLI, as a user would."""
    root = tmp_path_factory.mktemp("cli")
    tok = root / "tok.json"
    result = invoke(
        "train-tokenizer", "--data", str(toy_data), "--vocab-size", "60", "--out", str(tok)
    )
    assert result.exit_code == 0, result.output
    assert "wrote" in result.stdout and tok.is_file()
    assert Tokenizer.load(tok).id_to_token(0) == "<pad>"

    out = root / "run"
    result = invoke(
        "train",
        "--data",
        str(toy_data),
        "--tokenizer",
        str(tok),
        "--out",
        str(out),
        "--max-steps",
        "20",
        *TINY,
    )
    assert result.exit_code == 0, result.output
    assert "exact match on validation" in result.stdout
    assert (out / "latest").is_file()
    return out


def test_train_tokenizer_kinds_and_separate_vocab(toy_data: Path, tmp_path: Path) -> None:
    for kind in ("unigram", "wordpiece"):
        path = tmp_path / f"{kind}.json"
        assert (
            invoke(
                "train-tokenizer",
                "--data",
                str(toy_data),
                "--kind",
                kind,
                "--vocab-size",
                "50",
                "--out",
                str(path),
            ).exit_code
            == 0
        )
        assert Tokenizer.load(path).kind == kind
    result = invoke(
        "train-tokenizer",
        "--data",
        str(toy_data),
        "--separate-vocab",
        "--vocab-size",
        "50",
        "--out",
        str(tmp_path / "t.json"),
    )
    assert result.exit_code == 0
    assert (tmp_path / "t.source.json").is_file() and (tmp_path / "t.target.json").is_file()


@pytest.mark.slow
def test_generate_from_arguments_file_and_stdin(cli_run: Path, tmp_path: Path) -> None:
    args = invoke("generate", str(cli_run), "3 1", "4 1 5")
    assert args.exit_code == 0, args.output
    lines = args.stdout.splitlines()
    assert len(lines) == 2
    inputs = tmp_path / "in.txt"
    inputs.write_text("3 1\n4 1 5\n", encoding="utf-8")
    from_file = invoke("generate", str(cli_run), "--input-file", str(inputs))
    from_stdin = invoke("generate", str(cli_run), input="3 1\n4 1 5\n")
    assert from_file.stdout.splitlines() == lines == from_stdin.stdout.splitlines()


def test_generate_json_samples_and_seed(cli_run: Path) -> None:
    cmd = ("generate", str(cli_run), "2 7", "--json", "-t", "1.0", "-n", "3", "--seed", "5")
    first = invoke(*cmd)
    assert first.exit_code == 0, first.output
    records = [json.loads(line) for line in first.stdout.splitlines()]
    assert [r["sample"] for r in records] == [0, 1, 2]
    for r in records:
        assert r["input"] == "2 7" and len(r["token_logprobs"]) >= len(r["ids"])
        assert r["score"] == pytest.approx(sum(r["token_logprobs"]), abs=1e-4)
    assert invoke(*cmd).stdout == first.stdout  # same seed, same samples


@pytest.mark.slow
def test_inspect_attention_renders_and_saves(cli_run: Path, tmp_path: Path) -> None:
    result = invoke("inspect-attention", str(cli_run), "3 1 4", "--kind", "cross")
    assert result.exit_code == 0, result.output
    assert "cross attention" in result.stdout and "<eos>" in result.stdout
    assert "row: the token it predicts" in result.stdout
    for kind in ("encoder", "decoder"):
        r = invoke(
            "inspect-attention",
            str(cli_run),
            "3 1 4",
            "--kind",
            kind,
            "--head",
            "all",
            "--target",
            "three one four",
        )
        assert r.exit_code == 0, r.output
        assert "h0" in r.stdout and "h1" in r.stdout

    saved = tmp_path / "map.json"
    r = invoke(
        "inspect-attention",
        str(cli_run),
        "3 1 4",
        "--head",
        "0",
        "--layer",
        "0",
        "--target",
        "three one four",
        "--save",
        str(saved),
    )
    assert r.exit_code == 0, r.output
    record = json.loads(saved.read_text())
    weights = torch.tensor(record["weights"])
    assert weights.shape == (len(record["rows"]), len(record["columns"]))
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.size(0)))
    # The row that produced "three" is labelled "three"; the last one predicts <eos>.
    assert record["rows"][0].endswith("three") and record["rows"][-1] == "<eos>"
    assert record["target"] == "three one four"

    png = tmp_path / "map.png"
    assert invoke("inspect-attention", str(cli_run), "3 1 4", "--save", str(png)).exit_code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(str(png)).ndim == 3


@pytest.mark.slow
def test_info_for_checkpoint_and_preset(cli_run: Path) -> None:
    r = invoke("info", str(cli_run))
    assert r.exit_code == 0, r.output
    assert "d_model" in r.stdout and "total" in r.stdout
    base = invoke("info", "--preset", "base", "--vocab-size", "37000")
    assert base.exit_code == 0
    assert "512" in base.stdout and "feed_forward" in base.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["train", "--d-model", "64", "--n-heads", "3"], 2, "--n-heads 3 must divide --d-model 64"),
        (["train", "--preset", "huge"], 2, "--preset 'huge' is unknown"),
        (["train", "--data", "missing.jsonl"], 3, "no such file"),
        (["train", "--time-budget", "soon"], 2, "--time-budget 'soon'"),
        (["generate", "no/such/run", "x"], 4, "no such checkpoint"),
        (["generate", "no/such/run", "x", "--temperature", "-1"], 2, "--temperature -1"),
        (["generate", "no/such/run", "x", "--top-p", "1.5"], 2, "--top-p 1.5"),
    ],
)
def test_bad_input_gives_one_clear_line(
    args: list[str], code: int, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing may be written, and certainly not into the repo
    result = runner.invoke(app, args)
    assert result.exit_code == code, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_cuda_on_a_cpu_machine_is_refused(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    result = runner.invoke(app, ["train", "--device", "cuda", "--out", str(tmp_path / "r")])
    assert result.exit_code == 5
    assert "--device cuda" in result.stderr


def test_existing_run_is_not_clobbered(cli_run: Path, toy_data: Path) -> None:
    before = (cli_run / "latest").read_text()
    result = runner.invoke(app, ["train", "--data", str(toy_data), "--out", str(cli_run)])
    assert result.exit_code == 2
    assert "--resume" in result.stderr and "--overwrite" in result.stderr
    assert (cli_run / "latest").read_text() == before


@pytest.mark.slow
def test_resume_continues_from_the_latest_checkpoint(cli_run: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "resumed"
    shutil.copytree(cli_run, run)
    result = invoke("train", "--resume", str(run), "--max-steps", "30")
    assert result.exit_code == 0, result.output
    assert (run / "latest").read_text().strip() == "step-000030"
    conflict = runner.invoke(app, ["train", "--resume", str(run), "--d-model", "64"])
    assert conflict.exit_code == 2 and "--d-model 64 (saved: " in conflict.stderr


@pytest.mark.slow
def test_module_entry_point_reports_errors_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tformer", "generate", str(tmp_path / "nothing"), "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 4
    assert proc.stderr.startswith("error:") and "Traceback" not in proc.stderr
