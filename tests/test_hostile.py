"""Hostile inputs: every case ends in a clean answer, never a traceback, and harms nothing.

Table-driven over the real CLI (typer's CliRunner) against a real tiny trained run and a tree of
hostile files. A refusal is one line on stderr starting "error:", with the expected exit code
(2 option, 3 data, 4 checkpoint, 5 memory) and a piece of the message; every file that existed
before is byte-identical afterwards and nothing appears in the working folder. Classes: bounded
work, never a traceback, refused rather than silently wrong, messages that help (see
docs/reliability.md).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from click.testing import Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.conftest import digit_pairs, refusal_lines, write_jsonl
from tests.training.test_prepared import forge_prepared, set_value
from tformer.cli.commands import app
from tformer.cli.options import split_lines
from tformer.config import ModelConfig, TrainConfig
from tformer.data.prepare import prepare
from tformer.data.tokenizer import MAX_TEXT_CHARS, train_tokenizer
from tformer.decoding.settings import MAX_ROWS, DecodingConfig
from tformer.errors import ConfigError, DataError, TformerError
from tformer.training.run import TrainResult

HUGE = str(10**30)
LONG = " ".join(["7"] * 200)  # far over the trained model's max_len of 64 tokens
TINY = [
    "--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--d-ff", "64",
    "--max-len", "48", "--vocab-size", "60", "--max-tokens", "256", "--max-steps", "2",
]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, trained: TrainResult) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile")
    good = root / "good"
    write_jsonl(good / "train.jsonl", digit_pairs(120, seed=31))
    write_jsonl(good / "validation.jsonl", digit_pairs(10, seed=32))
    write_jsonl(good / "test.jsonl", digit_pairs(10, seed=33))
    bad = root / "bad"
    bad.mkdir()
    (bad / "unclosed.csv").write_text('source,target\n1,one\n2,"two\n3,three\n')
    (bad / "extra.csv").write_text("source,target\n1,one\n2,two,zwei\n")
    (bad / "after-quote.tsv").write_text('source\ttarget\n"1"x\tone\n')
    write_jsonl(bad / "null.jsonl", [{"source": "1", "target": "one"}])
    with open(bad / "null.jsonl", "a") as handle:
        handle.write('{"source": "2", "target": null}\n')
    write_jsonl(bad / "empty-targets.jsonl", [{"source": str(i), "target": ""} for i in range(9)])
    write_jsonl(bad / "long-line.jsonl", [{"source": "x" * 1_000_000, "target": "one"}])
    wide = [f"column_{i}_{'x' * 40}" for i in range(5000)]  # thousands of hostile names
    (bad / "many-columns.csv").write_text(",".join(wide) + "\n" + ",".join("1" * 5000) + "\n")
    write_jsonl(bad / "many-columns.jsonl", [dict.fromkeys(wide, "1")])
    two_val = bad / "two-val"
    write_jsonl(two_val / "train.jsonl", digit_pairs(20, seed=1))
    write_jsonl(two_val / "val.jsonl", digit_pairs(5, seed=2))
    write_jsonl(two_val / "validation.jsonl", digit_pairs(5, seed=3))
    two_train = bad / "two-train"
    write_jsonl(two_train / "train.jsonl", digit_pairs(20, seed=1))
    (two_train / "train.csv").write_text("source,target\n1,one\n")
    paired = bad / "paired"
    paired.mkdir()
    for prefix in ("train", "val", "dev"):
        (paired / f"{prefix}.en").write_text("1\n2\n")
        (paired / f"{prefix}.de").write_text("eins\nzwei\n")
    long_test = root / "long-test"
    write_jsonl(long_test / "train.jsonl", digit_pairs(20, seed=1))
    write_jsonl(long_test / "test.jsonl", [{"source": LONG, "target": "seven"}, *digit_pairs(4, 5)])
    (root / "a-file").write_text("a file, not a folder")
    (root / "maps.json").mkdir()  # a folder with a file's name
    fifo = root / "fifo"
    os.mkfifo(fifo)
    (root / "inputs.txt").write_text(f"3 1\n{LONG}\n9\n")
    prepare(str(good), root / "prepared", vocab_size=60)
    shutil.copytree(root / "prepared", root / "forged")  # ids outside the vocabulary, rehashed
    forge_prepared(root / "forged", set_value("train.target.ids", "<u2", 0, 65535))
    return {"w": root, "run": trained.run_dir}


def tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` with a hash of its content (FIFOs and folders by kind)."""
    out = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_dir():
            out[key] = "dir"
        elif path.is_file():
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[key] = "other"
    return out


def cli(world: dict[str, Path], command: str, **kwargs: object) -> Result:
    args = command.format(**world).split()
    return CliRunner().invoke(app, args, **kwargs)  # type: ignore[arg-type]


def refused(result: Result, code: int, message: str) -> str:
    assert result.exit_code == code, result.output
    # evaluate's progress line ("translating N pairs of test") and the line naming the
    # checkpoint used ("using RUN/step-N (latest; ...)") may come before a late refusal
    lines = refusal_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:"), lines[0]
    assert message in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert len(lines[0]) < 1000, lines[0]  # a message quotes excerpts, not whole inputs
    return lines[0]


REFUSED = [
    # option values inf / nan: exit 2 naming the flag, not a run that diverges (exit 6)
    ("temperature-inf", "generate {run} 1 --temperature inf", 2,
     "--temperature inf must be a finite"),
    ("temperature-nan", "generate {run} 1 -t nan", 2, "--temperature nan must be a finite"),
    ("top-p-nan", "generate {run} 1 -t 1 --top-p nan", 2, "--top-p nan"),
    ("min-p-inf", "generate {run} 1 -t 1 --min-p inf", 2, "--min-p inf"),
    ("repetition-inf", "generate {run} 1 --repetition-penalty inf", 2, "--repetition-penalty inf"),
    ("length-penalty-nan", "generate {run} 1 -b 2 --length-penalty nan", 2, "--length-penalty nan"),
    ("evaluate-temperature-inf", "evaluate {run} --data {w}/good --temperature inf --out {w}/x",
     2, "--temperature inf"),
    ("compare-temperature-inf", "compare {run} 1 --temperatures inf", 2, "--temperature inf"),
    ("train-lr-inf", "train --data {w}/good --lr inf", 2, "--lr inf must be a finite"),
    ("train-lr-nan", "train --data {w}/good --lr nan", 2, "--lr nan"),
    ("train-label-smoothing-nan", "train --data {w}/good --label-smoothing nan", 2,
     "--label-smoothing nan"),
    ("train-dropout-inf", "train --data {w}/good --dropout inf", 2, "--dropout inf"),
    ("train-clip-norm-inf", "train --data {w}/good --clip-norm inf", 2, "--clip-norm inf"),
    ("train-epochs-inf", "train --data {w}/good --epochs inf", 2, "--epochs inf"),
    # huge ints: one line naming the flag and the bound, before anything is allocated
    ("generate-seed-huge", "generate {run} 1 -t 1 --seed " + HUGE, 2, "--seed " + HUGE),
    ("generate-seed-negative", "generate {run} 1 -t 1 --seed -1", 2, "use a seed from 0"),
    ("num-samples-huge", "generate {run} 1 -t 1 -n 100000000", 2,
     f"--num-samples 100000000 is over {MAX_ROWS}"),
    ("beam-size-huge", "generate {run} 1 -b 1000000", 2, f"--beam-size 1000000 is over {MAX_ROWS}"),
    ("batch-size-huge", "generate {run} 1 --batch-size 1000000", 2, "lower --batch-size"),
    ("max-new-tokens-huge", "generate {run} 1 --max-new-tokens " + HUGE, 2,
     "--max-new-tokens " + HUGE + " is out of range; the largest accepted is 2,147,483,647"),
    ("top-k-huge", "generate {run} 1 -t 1 --top-k " + HUGE, 2, "--top-k"),
    ("evaluate-batch-size-zero", "evaluate {run} --data {w}/good --batch-size 0 --out {w}/x", 2,
     "--batch-size 0 must be >= 1"),
    ("inspect-seed-huge", "inspect-attention {run} 1 -t 1 --seed " + HUGE, 2, "--seed"),
    ("train-seed-huge", "train --data {w}/good --seed " + HUGE, 2, "--seed " + HUGE),
    ("train-max-tokens-huge", "train --data {w}/good --max-tokens " + HUGE, 2, "--max-tokens"),
    ("train-d-model-huge", "train --data {w}/good --d-model " + HUGE, 2, "--d-model"),
    ("train-nproc-huge", "train --data {w}/good --nproc 1000000", 2, "--nproc 1000000 must be"),
    ("train-threads-huge", "train --data {w}/good --threads " + HUGE, 2, "--threads"),
    # negative counts
    ("min-frequency-negative", "train-tokenizer --data {w}/good --min-frequency -1 -o {w}/t.json",
     2, "--min-frequency -1"),
    ("vocab-size-huge", "train-tokenizer --data {w}/good --vocab-size " + HUGE + " -o {w}/t.json",
     2, "--vocab-size"),
    # an --out / --save where a folder is expected
    ("evaluate-out-is-a-file", "evaluate {run} --data {w}/good --out {w}/a-file", 2,
     "exists and is a file"),
    ("evaluate-out-under-a-file", "evaluate {run} --data {w}/good --out {w}/a-file/eval", 2,
     "a-file is a file, so no folder can go there"),
    ("save-under-a-file", "inspect-attention {run} 1 --save {w}/a-file/map.png", 2,
     "a-file is a file"),
    ("save-is-a-folder", "inspect-attention {run} 1 --save {w}/maps.json", 2, "is a folder"),
    ("evaluate-out-not-writable", "evaluate {run} --data {w}/good --out /proc/tformer-test/eval",
     4, "--out /proc/tformer-test/eval: cannot be written"),
    ("save-not-writable", "inspect-attention {run} 1 --save /proc/tformer-test/map.json", 4,
     "--save /proc/tformer-test/map.json: cannot be written"),
    ("tokenizer-out-is-a-folder", "train-tokenizer --data {w}/good -o {w}/good", 2, "is a folder"),
    ("tokenizer-out-under-a-file", "train-tokenizer --data {w}/good -o {w}/a-file/t.json", 2,
     "a-file is a file"),
    # malformed data is named, not read wrongly
    ("csv-unclosed-quote", "train --data {w}/bad/unclosed.csv", 3, "unclosed.csv: line"),
    ("csv-extra-cell", "train --data {w}/bad/extra.csv", 3,
     "extra.csv: row 2 (line 3): 3 cells but the header has 2 columns"),
    ("tsv-text-after-quote", "train --data {w}/bad/after-quote.tsv", 3, "invalid TSV"),
    ("two-validation-files", "train --data {w}/bad/two-val", 3, "two files for the validation"),
    ("two-train-files", "train --data {w}/bad/two-train", 3, "two files for the train split"),
    ("two-paired-validation-files", "train --data {w}/bad/paired --src-lang en --tgt-lang de",
     3, "dev.en and"),
    ("json-null-target", "train --data {w}/bad/null.jsonl", 3, "row 2: 'target' is null"),
    # a few names, each cut, then a count: one short line for thousands of columns
    ("csv-thousands-of-columns", "train --data {w}/bad/many-columns.csv", 3,
     "columns are 'column_0_xxx"),
    ("json-thousands-of-columns", "train --data {w}/bad/many-columns.jsonl", 3,
     "and 4,997 more"),
    ("data-is-a-fifo", "train --data {w}/fifo", 3, "not a regular file"),
    ("input-file-is-a-fifo", "generate {run} --input-file {w}/fifo", 2, "not a regular file"),
    ("all-targets-empty", "train --data {w}/bad/empty-targets.jsonl " + " ".join(TINY), 3,
     "has an empty source or target"),
    ("one-megabyte-line", "train-tokenizer --data {w}/bad/long-line.jsonl -o {w}/t.json", 3,
     f"text 1 is 1,000,000 characters, over the {MAX_TEXT_CHARS:,}"),
    # text that is not valid Unicode (what Python makes of bytes that are not UTF-8 in argv)
    ("generate-not-utf8", "generate {run} 1 7\udcff", 2, "TEXTS 2: not valid Unicode text"),
    ("compare-not-utf8", "compare {run} \udcff", 2, "TEXTS: not valid Unicode"),
    ("inspect-not-utf8", "inspect-attention {run} 1\udc80", 2, "TEXT: not valid Unicode"),
    ("score-not-utf8", "score {run} 1 one\udcff", 2, "REFERENCE: not valid Unicode"),
    ("fill-mask-not-utf8", "fill-mask {run} \ud800", 2, "TEXT: not valid Unicode"),
    ("generate-target-not-utf8", "generate {run} 1 --device \udcff", 2, "--device: not valid"),
    ("train-data-not-utf8", "train --data \udcff", 2, "--data: not valid Unicode"),
    ("evaluate-field-not-utf8", "evaluate {run} --data {w}/good --source-field \udcff", 2,
     "--source-field: not valid Unicode"),
    ("align-not-utf8", "align {run} --data \udcff", 2, "--data: not valid Unicode"),
    ("train-tokenizer-not-utf8", "train-tokenizer --data {w}/good --kind \udcff -o {w}/t.json",
     2, "--kind: not valid Unicode"),
    # prepared folders: checked against what training needs; options they make meaningless
    ("prepared-forged-ids", "train --data {w}/forged --out {w}/r " + " ".join(TINY), 3,
     "train.target: id 65535 (token 1) is outside the vocabulary of 60"),
    ("prepared-vocab-size", "train --data {w}/prepared --out {w}/r --vocab-size 8000", 2,
     "--vocab-size 8000 (it was prepared with 60) would do nothing"),
    ("prepared-num-proc-dry-run", "train --data {w}/prepared --num-proc 2 --dry-run", 2,
     "--num-proc would do nothing"),
    ("prepare-over-prepared", "prepare --data {w}/good --out {w}/prepared", 2,
     "exists and is not empty; give --overwrite"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("command", "code", "message"), [c[1:] for c in REFUSED],
                         ids=[c[0] for c in REFUSED])  # fmt: skip
def test_hostile_input_is_refused_in_one_line_and_changes_nothing(
    world: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    code: int,
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)  # a default --out would land here: nothing may
    before = tree(world["w"]), tree(world["run"])
    started = time.monotonic()
    line = refused(cli(world, command), code, message)
    assert time.monotonic() - started < 60, "a refusal must come quickly"
    assert "--max-len" not in line or "empty" not in line  # empty data is not blamed on length
    assert (tree(world["w"]), tree(world["run"])) == before
    assert not list(tmp_path.iterdir())


# -- inputs longer than the model's max_len: read up to max_len, with one warning line --------


LONG_INPUTS = [
    ("generate", "generate {run} 3 '{long}' 9", 3),
    ("generate-beam", "generate {run} 3 '{long}' -b 2", 2),
    ("generate-sampling", "generate {run} '{long}' -t 1 -n 2 --seed 1", 2),
    ("generate-input-file", "generate {run} --input-file {w}/inputs.txt", 3),
    ("generate-stream", "generate {run} '{long}' --stream", 1),
    ("generate-explain", "generate {run} '{long}' --explain", None),
    ("compare", "compare {run} '{long}' --json", None),
    ("inspect-attention", "inspect-attention {run} '{long}'", None),
]


@pytest.mark.parametrize(("command", "lines"), [c[1:] for c in LONG_INPUTS],
                         ids=[c[0] for c in LONG_INPUTS])  # fmt: skip
def test_inputs_longer_than_max_len_are_cut_with_one_warning(
    world: dict[str, Path], command: str, lines: int | None
) -> None:
    import shlex

    before = tree(world["run"])
    args = shlex.split(command.format(long=LONG, **world))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.stderr
    assert "longer than the model's max_len of 64 tokens" in warnings[0]
    assert "only their first 64 tokens were read" in warnings[0]
    if lines is not None:
        assert len(result.stdout.splitlines()) == lines, result.stdout
    assert tree(world["run"]) == before


def test_evaluate_reads_a_long_source_up_to_max_len(world: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "eval"
    result = cli(world, f"evaluate {{run}} --data {{w}}/long-test --out {out}")
    assert result.exit_code == 0, result.output
    assert "1 of 5 inputs are longer than the model's max_len of 64 tokens (input 1" in (
        result.stderr.replace("\n", " ")
    )
    assert len((out / "hypotheses.txt").read_text().splitlines()) == 5


def test_inspect_attention_says_a_long_target_was_cut(
    world: dict[str, Path], tmp_path: Path
) -> None:
    saved = tmp_path / "maps.json"
    args = ["inspect-attention", str(world["run"]), "3", "--target", LONG, "--save", str(saved)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.stderr
    given = re.fullmatch(
        r"warning: --target has (\d+) tokens; with <bos> the model's max_len of 64 leaves room "
        r"for 63, so only its first 63 tokens were read",
        warnings[0],
    )
    assert given is not None and int(given[1]) > 200, warnings[0]
    assert len(json.loads(saved.read_text())["rows"]) == 64  # <bos> and the 63 read


def test_a_short_input_gives_no_warning(world: dict[str, Path]) -> None:
    result = cli(world, "generate {run} 3")
    assert result.exit_code == 0, result.output
    assert refusal_lines(result.stderr) == [], result.stderr


# -- lines: only "\n" and "\r\n" end an input ------------------------------------------------


def test_split_lines_splits_only_on_newline() -> None:
    text = "1\x0b2\n3\u20284\r\n5\x1c6\r7\n\n8"
    assert split_lines(text) == ["1\x0b2", "3\u20284", "5\x1c6\r7", "", "8"]
    assert split_lines("") == []
    assert split_lines("a\n") == ["a"]


@pytest.mark.parametrize("source", ["stdin", "file"])
def test_outputs_line_up_with_input_lines(
    world: dict[str, Path], tmp_path: Path, source: str
) -> None:
    text = "3 1\x0b4\n2\u20287\r\n9\x1c1\n5\n"
    if source == "file":
        path = tmp_path / "in.txt"
        path.write_bytes(text.encode())
        result = cli(world, f"generate {{run}} --input-file {path}")
    else:
        result = CliRunner().invoke(app, ["generate", str(world["run"])], input=text.encode())
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 4, result.stdout


# -- out of memory: exit 5 naming the flag to lower, in every command ---------------------------


def _raise(error: BaseException) -> object:
    def fail(*args: object, **kwargs: object) -> object:
        raise error

    return fail


OOM = [
    ("generate", "tformer.cli.generate.translate", "generate {run} 3 9",
     torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
     "lower --batch-size, --beam-size or --num-samples"),
    ("generate-memoryerror", "tformer.cli.generate.translate", "generate {run} 3 9",
     MemoryError(), "lower --batch-size"),
    ("evaluate", "tformer.cli.evaluate.evaluate", "evaluate {run} --data {w}/good --out {w}/x",
     RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory"),
     "lower --batch-size or --beam-size"),
    ("compare", "tformer.cli.compare.translate", "compare {run} 3",
     torch.OutOfMemoryError("out of memory"), "lower --batch-size"),
    ("inspect-attention", "tformer.cli.inspect_attention.inspect_attention",
     "inspect-attention {run} 3", torch.OutOfMemoryError("out of memory"), "the input's length"),
    ("align", "tformer.cli.align.align", "align {run} --data {w}/good --out {w}/x.align",
     torch.OutOfMemoryError("out of memory"), "lower --max-tokens (or --limit)"),
]  # fmt: skip


@pytest.mark.parametrize(("target", "command", "error", "message"), [c[1:] for c in OOM],
                         ids=[c[0] for c in OOM])  # fmt: skip
def test_out_of_memory_is_exit_5_naming_the_flag(
    world: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    target: str,
    command: str,
    error: BaseException,
    message: str,
) -> None:
    monkeypatch.setattr(target, _raise(error))
    before = tree(world["w"]), tree(world["run"])
    line = refused(cli(world, command), 5, message)
    assert "ran out of memory" in line
    assert (tree(world["w"]), tree(world["run"])) == before


def test_other_runtime_errors_are_not_taken_for_out_of_memory(
    world: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tformer.cli.generate.translate", _raise(RuntimeError("a real bug")))
    result = cli(world, "generate {run} 3 9")
    assert isinstance(result.exception, RuntimeError)  # a bug stays visible, not disguised


# -- bounded work ----------------------------------------------------------------------------


def test_a_one_megabyte_line_is_refused_quickly() -> None:
    started = time.monotonic()
    with pytest.raises(DataError, match="text 2 is 1,000,000 characters"):
        train_tokenizer(["1 2 3", "a" * 1_000_000], vocab_size=100)
    assert time.monotonic() - started < 30


def test_a_long_word_under_the_limit_trains_quickly() -> None:
    import random

    rng = random.Random(0)
    word = "".join(rng.choice("abcdefghij") for _ in range(MAX_TEXT_CHARS))
    started = time.monotonic()
    tok = train_tokenizer([word, "one two three"], vocab_size=200)
    assert time.monotonic() - started < 60
    assert tok.decode(tok.encode("one two")) == "one two"


# -- property tests: any option value is a clean refusal or a valid run ----------------------

FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.inf, -math.inf, math.nan, 0.0, 0.5, 1.0, 2.0]),
)
INTS = st.one_of(
    st.integers(-3, 8),
    st.integers(-(10**30), 10**30),
    st.sampled_from([MAX_ROWS, MAX_ROWS + 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64]),
)
FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "length_penalty")
INT_FIELDS = ("top_k", "no_repeat_ngram_size", "beam_size", "n_best", "min_new_tokens",
              "max_new_tokens", "num_samples", "seed")  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    floats=st.fixed_dictionaries({}, optional={name: FLOATS for name in FLOAT_FIELDS}),
    ints=st.fixed_dictionaries({}, optional={name: INTS for name in INT_FIELDS}),
)
def test_decoding_config_refuses_cleanly_or_holds_sane_values(
    floats: dict[str, float], ints: dict[str, int]
) -> None:
    try:
        config = DecodingConfig(**floats, **ints)
    except ConfigError as error:
        assert "\n" not in str(error)
        return
    for name in FLOAT_FIELDS:
        assert math.isfinite(getattr(config, name))
    assert 1 <= config.beam_size <= MAX_ROWS and 1 <= config.num_samples <= MAX_ROWS
    assert config.seed is None or 0 <= config.seed < 2**63


TRAIN_FLOATS = ("lr", "min_lr", "beta1", "beta2", "eps", "weight_decay", "label_smoothing",
                "clip_norm", "epochs", "time_budget", "ema_decay")  # fmt: skip
TRAIN_INTS = ("max_tokens", "accumulate", "warmup_steps", "max_steps", "val_bleu", "patience",
              "eval_every", "save_every", "log_every", "keep_last", "seed")  # fmt: skip
MODEL_NUMBERS = {"d_model": INTS, "n_heads": INTS, "d_ff": INTS, "max_len": INTS,
                 "n_encoder_layers": INTS, "dropout": FLOATS,
                 "attention_dropout": FLOATS}  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    train=st.fixed_dictionaries(
        {}, optional={**{n: FLOATS for n in TRAIN_FLOATS}, **{n: INTS for n in TRAIN_INTS}}
    ),
    model=st.fixed_dictionaries({}, optional=MODEL_NUMBERS),
)
def test_train_and_model_configs_refuse_cleanly(
    train: dict[str, float], model: dict[str, float]
) -> None:
    for cls, values in ((TrainConfig, train), (ModelConfig, model)):
        try:
            config = cls(**values)
        except ConfigError as error:
            assert "\n" not in str(error)
            continue
        for name, value in values.items():
            if isinstance(value, float):
                assert math.isfinite(getattr(config, name))


CLI_FLOATS = st.one_of(st.sampled_from(["inf", "-inf", "nan", "0", "0.5", "1", "1e308", "-1"]),
                       st.floats(-3, 3).map(str))  # fmt: skip
CLI_INTS = st.one_of(st.integers(-2, 4).map(str),
                     st.sampled_from([HUGE, "-" + HUGE, str(MAX_ROWS + 1), str(2**63),
                                      "1000000000"]))  # fmt: skip
GENERATE_NUMBERS = {
    "--temperature": CLI_FLOATS, "--top-p": CLI_FLOATS, "--min-p": CLI_FLOATS,
    "--repetition-penalty": CLI_FLOATS, "--length-penalty": CLI_FLOATS, "--top-k": CLI_INTS,
    "--no-repeat-ngram-size": CLI_INTS, "--beam-size": CLI_INTS, "--n-best": CLI_INTS,
    "--min-new-tokens": CLI_INTS, "--max-new-tokens": CLI_INTS, "--num-samples": CLI_INTS,
    "--seed": CLI_INTS, "--batch-size": CLI_INTS,
}  # fmt: skip


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(options=st.fixed_dictionaries({}, optional=GENERATE_NUMBERS))
def test_generate_any_numeric_options_refuse_cleanly_or_run(
    trained: TrainResult, options: dict[str, str]
) -> None:
    args = ["generate", str(trained.run_dir), "3 1", "7"]
    for option, value in options.items():
        args += [option, value] if not value.startswith("-") else [f"{option}={value}"]
    result = CliRunner().invoke(app, args)
    assert "Traceback" not in result.output
    if result.exit_code == 0:
        assert len(result.stdout.splitlines()) >= 2
        return
    assert result.exit_code == 2, (args, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr


def test_tformer_errors_are_the_only_refusals() -> None:
    # The property tests above catch ConfigError only: a refusal of another kind would fail them.
    assert issubclass(ConfigError, TformerError) and ConfigError.exit_code == 2
    with pytest.raises(ConfigError, match="--temperature inf"):
        DecodingConfig(temperature=math.inf)
    with pytest.raises(ConfigError, match="--seed"):
        TrainConfig(seed=2**64)
    assert json.loads(json.dumps(TrainConfig(seed=2**63 - 1).to_dict()))["seed"] == 2**63 - 1


# -- messages: nothing from the libraries before the red line ----------------------------------


@pytest.mark.slow
def test_a_hub_failure_is_one_line_without_library_logs(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = str(Path(__file__).parents[1])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": root}  # fmt: skip
    env.pop("HF_DATASETS_VERBOSITY", None)
    result = subprocess.run(
        [sys.executable, "-m", "tformer", "train", "--data", "no-such-owner/no-such-set-x1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: --data no-such-owner/no-such-set-x1: not a local file")
    assert not (tmp_path / "checkpoints").exists()


def test_save_into_a_missing_folder_makes_it(world: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "new" / "folder" / "map.json"
    result = cli(world, f"inspect-attention {{run}} 3 --save {target}")
    assert result.exit_code == 0, result.output
    assert json.loads(target.read_text())


# -- config files: every value of its field's type, the YAML itself bounded (issue 36) ----------


def _laughs(levels: int = 9) -> str:
    """The "billion laughs": each alias holds nine of the one before (9**9 strings)."""
    lines = ["  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        name, previous = chr(97 + i), chr(96 + i)
        lines.append(f"  {name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]")
    return "model:\n" + "\n".join(lines) + "\n"


CONFIGS = [
    ("bool-as-int", "model:\n  n_heads: true\n", "model.n_heads: true is a boolean, not a whole"),
    ("float-as-steps", "train:\n  max_steps: 2.5\n", "train.max_steps: 2.5 is a fractional"),
    ("string-as-number", "train:\n  lr: '3e-4'\n", "train.lr: '3e-4' is a string, not a number"),
    ("list-as-scalar", "model:\n  d_model: [64]\n", "model.d_model: [64] is a list"),
    ("mapping-as-scalar", "train:\n  seed: {a: 1}\n", "train.seed: {'a': 1} is a mapping"),
    ("int-as-bool", "model:\n  tie_embeddings: 1\n", "model.tie_embeddings: 1 is a whole number, "
     "not true or false"),
    ("int-as-choice", "model:\n  norm: 1\n", "model.norm: 1 is a whole number, not one of post"),
    ("date-as-path", "train:\n  data: 2024-01-01\n", "train.data: datetime.date(2024, 1, 1) is a"),
    ("binary-as-path", "train:\n  data: !!binary aGk=\n", "train.data: b'hi' is binary data"),
    ("tokenizer-bool", "tokenizer:\n  vocab_size: false\n", "tokenizer.vocab_size: false"),
    ("inf", "train:\n  lr: .inf\n", "train.lr inf must be a finite number"),
    ("nan", "train:\n  clip_norm: .nan\n", "train.clip_norm nan must be a finite number"),
    ("huge-int", "train:\n  seed: " + "9" * 40 + "\n", "train.seed 9999"),
    ("nul-in-path", 'train:\n  data: "a\\0b"\n', "train.data: 'a\\x00b' holds a NUL character"),
    ("surrogate", 'train:\n  data: "a\\udc80"\n', "train.data: not valid Unicode text"),
    ("section-scalar", "model: 5\n", "model is a whole number, not keys with values"),
    ("top-level-list", "- model\n", "expected sections model, train, tokenizer, found a list"),
    ("billion-laughs", _laughs(), "aliases (*name) are not accepted"),
    ("alias", "train:\n  lr: &x 0.1\n  min_lr: *x\n", "aliases (*name) are not accepted"),
    ("duplicate-key", "model:\n  d_model: 64\n  d_model: 128\n", "duplicate key 'd_model' (line 3"),
    ("duplicate-section", "model: {}\nmodel: {}\n", "duplicate key 'model'"),
    ("deep-nesting", "model: " + "[" * 50_000 + "]" * 50_000 + "\n", "nested deeper than"),
    ("giant-string", "train:\n  data: " + "x" * 100_000 + "\n", "a value of 100,000 characters"),
    ("giant-integer", "train:\n  seed: " + "9" * 100_000 + "\n", "a value of 100,000 characters"),
    ("huge-file", "# " + "x" * 2_000_000 + "\n", "over 1,048,576 bytes"),
    ("python-tag", "model: !!python/object/apply:os.system [true]\n", "could not determine a "
     "constructor"),
    ("two-documents", "model: {}\n---\ntrain: {}\n", "but found another document"),
    ("out-of-range", "model:\n  dropout: 1.5\n", "model.dropout: --dropout 1.5 must be in [0, 1)"),
    ("empty-string", "train:\n  source_field: ''\n", "train.source_field: an empty string"),
    ("max-len-huge", "model:\n  max_len: 2000000000\n", "--max-len 2000000000 is over"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in CONFIGS],
                         ids=[c[0] for c in CONFIGS])  # fmt: skip
def test_a_hostile_config_file_is_refused_naming_the_file_and_the_key(
    world: dict[str, Path], tmp_path: Path, text: str, message: str
) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(text, encoding="utf-8")
    before = tree(tmp_path)
    started = time.monotonic()
    line = refused(cli(world, f"train --data {{w}}/good --out {tmp_path}/out --config {config}"),
                   2, message)  # fmt: skip
    assert time.monotonic() - started < 20, "a refusal must come quickly"
    assert f"--config {config}" in line
    assert tree(tmp_path) == before


@pytest.mark.parametrize(("bad", "message"), [
    ({"n_heads": True}, "--n-heads: true is a boolean"),
    ({"d_model": 64.0}, "--d-model: 64.0 is a floating-point number, not a whole"),
    ({"dropout": "0.1"}, "--dropout: '0.1' is a string"),
    ({"kv_heads": [1]}, "--kv-heads: [1] is a list, not a whole number or null"),
    ({"arch": None}, "--arch: null is null, not one of encoder-decoder"),
])  # fmt: skip
def test_configs_built_in_python_check_their_types(bad: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ModelConfig(**bad)  # type: ignore[arg-type]


def test_whole_numbers_for_float_fields_become_floats() -> None:
    config = TrainConfig(lr=1, min_lr=0)
    assert type(config.lr) is float and type(config.min_lr) is float
    assert DecodingConfig(temperature=1).temperature == 1.0
    with pytest.raises(ConfigError, match="--max-steps: 2.5 is a fractional number"):
        TrainConfig(max_steps=2.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--top-k: true is a boolean"):
        DecodingConfig(top_k=True)


def test_a_printed_config_reads_back(tmp_path: Path) -> None:
    from tformer.training.configs import TokenizerSpec, dump_config, read_config_file

    model, train = ModelConfig(dropout=0.0), TrainConfig(time_budget=90.0, lr=1e-3)
    (tmp_path / "run.yaml").write_text(dump_config(model, train, TokenizerSpec()))
    sections = read_config_file(tmp_path / "run.yaml")
    assert ModelConfig(**sections["model"]) == model
    assert TrainConfig(**sections["train"]) == train


# -- text that is not valid Unicode, refused by the library too -------------------------------


def test_every_tokenizer_encode_refuses_text_that_is_not_unicode(trained: TrainResult) -> None:
    from tformer.checkpoint.store import load_checkpoint
    from tformer.config import check_text

    tokenizer = load_checkpoint(trained.run_dir).tokenizers.source
    bad = "3 \udcff 4"
    for call, where in ((lambda: tokenizer.encode(bad), "the text"),
                        (lambda: tokenizer.encode_batch(["1", bad]), "text 2"),
                        (lambda: tokenizer.encode_packed([bad]), "the text"),
                        (lambda: tokenizer.encodings(["1", "2", bad]), "text 3")):  # fmt: skip
        with pytest.raises(DataError, match=f"{where}: not valid Unicode text .*U\\+DCFF at "
                           "character 2"):  # fmt: skip
            call()
    assert tokenizer.encode_batch(["3 4"]) == [tokenizer.encode("3 4")]  # valid text: as before
    assert check_text("日本 \U0001f600", "x") == "日本 \U0001f600"  # astral characters are fine
    with pytest.raises(DataError, match="x: not valid Unicode"):
        check_text("\ud83d", "x")  # half of a pair
    with pytest.raises(DataError, match="tokenizer training text: text 2: not valid Unicode"):
        train_tokenizer(["1 2", "3 \udc80"], vocab_size=40)


def test_interactive_generate_refuses_one_bad_line_and_goes_on(world: dict[str, Path]) -> None:
    result = cli(world, "generate {run} --interactive", input=b"1 2\n\xff 3\n4\n")
    assert result.exit_code == 0, result.output
    assert "error: this line: not valid Unicode" in result.stderr
    assert len([x for x in result.stdout.splitlines() if x.strip()]) == 2
