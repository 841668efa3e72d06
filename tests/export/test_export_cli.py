"""`tformer export` refuses what it must in one line, with its exit code, writing nothing and
changing nothing that was there; and it replaces only a folder an earlier export wrote."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from tformer.cli.commands import app
from tformer.export import MARKER


def tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` with a hash of its content (folders marked as such)."""
    return {
        str(p.relative_to(root)): "dir"
        if p.is_dir()
        else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


def export(*args: str | Path) -> Result:
    return CliRunner().invoke(app, ["export", *map(str, args)])


def refused(result: Result, code: int, *pieces: str) -> None:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "Traceback" not in result.output
    for piece in pieces:
        assert piece in lines[0], lines[0]


@pytest.fixture
def world(tmp_path: Path, trained_variant: Callable[[str], Path]) -> Path:
    """A checkpoint copy, a foreign folder, a non-empty folder and a file, side by side."""
    shutil.copytree(trained_variant("post-relu-shared-tied"), tmp_path / "ckpt")
    shutil.copytree(trained_variant("pre-gelu-shared-untied"), tmp_path / "pre")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("someone's work")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "model.bin").write_bytes(b"not ours")
    (tmp_path / "a-file").write_text("a file")
    return tmp_path


CASES = [
    # (id, args after `export`, exit code, pieces of the message)
    ("not-a-checkpoint", "{w}/foreign {w}/out --to ctranslate2", 4, ["not a tformer checkpoint"]),
    ("missing-checkpoint", "{w}/nowhere {w}/out --to ctranslate2", 4, ["no such checkpoint"]),
    (
        "unknown-target",
        "{w}/ckpt {w}/out --to onnx",
        2,
        ["--to 'onnx'", "ctranslate2, huggingface"],
    ),
    (
        "bad-quantization",
        "{w}/ckpt {w}/out --to ctranslate2 --quantization int4",
        2,
        ["--quantization 'int4'", "int8, int8_float32, float16"],
    ),
    (
        "quantization-for-hf",
        "{w}/ckpt {w}/out --to huggingface --quantization int8",
        2,
        ["only to --to ctranslate2"],
    ),
    ("non-empty-out", "{w}/ckpt {w}/busy --to ctranslate2", 2, ["not empty", "--overwrite"]),
    (
        "overwrite-foreign",
        "{w}/ckpt {w}/busy --to ctranslate2 --overwrite",
        2,
        ["not written by `tformer export`", "nothing was deleted"],
    ),
    ("out-is-a-file", "{w}/ckpt {w}/a-file --to ctranslate2", 2, ["is a file"]),
    ("out-under-a-file", "{w}/ckpt {w}/a-file/out --to ctranslate2", 2, ["is a file"]),
    (
        "out-in-checkpoint",
        "{w}/ckpt {w}/ckpt/export --to ctranslate2",
        2,
        ["inside the checkpoint"],
    ),
    ("pre-norm-to-hf", "{w}/pre {w}/out --to huggingface", 2, ["pre-norm", "--to ctranslate2"]),
]


@pytest.mark.parametrize(
    ("args", "code", "pieces"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_refusals_write_nothing(world: Path, args: str, code: int, pieces: list[str]) -> None:
    if "huggingface" in args and "pre" in args:
        pytest.importorskip("transformers", reason="transformers is not installed")
    before = tree(world)
    refused(export(*args.format(w=world).split()), code, *pieces)
    assert tree(world) == before  # nothing written, nothing changed, no temporary folder left


@pytest.mark.parametrize(
    ("to", "package"), [("ctranslate2", "ctranslate2"), ("huggingface", "transformers")]
)
def test_missing_package_says_what_to_install(
    world: Path, to: str, package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # import fails as if it were absent
    before = tree(world)
    refused(
        export(world / "ckpt", world / "out", "--to", to),
        2,
        f"needs the {package} package",
        'pip install "tformer[export]"',
    )
    assert tree(world) == before


def test_overwrite_replaces_only_an_earlier_export(world: Path) -> None:
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed")
    out = world / "out"
    assert export(world / "ckpt", out, "--to", "ctranslate2").exit_code == 0
    first = tree(out)
    assert json.loads((out / MARKER).read_text())["quantization"] == "float32"
    # Again without --overwrite: refused, the export untouched.
    refused(export(world / "ckpt", out, "--to", "ctranslate2"), 2, "--overwrite")
    assert tree(out) == first
    # A file of the user's inside it: refused even with --overwrite, nothing deleted.
    (out / "my-notes.txt").write_text("mine")
    before = tree(world)
    refused(
        export(world / "ckpt", out, "--to", "ctranslate2", "--quantization", "int8", "--overwrite"),
        2,
        "my-notes.txt",
        "nothing was deleted",
    )
    assert tree(world) == before
    (out / "my-notes.txt").unlink()
    # An earlier export and nothing else: replaced.
    result = export(
        world / "ckpt", out, "--to", "ctranslate2", "--quantization", "int8", "--overwrite"
    )
    assert result.exit_code == 0, result.output
    assert json.loads((out / MARKER).read_text())["quantization"] == "int8"
    assert tree(out) != first
    assert sorted(p.name for p in world.iterdir() if p.name.startswith(".")) == []


def test_empty_out_folder_is_used(world: Path) -> None:
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed")
    (world / "empty").mkdir()
    result = export(world / "ckpt", world / "empty", "--to", "ctranslate2")
    assert result.exit_code == 0, result.output
    assert (world / "empty" / "model.bin").is_file() and (world / "empty" / MARKER).is_file()


def test_overwrite_looks_inside_subfolders(
    world: Path, trained_variant: Callable[[str], Path]
) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed")
    out = world / "hf"
    checkpoint = trained_variant("post-gelu-separate-tied")  # separate: a target_tokenizer/
    assert export(checkpoint, out, "--to", "huggingface").exit_code == 0
    (out / "target_tokenizer" / "mine.txt").write_text("mine")
    before = tree(world)
    refused(
        export(checkpoint, out, "--to", "huggingface", "--overwrite"),
        2,
        "target_tokenizer/mine.txt",
        "nothing was deleted",
    )
    assert tree(world) == before


@pytest.mark.slow
def test_importing_tformer_and_its_cli_loads_no_export_package() -> None:
    code = (
        "import sys, tformer, tformer.export, tformer.cli.commands; "
        "print(sorted({'ctranslate2', 'transformers'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_failed_export_leaves_no_folder_behind(
    world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export stopped half-way (here: Ctrl-C inside the writer) removes its staging
    folder and the parent folders it created for OUT; folders that were there stay."""
    import tformer.export.api as api

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    before = tree(world)
    monkeypatch.setattr(api, "_write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        api.export_checkpoint(world / "ckpt", world / "new" / "deep" / "out", to="ctranslate2")
    with pytest.raises(KeyboardInterrupt):
        api.export_checkpoint(world / "ckpt", world / "busy" / "out", to="ctranslate2")
    assert tree(world) == before
