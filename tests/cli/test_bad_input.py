"""Every bad input is answered with one clear line, its own exit code, and no harm done.

One table: the command line, the expected exit code (2 option, 3 data, 4 checkpoint, 5 device)
and a piece of the message. Each case runs the real CLI against one shared tree of files (good
data, bad data, a real run, broken and foreign checkpoints) and checks that stderr is exactly
one line starting with "error:", that there is no traceback, and that not a byte of the tree,
nor of the working folder, changed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import tformer.data.sources
from tests.conftest import digit_pairs, write_jsonl
from tformer.cli.commands import app
from tformer.data.tokenizer import train_tokenizer

TINY = [
    "--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--d-ff", "64",
    "--max-len", "48", "--vocab-size", "60", "--max-tokens", "256",
]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("world")
    good = root / "good"
    write_jsonl(good / "train.jsonl", digit_pairs(120, seed=31))
    write_jsonl(good / "validation.jsonl", digit_pairs(10, seed=32))

    bad = root / "bad"
    bad.mkdir()
    (bad / "empty.jsonl").write_bytes(b"")
    (bad / "blank.jsonl").write_text("\n\n\n")
    (bad / "utf8.jsonl").write_bytes(b'{"source": "1", "target": "one"}\n{"source": "\xff"}\n')
    (bad / "utf8.csv").write_bytes(b"source,target\n1,one\n2,tw\xc3\x28o\n")
    (bad / "misnamed.jsonl").write_text('{"src": "1", "tgt": "one"}\n')
    (bad / "row.jsonl").write_text('{"source": "1", "target": "one"}\n{"source": "2"}\n')
    (bad / "cells.tsv").write_text("source\ttarget\n1\tone\n2\n")
    (bad / "broken.spm").write_bytes(b"\x0a\xff\xff\xff not a model")
    (bad / "text.model").write_text("a text file, not a SentencePiece model\n")
    long = [{"source": " ".join(["7"] * 40), "target": "seven"}, *digit_pairs(20, seed=1)]
    write_jsonl(bad / "long.jsonl", long)
    paired = bad / "paired"
    paired.mkdir()
    (paired / "train.en").write_text("1\n2\n3\n")
    (paired / "train.de").write_text("eins\nzwei\n")

    run = root / "run"
    result = CliRunner().invoke(
        app, ["train", "--data", str(good), "--out", str(run), *TINY, "--max-steps", "2"]
    )
    assert result.exit_code == 0, result.output
    step = run / (run / "latest").read_text().strip()

    partial = root / "partial"  # a checkpoint with a file missing
    shutil.copytree(step, partial)
    (partial / "model.safetensors").unlink()
    dangling = root / "dangling"  # a run whose latest names a checkpoint that is not there
    dangling.mkdir()
    (dangling / "latest").write_text("step-000400\n")
    unfinished = root / "unfinished"  # killed during its first save
    (unfinished / ".step-000010.x1y2").mkdir(parents=True)
    (unfinished / "metrics.jsonl").write_text('{"step": 5, "loss": 2.0}\n')
    foreign = root / "foreign"  # someone else's model folder
    foreign.mkdir()
    (foreign / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (foreign / "pytorch_model.bin").write_bytes(b"not ours")
    other_tok = root / "other-tokenizer.json"
    train_tokenizer(["completely different words"] * 20, vocab_size=40).save(other_tok)
    (root / "a-file").write_text("a file, not a folder")
    return root


def tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` with a hash of its content (folders marked as such)."""
    out = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        out[key] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _no_cuda_device() -> str:
    return f"cuda:{torch.cuda.device_count() + 7}"


CASES = [
    # data
    ("empty-file", "train --data {w}/bad/empty.jsonl", 3, "the file is empty"),
    ("only-blank-lines", "train --data {w}/bad/blank.jsonl", 3, "no records (only blank lines)"),
    ("invalid-utf8-jsonl", "train --data {w}/bad/utf8.jsonl", 3,
     "utf8.jsonl: line 2: invalid UTF-8"),
    ("invalid-utf8-csv", "train --data {w}/bad/utf8.csv", 3, "utf8.csv: line 3: invalid UTF-8"),
    ("misnamed-fields", "train --data {w}/bad/misnamed.jsonl", 3,
     "no column 'source' (--source-field); columns are 'src', 'tgt'"),
    ("wrong-field-flag", "train --data {w}/good --target-field de", 3,
     "no column 'de' (--target-field)"),
    ("missing-field-in-a-row", "train --data {w}/bad/row.jsonl", 3,
     "row 2: 'target' is null or missing"),
    ("missing-cell", "train --data {w}/bad/cells.tsv", 3, "(line 3): no value for 'target'"),
    ("line-counts-differ", "train --data {w}/bad/paired --source-field en --target-field de", 3,
     "has 3 lines but"),
    ("too-long-with-strict", "train --data {w}/bad/long.jsonl --strict --max-len 16", 3,
     "(train split): pair 1: the source is"),
    ("no-data-there", "train --data {w}/bad/nothing.jsonl", 3, "no such file"),
    # tokenizer files
    ("corrupt-spm-train", "train --data {w}/good --tokenizer {w}/bad/broken.spm", 4,
     "broken.spm: not a SentencePiece model"),
    ("corrupt-spm-prepare", "prepare --data {w}/good --tokenizer {w}/bad/text.model --out p", 4,
     "text.model: not a SentencePiece model"),
    ("corrupt-spm-convert", "train-tokenizer --sentencepiece {w}/bad/broken.spm --out t.json",
     4, "broken.spm: not a SentencePiece model"),
    # options
    ("vocab-too-small", "train --data {w}/good --vocab-size 3", 2, "--vocab-size 3 is too small"),
    ("heads-do-not-divide", "train --d-model 64 --n-heads 3", 2,
     "--n-heads 3 must divide --d-model 64"),
    ("unknown-preset", "train --preset huge", 2, "--preset 'huge' is unknown"),
    ("unknown-device", "train --device tpu", 2, "--device 'tpu'"),
    ("absent-device", "train --data {w}/good --device " + _no_cuda_device(), 5,
     "--device " + _no_cuda_device()),
    ("negative-temperature", "generate {w}/run 1 --temperature -1", 2, "--temperature -1"),
    ("negative-top-k", "generate {w}/run 1 --top-k -1", 2, "--top-k -1"),
    ("top-p-zero", "generate {w}/run 1 -t 1 --top-p 0", 2, "--top-p 0"),
    ("top-p-above-one", "generate {w}/run 1 -t 1 --top-p 1.5", 2, "--top-p 1.5"),
    # checkpoints
    ("missing-checkpoint", "generate {w}/nothing 1", 4, "no such checkpoint folder"),
    ("partial-checkpoint", "generate {w}/partial 1", 4,
     "model.safetensors: listed in manifest.json but missing"),
    ("dangling-latest", "generate {w}/dangling 1", 4, "points at 'step-000400', which is missing"),
    ("foreign-checkpoint", "generate {w}/foreign 1", 4, "not a tformer checkpoint config"),
    ("checkpoint-is-a-file", "generate {w}/a-file 1", 4, "not a file"),
    ("verify-partial", "verify {w}/partial", 4, "listed in manifest.json but missing"),
    ("verify-foreign", "verify {w}/foreign", 4, "not a tformer checkpoint config"),
    ("verify-missing", "verify {w}/nothing", 4, "no such checkpoint folder"),
    ("resume-missing", "train --resume {w}/nothing", 4, "no such checkpoint folder"),
    ("resume-foreign", "train --resume {w}/foreign", 4, "not a tformer checkpoint config"),
    ("resume-unfinished", "train --resume {w}/unfinished", 4, "not a tformer checkpoint"),
    ("resume-other-tokenizer",
     "train --resume {w}/run --data {w}/good --tokenizer {w}/other-tokenizer.json", 4,
     "other-tokenizer.json differs from"),
    ("resume-other-architecture", "train --resume {w}/run --d-model 64", 2,
     "--d-model 64 (saved: "),
    ("resume-and-overwrite", "train --resume {w}/run --overwrite", 2, "give one"),
    # output folders
    ("out-holds-a-run", "train --data {w}/good --out {w}/run", 2,
     "already holds a run; --resume"),
    ("out-is-foreign", "train --data {w}/good --out {w}/foreign", 2,
     "is not a tformer run; choose another --out"),
    ("out-is-foreign-overwrite", "train --data {w}/good --out {w}/foreign --overwrite", 2,
     "--overwrite only replaces tformer runs"),
    ("out-is-a-checkpoint", "train --data {w}/good --out {w}/partial --overwrite", 2,
     "is one checkpoint of a run"),
    ("out-is-a-file", "train --data {w}/good --out {w}/a-file", 2, "exists and is a file"),
    ("out-under-a-file", "train --data {w}/good --out {w}/a-file/run", 2,
     "a-file is a file, so no folder can go there"),
    ("out-not-writable", "train --data {w}/good --out /proc/tformer-test/run " + " ".join(TINY),
     4, "/proc/tformer-test/run: cannot create the run folder"),
]  # fmt: skip


@pytest.mark.parametrize(("command", "code", "message"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_input_is_answered_clearly_and_changes_nothing(
    world: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    code: int,
    message: str,
) -> None:
    if "paired" in command and not hasattr(tformer.data.sources, "paired_text_files"):
        pytest.skip("paired text files are not supported by this tformer")
    monkeypatch.chdir(tmp_path)  # a default --out would land here: nothing may
    before = tree(world)
    args = command.format(w=world).split()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:")
    assert message in lines[0]
    assert "Traceback" not in result.output
    assert tree(world) == before
    assert not list(tmp_path.iterdir())
