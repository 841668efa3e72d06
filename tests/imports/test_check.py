"""``tformer import --check``: each family's import, compared with transformers on the built-in
sentences, passes every check line; a source changed after the import fails, exit 4, the
checkpoint kept."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from tests.imports.conftest import MarianCase, tformer  # noqa: E402
from tests.imports.test_bert import BertCase, bert  # noqa: E402, F401
from tests.imports.test_gpt2 import GPT2Case, gpt2  # noqa: E402, F401
from tests.imports.test_t5 import T5Case, t5  # noqa: E402, F401
from tformer.imports.check import SENTENCES, check_import  # noqa: E402

LINES = {
    "gpt2": ["token ids", "logits", "greedy"],
    "bert": ["token ids", "logits", "fill-mask"],
    "t5": ["token ids", "logits", "greedy"],
    "marian": ["token ids", "logits", "greedy"],
}


def passes(folder: Path, out: Path, family: str, *extra: str) -> None:
    run = tformer("import", folder, out, "--check", *extra)
    assert run.exit_code == 0, run.output
    for name in LINES[family]:
        line = next(li for li in run.stdout.splitlines() if li.startswith(f"check {name}:"))
        assert line.endswith(": pass"), line
    assert "tolerance 1e-03" in run.stdout


def test_gpt2_passes(gpt2: GPT2Case, tmp_path: Path) -> None:  # noqa: F811
    passes(gpt2.folder, tmp_path / "out", "gpt2")


def test_bert_passes(bert: BertCase, tmp_path: Path) -> None:  # noqa: F811
    passes(bert.folder, tmp_path / "out", "bert")


def test_t5_passes(t5: T5Case, tmp_path: Path) -> None:  # noqa: F811
    passes(t5.folder, tmp_path / "out", "t5")


def test_marian_passes_on_the_lines_of_check_text(
    marian_case: Callable[[str], MarianCase], tmp_path: Path
) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join([*SENTENCES[:2], "", "A dog runs."]) + "\n", encoding="utf-8")
    passes(marian_case("swish-separate-untied").folder, tmp_path / "out", "marian",
           "--check-text", texts)  # fmt: skip


def test_a_source_changed_after_the_import_fails_exit_4_and_keeps_it(
    gpt2: GPT2Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    from safetensors.torch import load_file, save_file

    changed = tmp_path / "changed"
    shutil.copytree(gpt2.folder, changed)
    tensors = load_file(changed / "model.safetensors")
    tensors["transformer.ln_f.bias"] += 0.1
    save_file(tensors, changed / "model.safetensors", metadata={"format": "pt"})
    checks = {c.name: c for c in check_import(changed, gpt2.out)}
    assert checks["token ids"].ok and not checks["logits"].ok, checks

    # The CLI checks the import of the original folder against the changed one.
    monkeypatch.setattr("tformer.cli.import_model.local_folder", lambda source: changed)
    out = tmp_path / "out"
    run = tformer("import", gpt2.folder, out, "--check")
    assert run.exit_code == 4, run.output
    line = next(li for li in run.stdout.splitlines() if li.startswith("check logits:"))
    assert line.endswith(": FAIL") and "tolerance 1e-03" in line, line
    assert "logits" in run.stderr and "kept" in run.stderr, run.stderr
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
