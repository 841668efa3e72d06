"""`tformer distill`: a teacher's outputs as a new corpus, resumable, and a student trained on
it. A tiny teacher trained for real by the CLI; a few dozen sources."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import digit_folder, digit_pairs, write_jsonl
from tests.test_hostile_files import TINY, cli, refused
from tformer.checkpoint.store import load_checkpoint
from tformer.config import preset
from tformer.data.distilled import PROGRESS, partial_folder
from tformer.decoding.ensemble import ensemble_of
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.text import translate

# A narrow student: the preset sets the layers, these the width and a two-step run.
STUDENT = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--max-len", "48",
           "--vocab-size", "60", "--max-tokens", "256", "--warmup-steps", "1", "--max-steps", "2"]
FAST = ["--max-new-tokens", "8", "--chunk-size", "8", "--max-tokens", "64"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return digit_folder(tmp_path_factory.mktemp("corpus"), 1, train=40, validation=5, test=4)


@pytest.fixture(scope="module")
def teacher(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("teacher")
    write_jsonl(root / "data" / "train.jsonl", digit_pairs(300, seed=4))
    write_jsonl(root / "data" / "validation.jsonl", digit_pairs(5, seed=5))
    result = cli("train", "--data", root / "data", "--out", root / "run", *TINY,
                 "--max-steps", "40")  # fmt: skip
    assert result.exit_code == 0, result.output
    return root / "run"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _distill(teacher: Path, corpus: Path, out: Path, *extra: object) -> Any:
    return cli("distill", teacher, "--data", corpus, "--out", out, *FAST, *extra)


@pytest.mark.parametrize(("beam", "n_best"), [(1, 1), (3, 2)])
def test_targets_are_what_translate_gives(
    teacher: Path, corpus: Path, tmp_path: Path, beam: int, n_best: int
) -> None:
    out = tmp_path / "distilled"
    result = _distill(teacher, corpus, out, "--beam-size", beam, "--n-best", n_best)
    assert result.exit_code == 0, result.output
    assert "40/40 sources" in result.stderr and "sentences/s" in result.stderr
    sources = [pair["source"] for pair in _lines(corpus / "train.jsonl")]
    loaded = load_checkpoint(teacher)
    config = DecodingConfig(beam_size=beam, n_best=n_best, max_new_tokens=8)
    found = translate(loaded.model, loaded.tokenizers, sources, config)
    want = [{"source": s, "target": g.text} for s, gens in zip(sources, found, strict=True)
            for g in gens]  # fmt: skip
    assert _lines(out / "train.jsonl") == want
    for split in ("validation", "test"):
        assert _lines(out / f"{split}.jsonl") == _lines(corpus / f"{split}.jsonl")
    manifest = json.loads((out / "tformer-distill.json").read_text())
    assert manifest["counts"] == {"train": 40 * n_best, "validation": 5, "test": 4}
    assert (manifest["beam_size"], manifest["n_best"]) == (beam, n_best)
    assert not partial_folder(out).exists()


def test_an_ensemble_teacher_gives_the_ensembles_outputs(
    teacher: Path, corpus: Path, tmp_path: Path
) -> None:
    """--ensemble: the targets are what the members decode together, recorded in the
    manifest; a resumed run must name the same members."""
    other = tmp_path / "other"
    trained = cli("train", "--data", teacher.parent / "data", "--out", other, *TINY,
                  "--max-steps", "40", "--seed", "1")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    out = tmp_path / "distilled"
    result = _distill(teacher, corpus, out, "--beam-size", 2, "--ensemble", other)
    assert result.exit_code == 0, result.output
    sources = [pair["source"] for pair in _lines(corpus / "train.jsonl")]
    members = [load_checkpoint(teacher), load_checkpoint(other)]
    config = DecodingConfig(beam_size=2, max_new_tokens=8)
    found = translate(ensemble_of(members), members[0].tokenizers, sources, config)
    want = [{"source": s, "target": gens[0].text} for s, gens in zip(sources, found, strict=True)]
    assert _lines(out / "train.jsonl") == want
    alone = translate(members[0].model, members[0].tokenizers, sources, config)
    assert want != [{"source": s, "target": g[0].text} for s, g in zip(sources, alone, strict=True)]
    manifest = json.loads((out / "tformer-distill.json").read_text())
    assert manifest["ensemble"] == [str(members[1].path.absolute())]


def test_the_folder_trains_a_student(teacher: Path, corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "distilled"
    assert _distill(teacher, corpus, out).exit_code == 0
    run = tmp_path / "student"
    result = cli("train", "--data", out, "--out", run, "--preset", "student", *STUDENT)
    assert result.exit_code == 0, result.output
    model = load_checkpoint(run).model_config
    assert (model.n_encoder_layers, model.n_decoder_layers, model.d_model) == (6, 1, 32)
    student, small = preset("student"), preset("small")  # the default preset's width
    assert (student.n_encoder_layers, student.n_decoder_layers) == (6, 1)
    assert (student.d_model, student.n_heads, student.d_ff) == (small.d_model, small.n_heads,
                                                                small.d_ff)


def _subprocess(teacher: Path, corpus: Path, out: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tformer", "distill", str(teacher), "--data", str(corpus),
               "--out", str(out), "--max-new-tokens", "8", "--chunk-size", "2",
               "--max-tokens", "64"]  # fmt: skip
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True)


def _done(out: Path) -> int:
    try:
        return int(json.loads((partial_folder(out) / PROGRESS).read_text())["done"])
    except (OSError, ValueError, KeyError):
        return 0


def test_a_killed_run_resumes_with_every_source_once(
    teacher: Path, corpus: Path, tmp_path: Path
) -> None:
    whole = tmp_path / "whole"
    assert _distill(teacher, corpus, whole, "--chunk-size", "2").exit_code == 0
    out = tmp_path / "killed"
    proc = _subprocess(teacher, corpus, out)
    deadline = time.monotonic() + 120
    while _done(out) == 0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = _done(out)
    assert 0 < done < 40, "the run was not killed between its first and last chunk"
    # A chunk cut short by the kill: bytes past what the progress record names.
    with open(partial_folder(out) / "train.jsonl", "ab") as handle:
        handle.write(b'{"source": "half a pa')
    result = _distill(teacher, corpus, out, "--chunk-size", "2", "--resume")
    assert result.exit_code == 0, result.output
    assert f"resuming after {done} of 40 sources" in result.stderr
    assert _lines(out / "train.jsonl") == _lines(whole / "train.jsonl")


def test_ctrl_c_stops_after_the_chunk_and_resume_goes_on(
    teacher: Path, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tformer.cli import distill

    report = distill._report

    def interrupted(*args: Any) -> None:
        report(*args)
        os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C, while the first chunk is reported

    monkeypatch.setattr(distill, "_report", interrupted)
    out = tmp_path / "stopped"
    stopped = _distill(teacher, corpus, out)
    assert stopped.exit_code == 130 and "Traceback" not in stopped.output
    last = stopped.stderr.strip().splitlines()[-1]
    assert "stopped after 8 of 40" in last and "--resume" in last and not out.exists()
    monkeypatch.setattr(distill, "_report", report)
    again = refused(_distill(teacher, corpus, out), 2, str(partial_folder(out)), "--resume")
    assert "8 of 40 sources" in again
    changed = refused(_distill(teacher, corpus, out, "--resume", "--beam-size", "2"), 2,
                      "--beam-size 4, not 2", "--resume")  # fmt: skip
    assert "same settings" in changed
    result = _distill(teacher, corpus, out, "--resume")
    assert result.exit_code == 0, result.output
    whole = tmp_path / "whole"
    assert _distill(teacher, corpus, whole).exit_code == 0
    assert _lines(out / "train.jsonl") == _lines(whole / "train.jsonl")
    assert _distill(teacher, corpus, whole, "--overwrite").exit_code == 0


@pytest.mark.parametrize(
    ("args", "code", "part"),
    [
        (["--data", "/no/such/corpus"], 3, "/no/such/corpus"),
        (["--max-tokens", "0"], 2, "--max-tokens 0"),
        (["--chunk-size", "0"], 2, "--chunk-size 0"),
        (["--n-best", "5"], 2, "--n-best"),
        (["--split", "dev"], 3, "--split dev"),
        (["--limit", "0"], 2, "--limit 0"),
        (["--resume"], 2, "no interrupted distillation"),
    ],
)
def test_bad_input_is_one_line(
    teacher: Path, corpus: Path, tmp_path: Path, args: list[str], code: int, part: str
) -> None:
    out = tmp_path / "out"
    refused(cli("distill", teacher, "--data", corpus, "--out", out, *args), code, part)
    assert list(tmp_path.iterdir()) == []
