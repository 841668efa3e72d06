"""``--ensemble`` on generate, evaluate and compare, end to end on tiny checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import Result
from typer.testing import CliRunner

from tests.conftest import digit_pairs, refusal_lines, write_jsonl
from tests.serve.conftest import free_port
from tformer.checkpoint.store import Tokenizers, load_checkpoint, write_checkpoint_files
from tformer.cli.commands import app
from tformer.config import ModelConfig, TrainConfig
from tformer.data.tokenizer import Tokenizer, train_tokenizer
from tformer.decoding.ensemble import ensemble_of
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.text import translate
from tformer.model import build_model

runner = CliRunner()
INPUTS = ["3 1 4", "9 2", "7"]


def invoke(*args: str | Path) -> Result:
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def records(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines()]


def write_member(folder: Path, tokenizer: Tokenizer, seed: int) -> Path:
    torch.manual_seed(seed)
    config = ModelConfig(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size,
                         d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=1, d_ff=64,
                         max_len=32)  # fmt: skip
    folder.mkdir(parents=True)
    write_checkpoint_files(folder, model=build_model(config), train_config=TrainConfig(),
                           tokenizers=Tokenizers(tokenizer, tokenizer))  # fmt: skip
    return folder


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two untrained checkpoints with one tokenizer, one with another target vocabulary,
    and a digit data set to evaluate on."""
    root = tmp_path_factory.mktemp("ensemble")
    pairs = digit_pairs(200, seed=1)
    texts = [p["source"] for p in pairs] + [p["target"] for p in pairs]
    tokenizer = train_tokenizer(texts, vocab_size=48)
    other = train_tokenizer([p["target"] for p in pairs], vocab_size=40)
    write_jsonl(root / "data" / "train.jsonl", pairs[8:])
    write_jsonl(root / "data" / "test.jsonl", pairs[:8])
    return {
        "a": write_member(root / "a", tokenizer, 0),
        "b": write_member(root / "b", tokenizer, 1),
        "other": write_member(root / "other", other, 2),
        "data": root / "data",
    }


def library_outputs(paths: list[Path], config: DecodingConfig) -> list[list[int]]:
    loaded = [load_checkpoint(p) for p in paths]
    generations = translate(ensemble_of(loaded), loaded[0].tokenizers, INPUTS, config)
    return [g.hypothesis.ids for per_input in generations for g in per_input]


@pytest.mark.parametrize("flags", [[], ["--beam-size", "3", "--n-best", "2"]])
def test_generate_decodes_what_the_library_ensemble_decodes(
    members: dict[str, Path], flags: list[str]
) -> None:
    a, b = members["a"], members["b"]
    result = invoke("generate", a, *INPUTS, "--ensemble", b, "--json", "--max-new-tokens", "6",
                    *flags)  # fmt: skip
    assert result.exit_code == 0, result.output
    beam = {"beam_size": 3, "n_best": 2} if flags else {}
    want = library_outputs([a, b], DecodingConfig(max_new_tokens=6, **beam))
    assert [r["ids"] for r in records(result.stdout)] == want


def test_an_ensemble_of_a_checkpoint_with_itself_generates_as_the_checkpoint(
    members: dict[str, Path],
) -> None:
    a = members["a"]
    alone = invoke("generate", a, *INPUTS, "-t", "1", "--seed", "4", "--max-new-tokens", "6")
    twice = invoke("generate", a, *INPUTS, "-t", "1", "--seed", "4", "--max-new-tokens", "6",
                   "--ensemble", a)  # fmt: skip
    assert alone.exit_code == twice.exit_code == 0, twice.output
    assert twice.stdout == alone.stdout


def test_evaluate_translates_with_the_ensemble_and_names_it_on_the_card(
    members: dict[str, Path], tmp_path: Path
) -> None:
    a, b = members["a"], members["b"]
    out = tmp_path / "card"
    result = invoke("evaluate", a, "--ensemble", b, "--data", members["data"], "--split", "test",
                    "--max-new-tokens", "6", "--out", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    card = json.loads((out / "result.json").read_text())
    assert json.dumps(card).count(str(b)) >= 1
    hypotheses = (out / "hypotheses.txt").read_text().splitlines()
    sources = [json.loads(line)["source"] for line in (members["data"] / "test.jsonl").open()]
    loaded = [load_checkpoint(p) for p in (a, b)]
    want = translate(ensemble_of(loaded), loaded[0].tokenizers, sources,
                     DecodingConfig(max_new_tokens=6))  # fmt: skip
    assert hypotheses == [g[0].text for g in want]


def test_compare_accepts_an_ensemble(members: dict[str, Path]) -> None:
    a, b = members["a"], members["b"]
    result = invoke("compare", a, *INPUTS, "--ensemble", b, "--json", "--temperatures", "1",
                    "--top-p", "1", "--max-new-tokens", "6")  # fmt: skip
    assert result.exit_code == 0, result.output
    greedy = [r["ids"] for r in records(result.stdout) if r["setting"] == "greedy"]
    assert greedy == library_outputs([a, b], DecodingConfig(max_new_tokens=6))


@pytest.mark.parametrize("command", ["generate", "compare", "evaluate", "serve"])
def test_another_target_vocabulary_is_refused_in_one_line(
    members: dict[str, Path], command: str
) -> None:
    args = {
        "generate": ["7"],
        "compare": ["7"],
        "evaluate": ["--data", members["data"], "--split", "test"],
        "serve": ["--port", str(free_port())],
    }[command]
    result = invoke(command, members["a"], *args, "--ensemble", members["other"])
    assert result.exit_code == 4, result.output
    lines = refusal_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert "target vocabulary" in lines[0] and "other" in lines[0]


def test_a_refusal_from_the_shell_has_no_traceback(members: dict[str, Path]) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tformer", "generate", str(members["a"]), "7",
         "--ensemble", str(members["other"])],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 4, run.stderr
    assert "Traceback" not in run.stderr
    assert len(refusal_lines(run.stderr)) == 1, run.stderr


@pytest.mark.parametrize("flag", [["--explain"], ["--mask-heads", "enc.0.0"]])
def test_one_model_modes_are_refused_with_an_ensemble(
    members: dict[str, Path], flag: list[str]
) -> None:
    result = invoke("generate", members["a"], "7", *flag, "--ensemble", members["b"])
    assert result.exit_code == 2, result.output
    assert "does not combine with --ensemble" in result.stderr


def test_a_streamed_ensemble_prints_what_it_prints_at_once(members: dict[str, Path]) -> None:
    a, b = members["a"], members["b"]
    flags = ["--ensemble", b, "--max-new-tokens", "6"]
    streamed = invoke("generate", a, "3 1 4", "--stream", *flags)
    at_once = invoke("generate", a, "3 1 4", "--no-stream", *flags)
    assert streamed.exit_code == at_once.exit_code == 0, streamed.output
    assert streamed.stdout == at_once.stdout


def test_quantize_int8_quantises_every_member(members: dict[str, Path]) -> None:
    from tformer.cli.ensemble_options import with_members
    from tformer.cli.options import apply_quantize
    from tformer.decoding.ensemble import Ensemble
    from tformer.fast.int8 import is_quantized

    loaded = load_checkpoint(members["a"])
    apply_quantize(loaded.model, "int8")  # as each command does to its own checkpoint
    model, paths = with_members(loaded, [members["b"], members["a"]], "generate", device="cpu",
                                quantize="int8")  # fmt: skip
    assert isinstance(model, Ensemble) and len(paths) == 3
    assert [is_quantized(m) for m in model.models()] == [True, True, True]
    result = invoke("generate", members["a"], *INPUTS, "--quantize", "int8", "--ensemble",
                    members["b"], "--max-new-tokens", "6")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == len(INPUTS)
