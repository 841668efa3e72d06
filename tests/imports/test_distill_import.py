"""The path from a teacher to an int8 student (docs/distill.md) with an imported OPUS-MT-shaped
Marian model as the teacher (random weights, built locally as the other import tests do):
filter the corpus with it, distill with it (alone and in an ensemble with itself), train a
student on the distilled folder and decode the student in int8."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import write_jsonl
from tests.imports.conftest import MarianCase, lines
from tformer.checkpoint import load_checkpoint
from tformer.cli.commands import app
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.text import translate
from tformer.imports import import_model

pytestmark = pytest.mark.slow

runner = CliRunner()
STUDENT = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--max-len", "48",
           "--vocab-size", "80", "--max-tokens", "256", "--warmup-steps", "1", "--max-steps", "2",
           "--eval-every", "2", "--save-every", "2"]  # fmt: skip


def invoke(*args: object) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def jsonl(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_an_imported_teacher_filters_distils_and_teaches_an_int8_student(
    marian_case: Callable[[str], MarianCase], toy_data: Path, tmp_path: Path
) -> None:
    teacher = import_model(marian_case("swish-shared-tied").folder, tmp_path / "opus")
    corpus = tmp_path / "corpus"
    for split, name, count in (("train", "train", 16), ("val", "validation", 4),
                               ("test2016", "test", 4)):  # fmt: skip
        sources, targets = lines(split, "en", count, toy_data), lines(split, "de", count, toy_data)
        write_jsonl(corpus / f"{name}.jsonl",
                    [{"source": s, "target": t} for s, t in zip(sources, targets, strict=True)])
    invoke("filter", teacher, "--data", corpus, "--out", tmp_path / "filtered", "--keep", "0.75")
    filtered = tmp_path / "filtered"
    assert len(jsonl(filtered / "train.jsonl")) == 12
    assert jsonl(filtered / "test.jsonl") == jsonl(corpus / "test.jsonl")

    distilled = tmp_path / "distilled"
    invoke("distill", teacher, "--data", filtered, "--out", distilled, "--beam-size", "2",
           "--max-new-tokens", "8")  # fmt: skip
    sources = [pair["source"] for pair in jsonl(filtered / "train.jsonl")]
    loaded = load_checkpoint(teacher)
    found = translate(loaded.model, loaded.tokenizers, sources,
                      DecodingConfig(beam_size=2, max_new_tokens=8))  # fmt: skip
    want = [{"source": s, "target": g[0].text} for s, g in zip(sources, found, strict=True)]
    assert jsonl(distilled / "train.jsonl") == want
    # An ensemble of the teacher with itself decodes as the teacher alone.
    invoke("distill", teacher, "--ensemble", teacher, "--data", filtered, "--out",
           tmp_path / "twice", "--beam-size", "2", "--max-new-tokens", "8")  # fmt: skip
    assert jsonl(tmp_path / "twice" / "train.jsonl") == want

    student = tmp_path / "student"
    invoke("train", "--data", distilled, "--out", student, "--preset", "student", *STUDENT)
    config = load_checkpoint(student).model_config
    assert (config.n_encoder_layers, config.n_decoder_layers) == (6, 1)
    invoke("generate", student, sources[0], "--quantize", "int8", "--max-new-tokens", "4")
