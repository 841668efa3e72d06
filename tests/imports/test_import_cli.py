"""`tformer import` through the real CLI: an OPUS-MT-like folder becomes a checkpoint that
verify passes, info describes and every command runs on; bad sources are refused in one line
with nothing written; an export to Hugging Face imports back bit-identical."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from tests.imports.conftest import MarianCase, lines
from tformer.checkpoint import load_checkpoint
from tformer.cli.commands import app
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.text import translate
from tformer.errors import ConfigError
from tformer.export import export_checkpoint
from tformer.export.ctranslate2 import decoding_options
from tformer.imports import import_model
from tformer.training.reporting import TrainResult

CASE = "swish-shared-tied"


def invoke(*args: str) -> object:
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def imported(
    marian_case: Callable[[str], MarianCase], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The CASE folder imported by a real `python -m tformer import` process."""
    out = tmp_path_factory.mktemp("cli") / "opus"
    folder = marian_case(CASE).folder
    done = subprocess.run(
        [sys.executable, "-m", "tformer", "import", str(folder), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "imported" in done.stdout
    summary = " ".join(done.stdout.split())  # what was imported, in one line
    assert "marian as encoder-decoder:" in summary and "2+2 layers" in summary, summary
    assert "(MarianTokenizer); transformers" in summary, summary
    return out


@pytest.mark.slow
def test_import_is_a_checkpoint_that_verify_passes_and_info_describes(
    imported: Path, marian_case: Callable[[str], MarianCase]
) -> None:
    assert sorted(p.name for p in imported.iterdir()) == [
        "config.json", "manifest.json", "model.safetensors", "source_tokenizer.json",
        "target_tokenizer.json",
    ]  # fmt: skip
    verified = invoke("verify", str(imported))
    assert verified.exit_code == 0, verified.output
    info = invoke("info", str(imported))
    assert info.exit_code == 0, info.output
    assert "imported from" in info.stdout and str(marian_case(CASE).folder) in info.stdout
    origin = json.loads((imported / "config.json").read_text())["origin"]
    assert origin["model_type"] == "marian" and origin["tokenizer"] == "MarianTokenizer"
    saved = json.loads((marian_case(CASE).folder / "config.json").read_text())
    assert origin["transformers_version"] == saved["transformers_version"]


@pytest.mark.slow
def test_every_command_runs_on_the_import(imported: Path, tmp_path: Path, toy_data: Path) -> None:
    source = lines("test2016", "en", 1, toy_data)[0]
    reference = lines("test2016", "de", 1, toy_data)[0]
    ckpt = load_checkpoint(imported)
    want = translate(ckpt.model, ckpt.tokenizers, [source], DecodingConfig())[0][0].text
    plain = invoke("generate", str(imported), source)
    assert plain.exit_code == 0, plain.output
    assert plain.stdout.strip() == want.strip()
    explained = invoke("generate", str(imported), source, "--explain")
    # tformer's <eos> is never shown by its own name (whether this random model ends its
    # output, or </s> is among the source tokens it attends to most, is its weights' chance;
    # the masks and the attention map below show </s> for certain)
    assert explained.exit_code == 0, explained.output
    assert "<eos>" not in explained.stdout
    int8 = invoke("generate", str(imported), source, "--quantize", "int8", "--beam-size", "4")
    assert int8.exit_code == 0, int8.output
    scored = invoke("score", str(imported), source, reference, "--json", "--masks")
    assert scored.exit_code == 0, scored.output
    masks = json.loads(scored.stdout)["masks"]
    assert masks["cross_attention_columns"][-1] == "</s>"  # closing Marian's sources
    assert all(masks["cross_attention"][0])
    attention = invoke("inspect-attention", str(imported), source, "--kind", "cross")
    assert attention.exit_code == 0, attention.output
    saved = tmp_path / "map.json"
    assert invoke("inspect-attention", str(imported), source, "--save", str(saved)).exit_code == 0
    columns = json.loads(saved.read_text())["columns"]
    assert columns[-1] == "</s>" and len(columns) == len(ckpt.tokenizers.source.encode(source)) + 1
    exported = invoke("export", str(imported), "--to", "ctranslate2", str(tmp_path / "ct2"))
    assert exported.exit_code == 0, exported.output
    ctranslate2 = pytest.importorskip("ctranslate2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    tokens = ckpt.tokenizers.source.tokens(ckpt.tokenizers.source.encode(source))
    options = decoding_options(ckpt.model_config.max_len)
    hyp = translator.translate_batch([tokens], **options)[0].hypotheses[0]
    ours = translate(ckpt.model, ckpt.tokenizers, [source], DecodingConfig())[0][0]
    target = ckpt.tokenizers.target
    assert [target.inner.token_to_id(t) for t in hyp if t != "<eos>"] == ours.hypothesis.ids


def state(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def same_weights(a: Path, b: Path) -> None:
    first, second = state(a), state(b)
    assert first.keys() == second.keys()
    for name, tensor in first.items():
        assert torch.equal(tensor, second[name]), name


def model_section(folder: Path) -> dict[str, object]:
    return json.loads((folder / "config.json").read_text())["model"]


def test_export_then_import_is_bit_identical(
    trained: TrainResult, imported: Path, tmp_path: Path
) -> None:
    for name, checkpoint in (("trained", trained.checkpoint), ("imported", imported)):
        hf = export_checkpoint(checkpoint, tmp_path / f"{name}-hf", to="huggingface")
        back = import_model(hf, tmp_path / f"{name}-back")
        same_weights(checkpoint, back)
        assert model_section(back) == model_section(checkpoint), name
        ours, theirs = load_checkpoint(checkpoint).tokenizers, load_checkpoint(back).tokenizers
        text = "3 1 4 a man rides a bike"
        assert theirs.source.encode(text) == ours.source.encode(text)
        assert theirs.target.encode(text) == ours.target.encode(text)


def copy_of(folder: Path, where: Path, change: Callable[[Path], None]) -> Path:
    out = where / "source"
    shutil.copytree(folder, out)
    change(out)
    return out


def edit_config(**values: object) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        config.update(values)
        (folder / "config.json").write_text(json.dumps(config))

    return change


REFUSALS: dict[str, tuple[Callable[[Path], None], str]] = {
    "bart": (edit_config(model_type="bart"), "model_type 'bart' is not supported"),
    "no-tokenizer": (lambda f: (f / "source.spm").unlink(), "tokenizer files source.spm"),
    "weights": (edit_config(encoder_ffn_dim=128, decoder_ffn_dim=128), "do not match"),
    "pre-norm": (edit_config(normalize_before=True), "normalize_before"),
    "unscaled": (edit_config(scale_embedding=False), "scale_embedding"),
    "embedding-norm": (edit_config(normalize_embedding=True), "normalize_embedding"),
    "pickle": (
        lambda f: (f / "model.safetensors").rename(f / "pytorch_model.bin"),
        "pytorch_model.bin is a pickle",
    ),
}


@pytest.mark.parametrize("name", REFUSALS)
def test_bad_sources_are_refused_in_one_line_writing_nothing(
    name: str, marian_case: Callable[[str], MarianCase], tmp_path: Path
) -> None:
    change, message = REFUSALS[name]
    source = copy_of(marian_case(CASE).folder, tmp_path, change)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["import", str(source), str(out)])
    assert result.exit_code == 4, result.output
    assert result.stderr.strip().count("\n") == 0 and message in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["source"]


def test_an_existing_out_needs_overwrite_and_only_replaces_an_import(
    imported: Path, marian_case: Callable[[str], MarianCase], tmp_path: Path
) -> None:
    folder = str(marian_case(CASE).folder)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    refused = CliRunner().invoke(app, ["import", folder, str(out)])
    assert refused.exit_code == 2 and "--overwrite" in refused.stderr, refused.output
    refused = CliRunner().invoke(app, ["import", folder, str(out), "--overwrite"])
    assert refused.exit_code == 2 and "not a checkpoint" in refused.stderr, refused.output
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    again = tmp_path / "again"
    shutil.copytree(imported, again)
    replaced = CliRunner().invoke(app, ["import", folder, str(again), "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    same_weights(imported, again)


@pytest.mark.slow
@pytest.mark.parametrize("hub_id", ["Helsinki-NLP/opus-mt-en-de", "gpt2"])
def test_a_hub_id_offline_says_to_pass_a_local_folder(hub_id: str, tmp_path: Path) -> None:
    pytest.importorskip("huggingface_hub")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(
        [sys.executable, "-m", "tformer", "import", hub_id, str(tmp_path / "out")],
        capture_output=True, text=True, env=env, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "local folder" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_without_transformers_the_message_names_the_extra(
    marian_case: Callable[[str], MarianCase], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = marian_case(CASE).folder
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(ConfigError, match=r'pip install "tformer\[import\]"'):
        import_model(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()
