"""`tformer prepare` and training on a prepared folder: the same ids, batches and run as
training on the text, a run that survives kill -9, and files changed afterwards refused."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.training.test_resume import (
    assert_same_run,
    logged_step,
    reference,  # noqa: F401 (a fixture)
    resume_in_process,
    small_data,  # noqa: F401 (a fixture)
    start,
    train_args,
    wait_for,
)
from tformer.checkpoint.run_dir import resolve
from tformer.checkpoint.training_state import saved_data_fingerprint
from tformer.cli.commands import app
from tformer.data.batching import BatchPlan
from tformer.data.pairs import encode_pairs
from tformer.data.prepare import prepare
from tformer.data.prepared import MANIFEST, PREPARED, open_prepared
from tformer.data.sources import load_text_pairs
from tformer.data.tokenizer import Tokenizer
from tformer.errors import ConfigError, DataError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def prepared(small_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("prepared") / "small"
    code, output = run_cli("prepare", "--data", str(small_data), "--out", str(out),
                           "--vocab-size", "60")  # fmt: skip
    assert code == 0, output
    assert "train: 300 pairs tokenised" in output  # the progress line off a terminal
    return out


def test_the_folder_holds_the_ids_train_would_make_and_lists_every_file(
    prepared: Path, small_data: Path  # noqa: F811
) -> None:
    folder = open_prepared(prepared)
    texts = load_text_pairs(str(small_data))
    tok = folder.tokenizers[0]
    assert folder.tokenizers[1] is tok and tok.vocab_size <= 60
    for split in ("train", "validation"):
        expected = encode_pairs(texts[split], tok, tok, folder.max_len)
        got = folder.split(split, folder.max_len, strict=False)
        assert list(got.pairs) == list(expected.pairs)
        assert got.dropped == expected.dropped
        if split == "validation":
            assert list(got.texts) == list(expected.texts)
    listed = PREPARED.files_of(prepared)
    assert listed == {p.name for p in prepared.iterdir()}
    assert folder.manifest["dtype"] == "<u2"  # a small vocabulary takes 2 bytes a token


def test_batches_equal_those_from_the_text(prepared: Path, small_data: Path) -> None:  # noqa: F811
    folder = open_prepared(prepared)
    tok = folder.tokenizers[0]
    from_text = encode_pairs(load_text_pairs(str(small_data))["train"], tok, tok, 48)
    from_folder = folder.split("train", 48, strict=False)
    a, b = BatchPlan(from_text.pairs, 256, seed=7), BatchPlan(from_folder.pairs, 256, seed=7)
    for epoch in (0, 1):
        assert [x.tolist() for x in a.epoch(epoch)] == [x.tolist() for x in b.epoch(epoch)]
    for x, y in zip(a.batches(1), b.batches(1), strict=True):
        for k in ("src", "tgt_in", "tgt_out"):
            assert np.array_equal(getattr(x, k), getattr(y, k))
    assert len(from_folder.pairs.source.maps) == 2  # ids and offsets read from disk, not copied
    from_folder.pairs.release()  # pages let go of: the ids read the same afterwards
    assert list(from_folder.pairs) == list(from_text.pairs)


@pytest.mark.slow
def test_training_on_it_follows_the_text_run_through_kill_9_and_resume(
    prepared: Path, reference: Path, tmp_path: Path  # noqa: F811
) -> None:
    """The reference run trained on the text; this one on the folder, killed and resumed."""
    run = tmp_path / "run"
    kill_at = random.Random(7).randint(5, 30)
    proc = start(train_args(prepared, run), tmp_path / "first")
    wait_for(lambda: logged_step(run) >= kill_at, proc, tmp_path / "first", f"step {kill_at}")
    proc.kill()
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    resume_in_process(run)
    assert_same_run(run, reference)
    # The same data in both forms: their fingerprints agree, so either resumes the other.
    ours, theirs = (saved_data_fingerprint(resolve(r)) for r in (run, reference))
    assert ours is not None and ours["splits"] == theirs["splits"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda p: _flip_a_byte(p / "train.source.ids"), "'train.source.ids' changed after"),
        (lambda p: (p / "train.target.lengths").write_bytes(b""), "'train.target.lengths' changed"),
        (lambda p: (p / "validation.texts.jsonl").unlink(), "'validation.texts.jsonl' is missing"),
        (lambda p: (p / MANIFEST).write_text("{"), f"{MANIFEST} is damaged"),
        (lambda p: _edit_manifest(p, files=["../../etc/passwd"]), f"{MANIFEST} is damaged"),
        (lambda p: _edit_manifest(p, splits={"../x": {}, "train": {}}), "every split"),
        (lambda p: _edit_manifest(p, tokenizers={"source": "../t.json", "target": "../t.json"}),
         "no listed tokenizer"),
    ],
    ids=["same-size edit", "truncated", "missing", "manifest", "path in files",
         "path in splits", "path in tokenizers"],
)
def test_a_file_changed_after_preparing_is_refused(
    prepared: Path, tmp_path: Path, damage: object, named: str
) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(prepared, copy)
    damage(copy)  # type: ignore[operator]
    code, output = run_cli("train", "--data", str(copy), "--out", str(tmp_path / "run"),
                           "--preset", "tiny", "--max-steps", "2")  # fmt: skip
    assert code == 3, output
    assert named in output and "prepare the data again" in output
    assert "Traceback" not in output and not (tmp_path / "run").exists()


def _edit_manifest(folder: Path, **fields: object) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest.update(fields)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def test_a_tokenizer_other_than_the_folders_is_refused(
    prepared: Path, small_data: Path, tmp_path: Path  # noqa: F811
) -> None:
    other = tmp_path / "other.json"
    run_cli("train-tokenizer", "--data", str(small_data), "--vocab-size", "50", "-o", str(other))
    code, output = run_cli("train", "--data", str(prepared), "--tokenizer", str(other),
                           "--out", str(tmp_path / "run"), "--max-steps", "1")  # fmt: skip
    assert code == 3 and "is not the tokenizer" in output, output
    # Fine-tuning a checkpoint on ids of another tokenizer: refused, not retokenised.
    base = tmp_path / "base"
    code, output = run_cli("train", "--data", str(small_data), "--tokenizer", str(other),
                           "--out", str(base), "--preset", "tiny", "--max-steps", "1")  # fmt: skip
    assert code == 0, output
    code, output = run_cli("train", "--data", str(prepared), "--init-from", str(base),
                           "--out", str(tmp_path / "tuned"), "--max-steps", "1")  # fmt: skip
    assert code == 3 and "prepared with another tokenizer" in output, output
    assert not (tmp_path / "tuned").exists()


def test_a_smaller_max_len_at_training_drops_and_counts(prepared: Path) -> None:
    folder = open_prepared(prepared)
    full = folder.split("train", folder.max_len, strict=False)
    lengths = np.maximum(*[x.astype(int) for x in full.pairs.lengths()])
    limit = int(np.median(lengths))
    cut = folder.split("train", limit, strict=False)
    src, tgt = full.pairs.lengths()
    fits = (src <= limit) & (tgt + 1 <= limit)
    assert len(cut.pairs) == int(fits.sum()) and cut.dropped == int((~fits).sum())
    assert list(cut.pairs) == [full.pairs[i] for i in np.flatnonzero(fits)]
    with pytest.raises(DataError, match="--strict"):
        folder.split("train", limit, strict=True)


def test_out_is_written_whole_or_not_at_all(small_data: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "deep" / "er" / "out"
    with pytest.raises(DataError, match="pair 1: .* --strict"):
        prepare(str(small_data), out, vocab_size=60, max_len=3, strict=True)
    assert not (tmp_path / "deep").exists()  # nothing left, not even the parents it made
    prepare(str(small_data), out, vocab_size=60)
    first = (out / MANIFEST).read_text()
    with pytest.raises(ConfigError, match="--overwrite"):
        prepare(str(small_data), out, vocab_size=60)
    prepare(str(small_data), out, vocab_size=60, overwrite=True)  # an earlier one: replaced
    assert (out / MANIFEST).read_text() == first  # deterministic
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="notes.txt"):
        prepare(str(small_data), out, vocab_size=60, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"
    with pytest.raises(DataError, match="already a prepared folder"):
        prepare(str(out), tmp_path / "again")


def test_the_tokenizer_is_trained_on_a_sample(small_data: Path, tmp_path: Path) -> None:  # noqa: F811
    from tformer.data.columns import sample_rows
    from tformer.data.tokenizer import train_tokenizer

    folder = prepare(str(small_data), tmp_path / "p", vocab_size=60, tokenizer_sample=40)
    pairs = load_text_pairs(str(small_data))["train"]
    chosen = sample_rows(pairs, 40, 0)
    remaining = iter(pairs)
    assert len(chosen) == 40 and all(pair in remaining for pair in chosen)  # kept in order
    assert list(sample_rows(pairs, 40, 0)) == list(chosen) != list(sample_rows(pairs, 40, 1))
    expected = train_tokenizer((t for p in chosen for t in p), vocab_size=60)
    assert folder.tokenizers[0].sha256() == expected.sha256()
    whole = Tokenizer.load(prepare(str(small_data), tmp_path / "q", vocab_size=60).folder
                           / "tokenizer.json")  # fmt: skip
    assert whole.sha256() != expected.sha256()


def test_train_trains_its_tokenizer_on_a_sample_too(
    small_data: Path, tmp_path: Path  # noqa: F811
) -> None:
    from tformer.data.columns import sample_rows
    from tformer.data.tokenizer import train_tokenizer

    code, output = run_cli("train", "--data", str(small_data), "--preset", "tiny",
                           "--vocab-size", "60", "--tokenizer-sample", "40", "--max-steps", "1",
                           "--out", str(tmp_path / "run"))  # fmt: skip
    assert code == 0, output
    chosen = sample_rows(load_text_pairs(str(small_data))["train"], 40, 0)
    expected = train_tokenizer((t for p in chosen for t in p), vocab_size=60)
    saved = Tokenizer.load(resolve(tmp_path / "run") / "tokenizer.json")
    assert saved.sha256() == expected.sha256()
    code, output = run_cli("train", "--data", str(small_data), "--tokenizer-sample", "0",
                           "--out", str(tmp_path / "bad"))  # fmt: skip
    assert code == 2 and "--tokenizer-sample 0 must be at least 1 pair" in output
    assert not (tmp_path / "bad").exists()


def forge_prepared(folder: Path, edit: Callable[[Path], object]) -> None:
    """``edit`` the folder, then list every file's new size and SHA-256 in the manifest, as a
    forger would: only a check of the contents can tell."""
    edit(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    for name in manifest["hashes"]:
        data = (folder / name).read_bytes()
        manifest["hashes"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / MANIFEST).write_text(json.dumps(manifest))


def set_value(name: str, dtype: str, index: int, value: int) -> Callable[[Path], object]:
    def edit(folder: Path) -> None:
        array = np.fromfile(folder / name, dtype=dtype)
        array[index] = value
        array.tofile(folder / name)

    return edit


def _split_entry(**fields: object) -> Callable[[Path], object]:
    def edit(folder: Path) -> None:
        manifest = json.loads((folder / MANIFEST).read_text())
        manifest["splits"]["train"].update(fields)
        (folder / MANIFEST).write_text(json.dumps(manifest))

    return edit


def _first_line(name: str, line: bytes) -> Callable[[Path], object]:
    def edit(folder: Path) -> None:
        lines = (folder / name).read_bytes().splitlines(keepends=True)
        (folder / name).write_bytes(line + b"".join(lines[1:]))

    return edit


def _list_another_file(folder: Path) -> None:
    (folder / "extra.bin").write_bytes(b"\0" * 16)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"].append("extra.bin")
    manifest["hashes"]["extra.bin"] = {}
    (folder / MANIFEST).write_text(json.dumps(manifest))


FORGED = [  # (name, edit, what the refusal says)
    ("id-outside-vocab", set_value("train.source.ids", "<u2", 5, 60),
     "train.source: id 60 (token 6) is outside the vocabulary of 60"),
    ("offset-past-end", set_value("train.target.offsets", "<i8", 3, 10**6),
     "train.target: pair 3's offsets do not match its length"),
    ("offsets-not-from-0", set_value("train.source.offsets", "<i8", 0, 1),
     "its offsets run from 1"),
    ("empty-pair", set_value("train.target.lengths", "<i4", 2, 0), "pair 3 has 0 tokens, not 1 to"),
    ("longer-than-max-len", set_value("validation.source.lengths", "<i4", 0, 10**6),
     "validation.source: pair 1 has 1000000 tokens, not 1 to 256"),
    ("ids-cut", lambda f: (f / "train.source.ids").write_bytes(
        (f / "train.source.ids").read_bytes()[:-1]), "train.source.ids has"),
    ("more-pairs-claimed", _split_entry(pairs=10**6), "train.source.offsets has"),
    ("dtype-float", lambda f: _edit_manifest(f, dtype="<f4"), "dtype '<f4' is not one of"),
    ("max-len-text", lambda f: _edit_manifest(f, max_len="256"), "max_len '256' is not a whole"),
    ("count-bool", _split_entry(dropped=True), "the train split's counts are not whole numbers"),
    ("fingerprint", lambda f: _edit_manifest(f, fingerprint=[]), "fingerprint of the text"),
    ("text-not-json", _first_line("validation.texts.jsonl", b"[[[\n"),
     "validation.texts.jsonl line 1 is not a JSON object"),
    ("text-not-utf8", _first_line("validation.texts.jsonl", b'{"source": "\xff", "target": ""}\n'),
     "validation.texts.jsonl line 1 is not"),
    ("foreign-file-listed", _list_another_file, "lists 'extra.bin', which is not a file of a"),
    ("linked-file", lambda f: (f / "train.source.ids").unlink() or (f / "train.source.ids")
     .symlink_to(f / "train.target.ids"), "'train.source.ids' is a link or lies behind one"),
    ("text-missing-line", _first_line("validation.texts.jsonl", b""),
     "validation.texts.jsonl holds 19 pairs, not the 20"),
]


@pytest.mark.parametrize(("edit", "message"), [f[1:] for f in FORGED], ids=[f[0] for f in FORGED])
def test_contents_training_relies_on_are_checked_not_only_their_hashes(
    prepared: Path, tmp_path: Path, edit: Callable[[Path], object], message: str
) -> None:
    copy = tmp_path / "forged"
    shutil.copytree(prepared, copy)
    forge_prepared(copy, edit)
    with pytest.raises(DataError, match="prepare the data again") as refused:
        folder = open_prepared(copy)
        folder.split("validation", folder.max_len, strict=False)  # reads the texts
    assert message in str(refused.value) and str(copy) in str(refused.value)


def test_training_on_a_forged_folder_is_refused_before_anything_is_written(
    prepared: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "forged"
    shutil.copytree(prepared, copy)
    forge_prepared(copy, set_value("train.target.ids", "<u2", 0, 65535))
    code, output = run_cli("train", "--data", str(copy), "--out", str(tmp_path / "run"),
                           "--preset", "tiny", "--max-steps", "1")  # fmt: skip
    assert code == 3, output
    assert "is outside the vocabulary of 60" in output and "Traceback" not in output
    assert not (tmp_path / "run").exists()


def test_two_prepares_into_one_folder_cannot_both_succeed(
    small_data: Path, tmp_path: Path  # noqa: F811
) -> None:
    from tformer.checkpoint.lock import writer_lock

    out = tmp_path / "out"
    # Another writer holds the folder: refused at once, in one line.
    with writer_lock(out, "--out"):
        with pytest.raises(ConfigError, match=r"another tformer process \(PID \d+\) is writing"):
            prepare(str(small_data), out, vocab_size=60)
    assert not out.exists()
    # Another writer finishes while this one writes: its folder is kept, this one refused.
    def finish_theirs(split: str, done: int, total: int) -> None:
        if not out.exists():
            out.mkdir()
            (out / "theirs.txt").write_text("kept")

    with pytest.raises(ConfigError, match="exists and is not empty; give --overwrite"):
        prepare(str(small_data), out, vocab_size=60, progress=finish_theirs)
    assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no lock, no tmp


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--vocab-size", "8000"],
         "--vocab-size 8000 (it was prepared with 60) would do nothing; leave it out"),
        (["--separate-vocab", "--tokenizer-kind", "unigram"],
         "--tokenizer-kind unigram (it was prepared with bpe); --separate-vocab would"),
        (["--tokenizer-sample", "500000", "--tgt-lang", "de"],
         "--target-field (--tgt-lang) de (it was prepared with target) would"),
        (["--num-proc", "2"], "--num-proc"),
        (["--streaming"], "--streaming"),
    ],
)
def test_options_a_prepared_folder_makes_meaningless_are_refused(
    prepared: Path, tmp_path: Path, flags: list[str], named: str
) -> None:
    code, output = run_cli("train", "--data", str(prepared), "--out", str(tmp_path / "run"),
                           "--preset", "tiny", "--max-steps", "1", *flags)  # fmt: skip
    assert code == 2, output
    assert f"is a prepared folder: its tokenizer, fields and ids were fixed by `tformer " \
           f"prepare`, so {named}" in " ".join(output.split())
    assert not (tmp_path / "run").exists()


def test_a_config_file_or_the_library_is_refused_likewise(prepared: Path, tmp_path: Path) -> None:
    from tests.conftest import tiny_model
    from tformer.config import TrainConfig
    from tformer.training.configs import TokenizerSpec
    from tformer.training.inputs import check_prepared_options
    from tformer.training.run import train

    config = tmp_path / "run.yaml"
    config.write_text(f"train:\n  data: {prepared}\ntokenizer:\n  vocab_size: 100\n")
    code, output = run_cli("train", "--config", str(config), "--out", str(tmp_path / "run"))
    assert code == 2 and "--vocab-size 100 (it was prepared with 60) would do" in output, output
    with pytest.raises(ConfigError, match="--tokenizer-sample 10 .* would do nothing"):
        train(tiny_model(), TrainConfig(data=str(prepared)), out=tmp_path / "lib",
              tokenizer_sample=10)  # fmt: skip
    assert not (tmp_path / "run").exists() and not (tmp_path / "lib").exists()
    # What agrees with how the folder was prepared is accepted.
    check_prepared_options(TrainConfig(data=str(prepared)), TokenizerSpec(vocab_size=60), None,
                           ["--vocab-size", "--tokenizer-sample"])  # fmt: skip
