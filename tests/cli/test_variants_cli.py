"""The architecture options through the real CLI: refusals, info, --dry-run, --print-config,
inspect-attention, generate --explain, evaluate and export, on a variant trained for real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from tests.conftest import digit_folder
from tformer.checkpoint.store import load_checkpoint
from tformer.cli.commands import app

SIZE = [
    "--preset", "tiny", "--d-model", "32", "--n-heads", "4", "--n-layers", "1", "--d-ff", "64",
    "--max-len", "48", "--vocab-size", "60", "--max-tokens", "256", "--seed", "1",
]  # fmt: skip
VARIANT = [
    "--positions", "rope", "--kv-heads", "2", "--activation", "geglu",
    "--normalization", "rmsnorm", "--norm", "pre",
]  # fmt: skip


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_refusal(result: Result, code: int, *pieces: str) -> str:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for piece in pieces:
        assert piece in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("variant-data")
    return digit_folder(folder, 1, train=300, validation=20, test=20)


@pytest.fixture(scope="module")
def run(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("variant-run") / "run"
    result = invoke("train", "--data", data, "--out", out, *SIZE, *VARIANT,
                    "--max-steps", "12", "--save-every", "12", "--eval-every", "12")  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize(
    ("flags", "pieces"),
    [
        (["--kv-heads", "3"], ["--kv-heads 3", "--n-heads 4"]),
        (["--kv-heads", "0"], ["--kv-heads 0"]),
        (["--d-model", "36", "--positions", "rope"], ["--positions rope", "--d-model 36",
                                                      "--n-heads 4"]),
        (["--positions", "alibi"], ["--positions 'alibi'", "sinusoidal, learned, rope"]),
        (["--normalization", "batchnorm"], ["--normalization 'batchnorm'", "rmsnorm"]),
        (["--activation", "reglu"], ["--activation 'reglu'", "swiglu, geglu"]),
    ],
)
def test_bad_combinations_are_refused_in_one_line_with_exit_2(
    data: Path, tmp_path: Path, flags: list[str], pieces: list[str]
) -> None:
    out = tmp_path / "run"
    result = invoke("train", "--data", data, "--out", out, *SIZE, *flags, "--max-steps", "1")
    one_line_refusal(result, 2, *pieces)
    assert not out.exists()


@pytest.mark.slow
def test_info_shows_the_options_the_effective_widths_and_the_cache(run: Path) -> None:
    result = CliRunner().invoke(app, ["info", str(run)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    config = load_checkpoint(run).model_config
    text = result.stdout
    for piece in ("positions", "rope", "kv_heads", "normalization", "rmsnorm", "geglu",
                  "key/value heads (effective)", "2 (2 query heads each)",
                  "feed-forward hidden width (effective)"):  # fmt: skip
        assert piece in text, piece
    assert config.ffn_hidden == 48  # 2/3 of --d-ff 64
    row = next(line for line in text.splitlines() if "feed-forward hidden width" in line)
    assert " 48 " in row
    cache = f"{config.kv_cache_bytes_per_token():,} (2/4 of multi-head)"
    assert config.kv_cache_bytes_per_token() == 2 * 1 * 2 * 8 * 4
    assert cache in text


def test_dry_run_shows_the_kv_cache_per_token(data: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["train", "--data", str(data), "--out", str(tmp_path / "run"), *SIZE, "--kv-heads", "1",
         "--dry-run"],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if "KV cache per token" in line)
    assert "64 bytes (1/4 of multi-head)" in row  # 2 x 1 layer x 1 head x 8 x 4 bytes
    assert not (tmp_path / "run").exists()


def test_print_config_round_trips_the_options(data: Path, tmp_path: Path) -> None:
    printed = invoke("train", "--data", data, *SIZE, *VARIANT, "--print-config")
    assert printed.exit_code == 0, printed.output
    model = yaml.safe_load(printed.stdout)["model"]
    assert (model["positions"], model["kv_heads"], model["activation"],
            model["normalization"]) == ("rope", 2, "geglu", "rmsnorm")  # fmt: skip
    path = tmp_path / "run.yaml"
    path.write_text(printed.stdout)
    again = invoke("train", "--config", path, "--print-config")
    assert again.exit_code == 0, again.output
    assert again.stdout == printed.stdout


def test_inspect_attention_shows_the_head_grouping(run: Path) -> None:
    result = CliRunner().invoke(app, ["inspect-attention", str(run), "3 1 4", "--head", "all"],
                                env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "grouped-query attention: 4 query heads share 2 key/value heads" in text
    assert "h0-h1 -> kv0, h2-h3 -> kv1" in text


@pytest.mark.slow
def test_explain_and_evaluate_run_on_a_variant(run: Path, data: Path, tmp_path: Path) -> None:
    explained = invoke("generate", run, "3 1 4", "--explain")
    assert explained.exit_code == 0, explained.output
    evaluated = invoke("evaluate", run, "--data", data, "--split", "test", "--out",
                       tmp_path / "eval")  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    card = json.loads((tmp_path / "eval" / "result.json").read_text())
    assert card["model"]["positions"] == "rope" and card["model"]["kv_heads"] == 2


@pytest.mark.parametrize(
    ("to", "named", "not_named"),
    [
        ("huggingface", ["--positions rope", "--kv-heads 2", "--activation geglu",
                         "--normalization rmsnorm"], []),
        # CTranslate2 takes gated feed-forward layers and RMSNorm (tests/export), not these:
        ("ctranslate2", ["--positions rope", "--kv-heads 2"], ["geglu", "rmsnorm"]),
    ],
)  # fmt: skip
def test_export_refuses_variants_the_target_cannot_express(
    run: Path, tmp_path: Path, to: str, named: list[str], not_named: list[str]
) -> None:
    pytest.importorskip("transformers" if to == "huggingface" else "ctranslate2")
    out = tmp_path / "out"
    line = one_line_refusal(invoke("export", run, out, "--to", to), 2, f"--to {to}", *named)
    assert not any(piece in line.split("(")[0] for piece in not_named), line
    assert not out.exists()


@pytest.mark.slow
def test_ctranslate2_exports_the_variants_it_can_express(data: Path, tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")
    run = tmp_path / "run"
    trained = invoke("train", "--data", data, "--out", run, *SIZE, "--positions", "learned",
                     "--kv-heads", "1", "--activation", "swiglu", "--normalization", "rmsnorm",
                     "--max-steps", "2", "--save-every", "2", "--eval-every", "2")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    result = invoke("export", run, tmp_path / "ct2", "--to", "ctranslate2")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "ct2" / "model.bin").is_file()


def test_resume_refuses_a_variant_flag_that_contradicts_the_run(run: Path) -> None:
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    result = invoke("train", "--resume", run, "--positions", "learned", "--kv-heads", "4")
    one_line_refusal(result, 2, "--positions 'learned' (saved: rope)", "--kv-heads 4 (saved: 2)")
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before


@pytest.mark.slow
def test_resume_accepts_kv_heads_equal_to_the_heads_of_a_multi_head_run(
    data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    first = invoke("train", "--data", data, "--out", out, *SIZE, "--max-steps", "2",
                   "--save-every", "2", "--eval-every", "2")  # fmt: skip
    assert first.exit_code == 0, first.output
    again = invoke("train", "--resume", out, "--kv-heads", "4", "--max-steps", "3")
    assert again.exit_code == 0, again.output
    assert load_checkpoint(out).step == 3
