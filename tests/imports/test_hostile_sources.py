"""`tformer import` against hostile sources, for each of the four families (Marian, GPT-2, BERT,
T5): real folders written by transformers (tiny models, random weights), each then broken one
way. Every refusal is one line naming the file or config.json key, comes within seconds, and
leaves OUT unwritten; a FIFO in the folder never hangs the import (a watchdog opens it for
writing after a while, so a regression fails instead of blocking)."""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

from tests.conftest import refusal_lines  # noqa: E402
from tests.imports.conftest import MarianCase, lines, tformer  # noqa: E402
from tests.imports.test_bert import wordpiece  # noqa: E402
from tests.imports.test_gpt2 import byte_level_bpe  # noqa: E402
from tests.imports.test_t5 import t5_tokenizer  # noqa: E402
from tformer.checkpoint.store import load_checkpoint  # noqa: E402
from tformer.errors import CheckpointError  # noqa: E402
from tformer.imports import bert, gpt2, import_model, marian, t5  # noqa: E402
from tformer.imports.common import COMMON_KEYS, Checked, Key, build_arch  # noqa: E402
from tformer.paths import excerpt  # noqa: E402
from tformer.source_files import CONFIG_BYTES, TOKENIZER_BYTES  # noqa: E402

pytestmark = pytest.mark.timeout(300)  # the last resort: no case may hang the run
SECONDS = 15  # a refusal comes at once; this only tells "at once" from "after a hang"
FAMILIES = ("marian", "gpt2", "bert", "t5")
TABLES = {"marian": marian.KEYS, "gpt2": gpt2.KEYS, "bert": bert.KEYS, "t5": t5.KEYS}
# The files each family's import reads, beside config.json and the weights.
TOKENIZER_FILES = {
    "marian": ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"),
    "gpt2": ("tokenizer.json", "tokenizer_config.json"),
    "bert": ("tokenizer.json", "tokenizer_config.json"),
    "t5": ("tokenizer.json", "tokenizer_config.json"),
}
# A tensor each import reads, to be broken.
TENSORS = {
    "marian": "model.encoder.layers.0.fc1.weight",
    "gpt2": "transformer.h.0.mlp.c_fc.weight",
    "bert": "bert.encoder.layer.0.intermediate.dense.weight",
    "t5": "encoder.block.0.layer.1.DenseReluDense.wi.weight",
}


@dataclass
class Family:
    folder: Path  # written by save_pretrained: the model and its tokenizer
    model: Any  # the transformers model, to save again (sharded)


def _saved(model: Any, tokenizer: Any, folder: Path) -> Family:
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return Family(folder, model)


@pytest.fixture(scope="module")
def families(
    marian_case: Callable[[str], MarianCase],
    toy_data: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Family]:
    """One tiny model of each family, saved with its tokenizer."""
    root = tmp_path_factory.mktemp("hostile")
    texts = lines("train", "en", 3000, toy_data)
    torch.manual_seed(0)
    case = marian_case("swish-shared-tied")
    found = {"marian": Family(case.folder, case.model)}
    tokenizer = byte_level_bpe(texts)
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer), n_positions=32, n_embd=32, n_layer=2, n_head=4,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    found["gpt2"] = _saved(transformers.GPT2LMHeadModel(config).eval(), tokenizer, root / "gpt2")
    tokenizer = wordpiece(texts)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    found["bert"] = _saved(transformers.BertForMaskedLM(config).eval(), tokenizer, root / "bert")
    (root / "t5").mkdir()
    tokenizer = t5_tokenizer(root / "t5", toy_data)
    (root / "t5" / "spiece.model").unlink()  # the tokenizer is read from tokenizer.json
    config = transformers.T5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2,
        num_decoder_layers=2, relative_attention_num_buckets=8, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, feed_forward_proj="relu",
    )  # fmt: skip
    found["t5"] = _saved(
        transformers.T5ForConditionalGeneration(config).eval(), tokenizer, root / "t5"
    )
    return found


@pytest.fixture(scope="module")
def imported(families: dict[str, Family], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The GPT-2 folder imported: a tformer checkpoint."""
    out = tmp_path_factory.mktemp("imported") / "gpt2"
    done = tformer("import", families["gpt2"].folder, out)
    assert done.exit_code == 0, done.output
    return out


def source(family: Family, where: Path, change: Callable[[Path], object] = lambda _: None) -> Path:
    """A copy of the family's folder, changed."""
    copy = where / "source"
    shutil.copytree(family.folder, copy)
    change(copy)
    return copy


@contextmanager
def fifo_watchdog(folder: Path, after: float = SECONDS) -> Iterator[None]:
    """After ``after`` seconds, open every FIFO in ``folder`` for writing (without blocking):
    a read that blocked on one ends (with no data), so a regression fails, never hangs."""
    stop = threading.Event()

    def watch() -> None:
        if stop.wait(after):
            return
        for path in folder.rglob("*"):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass  # not a FIFO, or nobody reading it

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def refused(folder: Path | str, where: Path, *parts: str) -> str:
    """``tformer import folder where/out``: refused, in one line holding ``parts``, within
    seconds, with nothing written; the line."""
    out = where / "out"
    start = time.monotonic()
    with fifo_watchdog(Path(folder)):
        result = tformer("import", folder, out)
    elapsed = time.monotonic() - start
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    found = refusal_lines(result.stderr)
    assert len(found) == 1 and all(p in found[0] for p in parts), (parts, result.stderr)
    assert elapsed < SECONDS, elapsed
    assert not out.exists()
    return found[0]


# -- every file read: a FIFO, a link to /dev/zero, a folder, a file over the bound -------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _device(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _folder(path: Path) -> None:
    path.mkdir()


def _limit(name: str) -> int:
    return CONFIG_BYTES if name == "config.json" else TOKENIZER_BYTES


def _too_big(path: Path) -> None:
    with open(path, "wb") as handle:
        handle.truncate(_limit(path.name) + 1)  # sparse: no disk is spent


KINDS: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (_fifo, "is a FIFO"),
    "device": (_device, "is a link to '/dev/zero', a device"),
    "folder": (_folder, "is a folder"),
    "too-big": (_too_big, "is {size:,} bytes, over the"),
}
FILE_CASES = [
    (family, name, kind)
    for family in FAMILIES
    for name in ("config.json", "model.safetensors", *TOKENIZER_FILES[family])
    for kind in KINDS
    if not (name == "model.safetensors" and kind == "too-big")  # weights have no bound
]


@pytest.mark.parametrize(("family", "name", "kind"), FILE_CASES,
                         ids=["-".join(case) for case in FILE_CASES])  # fmt: skip
def test_a_file_that_is_no_regular_file_is_named(
    families: dict[str, Family], tmp_path: Path, family: str, name: str, kind: str
) -> None:
    make, message = KINDS[kind]

    def change(folder: Path) -> None:
        (folder / name).unlink()
        make(folder / name)

    message = message.format(size=_limit(name) + 1)
    refused(source(families[family], tmp_path, change), tmp_path, f"{name}: {message}")


def test_a_missing_safetensors_with_a_pickle_beside_it_says_so(
    families: dict[str, Family], tmp_path: Path
) -> None:
    folder = source(families["bert"], tmp_path, lambda f: (f / "model.safetensors").unlink())
    (folder / "pytorch_model.bin").write_bytes(b"pickle")
    refused(folder, tmp_path, "model.safetensors: missing", "pytorch_model.bin is a pickle")


# -- config.json: each key of the tables with a value of the wrong type ----------------------

WRONG = {"whole": "96", "number": "0.1", "flag": "false", "text": 5}
KEY_CASES = [
    (family, key) for family in FAMILIES for key in {**COMMON_KEYS, **TABLES[family]}
]


def edit_config(**values: object) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        path = folder / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **values}))

    return change


@pytest.mark.parametrize(("family", "key"), KEY_CASES, ids=["-".join(c) for c in KEY_CASES])
def test_a_config_value_of_the_wrong_type_is_named(
    families: dict[str, Family], tmp_path: Path, family: str, key: str
) -> None:
    rule: Key = {**COMMON_KEYS, **TABLES[family]}[key]
    value = WRONG[rule.kind]
    folder = source(families[family], tmp_path, edit_config(**{key: value}))
    expected = {"whole": "a whole number", "number": "a number", "flag": "true or false",
                "text": "a string"}[rule.kind]  # fmt: skip
    refused(folder, tmp_path, f"config.json: {key} {excerpt(value)} must be {expected}")


# The keys of each family by what they mean (None: the family has no such key).
ROLES = {
    "marian": dict(width="d_model", heads="encoder_attention_heads", layers="encoder_layers",
                   ffn="encoder_ffn_dim", positions="max_position_embeddings", dropout="dropout",
                   eps=None),
    "gpt2": dict(width="n_embd", heads="n_head", layers="n_layer", ffn="n_inner",
                 positions="n_positions", dropout="resid_pdrop", eps="layer_norm_epsilon"),
    "bert": dict(width="hidden_size", heads="num_attention_heads", layers="num_hidden_layers",
                 ffn="intermediate_size", positions="max_position_embeddings",
                 dropout="hidden_dropout_prob", eps="layer_norm_eps"),
    "t5": dict(width="d_model", heads="num_heads", layers="num_layers", ffn="d_ff",
               positions=None, dropout="dropout_rate", eps="layer_norm_epsilon"),
}  # fmt: skip
BOUNDS: list[tuple[str, str, object, str]] = [
    ("zero-heads", "heads", 0, "must be from 1 to 1,024"),
    ("negative-heads", "heads", -4, "must be from 1 to 1,024"),
    ("negative-width", "width", -32, "must be from 1 to 65,536"),
    ("string-width", "width", "96", "must be a whole number"),
    ("true-width", "width", True, "must be a whole number"),
    ("null-width", "width", None, "must be a whole number"),
    ("float-width", "width", 96.0, "must be a whole number"),
    ("million-layers", "layers", 1_000_000, "must be from 1 to 512"),
    ("ffn-1e8", "ffn", 1e8, "must be a whole number"),
    ("ffn-10**8", "ffn", 10**8, "must be from 1 to 262,144"),
    ("positions-2**20", "positions", 2**20, "must be from"),
    ("zero-epsilon", "eps", 0, "must be in (0, 1)"),
    ("nan-epsilon", "eps", math.nan, "must be a finite number"),
    ("dropout-1.5", "dropout", 1.5, "must be in [0, 1)"),
    ("infinite-dropout", "dropout", math.inf, "must be a finite number"),
    ("string-tie", "tie_word_embeddings", "false", "must be true or false"),
    ("labels", "num_labels", 10**7, "must be from 1 to 1,024"),
]
BOUND_CASES = [
    (family, *case)
    for family in FAMILIES
    for case in BOUNDS
    if ROLES[family].get(case[1], case[1]) is not None
]


@pytest.mark.parametrize("case", BOUND_CASES, ids=[f"{c[0]}-{c[1]}" for c in BOUND_CASES])
def test_a_config_value_out_of_bounds_is_named(
    families: dict[str, Family], tmp_path: Path, case: tuple[str, str, str, object, str]
) -> None:
    family, _, role, value, message = case
    key = ROLES[family].get(role, role)
    assert key is not None
    folder = source(families[family], tmp_path, edit_config(**{key: value}))
    refused(folder, tmp_path, f"config.json: {key} {excerpt(value)} {message}")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_config_that_disagrees_with_its_weights_is_refused_before_any_model_is_built(
    families: dict[str, Family], tmp_path: Path, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was built")

    monkeypatch.setattr("tformer.imports.common.build_model", no_model)
    monkeypatch.setattr("tformer.imports.marian.Transformer", no_model)
    changes = {ROLES[family]["ffn"] or "": 96, ROLES[family]["layers"] or "": 3}
    if family == "marian":
        changes["decoder_ffn_dim"] = 96
    folder = source(families[family], tmp_path, edit_config(**changes))
    refused(folder, tmp_path, "the weights do not match")


def test_model_config_refusals_name_the_config_key_not_a_flag(
    families: dict[str, Family]
) -> None:
    config = transformers.GPT2Config(n_positions=0, n_embd=32, n_head=4)
    checked = Checked(families["gpt2"].folder, config, {}, gpt2.KEYS)
    with pytest.raises(CheckpointError) as error:
        build_arch(checked, lambda: gpt2.gpt2_model_config(config, 10))
    where = families["gpt2"].folder / "config.json"
    assert str(error.value) == f"{where}: n_positions 0 must be > 0"


# -- weights ---------------------------------------------------------------------------------


def edit_tensor(name: str, edit: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        path = folder / "model.safetensors"
        tensors = load_file(path)
        tensors[name] = edit(tensors[name])
        save_file(tensors, path, metadata={"format": "pt"})

    return change


def _nan(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.clone()
    tensor[0, -1] = math.nan
    return tensor


WEIGHTS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str]] = {
    "int32": (lambda t: t.to(torch.int32), "holds I32 values"),
    "int64": (lambda t: t.to(torch.int64), "holds I64 values"),
    "bool": (lambda t: t > 0, "holds BOOL values"),
    "nan": (_nan, "holds NaN or infinite values"),
    "inf": (lambda t: t / 0, "holds NaN or infinite values"),
}
WEIGHT_CASES = [(family, case) for family in FAMILIES for case in WEIGHTS]


@pytest.mark.parametrize(("family", "case"), WEIGHT_CASES,
                         ids=["-".join(c) for c in WEIGHT_CASES])  # fmt: skip
def test_weights_that_are_not_finite_floats_are_named(
    families: dict[str, Family], tmp_path: Path, family: str, case: str
) -> None:
    edit, message = WEIGHTS[case]
    name = TENSORS[family]
    folder = source(families[family], tmp_path, edit_tensor(name, edit))
    shown = name.removeprefix("transformer.")  # GPT-2's body is read without its prefix
    refused(folder, tmp_path, f"model.safetensors: {shown} {message}")


def sharded(family: Family, where: Path) -> Path:
    """The family's folder with its weights saved again in shards of at most 20 kB."""
    folder = source(family, where, lambda f: (f / "model.safetensors").unlink())
    family.model.save_pretrained(str(folder), max_shard_size="20kB")
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 2
    return folder


@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_weights_import_as_the_single_file_does(
    families: dict[str, Family], tmp_path: Path, family: str
) -> None:
    outs = {}
    for name, folder in (
        ("single", families[family].folder),
        ("sharded", sharded(families[family], tmp_path)),
    ):
        outs[name] = tmp_path / name
        done = tformer("import", folder, outs[name])
        assert done.exit_code == 0, done.output
    single, split = (load_checkpoint(outs[n]) for n in ("single", "sharded"))
    ours, theirs = single.model.state_dict(), split.model.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    ids = torch.tensor([[1, 5, 6, 7, 2]])
    inputs = (ids,) if single.model_config.arch == "encoder-only" else (ids, ids)
    with torch.no_grad():
        assert torch.equal(single.model(*inputs).logits, split.model(*inputs).logits)


def _index(edit: Callable[[dict[str, str]], None]) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        path = folder / "model.safetensors.index.json"
        index = json.loads(path.read_text())
        edit(index["weight_map"])
        path.write_text(json.dumps(index))

    return change


def _first(value: str) -> Callable[[dict[str, str]], None]:
    return lambda weight_map: weight_map.__setitem__(next(iter(weight_map)), value)


SHARDS: dict[str, tuple[Callable[[Path], None], str]] = {
    "dot-dot": (_index(_first("../model-00001-of-00009.safetensors")), "is not a file name"),
    "slash": (_index(_first("sub/model.safetensors")), "is not a file name"),
    "absolute": (_index(_first("/etc/passwd")), "is not a file name"),
    "missing-shard": (
        lambda f: next(f.glob("model-00002-*.safetensors")).unlink(),
        "safetensors: missing; model.safetensors.index.json names it",
    ),
    "no-map": (lambda f: (f / "model.safetensors.index.json").write_text("{}"), "no weight_map"),
}


@pytest.mark.parametrize("case", SHARDS)
def test_a_hostile_shard_index_is_refused(
    families: dict[str, Family], tmp_path: Path, case: str
) -> None:
    folder = sharded(families["gpt2"], tmp_path)
    change, message = SHARDS[case]
    change(folder)
    refused(folder, tmp_path, message)


def test_a_shard_that_is_a_fifo_is_named(families: dict[str, Family], tmp_path: Path) -> None:
    folder = sharded(families["bert"], tmp_path)
    shard = next(folder.glob("model-00002-*.safetensors"))
    shard.unlink()
    os.mkfifo(shard)
    refused(folder, tmp_path, f"{shard.name}: is a FIFO")


# -- tokenizers ------------------------------------------------------------------------------


def edit_tokenizer(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        path = folder / "tokenizer.json"
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))

    return change


def _gap(data: dict[str, Any]) -> None:  # GPT-2's <|endoftext|> one id further on
    data["added_tokens"][0]["id"] += 1


def _two_on_one(data: dict[str, Any]) -> None:  # BERT's [MASK] on [SEP]'s id
    vocab = data["model"]["vocab"]
    vocab["zzzz"] = vocab["[SEP]"]


def _unknown_merge(data: dict[str, Any]) -> None:
    data["model"]["merges"].append(["zzq", "qqz"])


TOKENIZERS: list[tuple[str, str, Callable[[Path], None], str]] = [
    ("gpt2", "id-gap", edit_tokenizer(_gap), "tokenizer.json: the ids must be the integers"),
    ("bert", "two-pieces-one-id", edit_tokenizer(_two_on_one), "is both '[SEP]' and 'zzzz'"),
    ("gpt2", "unknown-merge", edit_tokenizer(_unknown_merge), "names 'zzq', which is not in"),
    ("t5", "no-tokenizer", lambda f: (f / "tokenizer.json").unlink(),
     "no tokenizer files (tokenizer.json or spiece.model)"),
    ("bert", "no-tokenizer", lambda f: (f / "tokenizer.json").unlink(),
     "no tokenizer files (tokenizer.json or vocab.txt)"),
    ("gpt2", "not-json", lambda f: (f / "tokenizer.json").write_text("{"),
     "tokenizer.json: not valid JSON"),
]  # fmt: skip


@pytest.mark.parametrize("case", TOKENIZERS, ids=[f"{c[0]}-{c[1]}" for c in TOKENIZERS])
def test_a_broken_tokenizer_is_named(
    families: dict[str, Family], tmp_path: Path, case: tuple[str, str, Callable[[Path], None], str]
) -> None:
    family, _, change, message = case
    refused(source(families[family], tmp_path, change), tmp_path, message)


# -- SOURCE ----------------------------------------------------------------------------------


def test_a_tformer_checkpoint_as_source_is_named(imported: Path, tmp_path: Path) -> None:
    refused(imported, tmp_path, "is a tformer checkpoint already; use it directly")


HUB_IDS = ["a--b/c", "a/b..c", "a/b.git", "a/-b", "b" * 97, "a/b/c", "a/b-", "a b"]


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No hub (a call to it fails the test), and ``tmp_path`` as the working folder."""

    def no_hub(repo_id: str) -> Path:
        raise AssertionError("the hub was called")

    monkeypatch.setattr("tformer.imports.hub.download", no_hub)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("hub_id", HUB_IDS)
def test_a_hub_id_huggingface_hub_would_reject_is_refused_before_calling_it(
    hub_id: str, tmp_path: Path, offline: None
) -> None:
    line = refused(hub_id, tmp_path, f"SOURCE {hub_id}: no such folder")
    assert "hub id" in line


@pytest.mark.parametrize("path", ["hf/nothere", "./nothere", "/nonexistent-folder/x", "~/no-x"])
def test_a_mistyped_local_path_is_no_such_folder(
    path: str, tmp_path: Path, offline: None
) -> None:
    (tmp_path / "hf").mkdir()
    line = refused(path, tmp_path, f"SOURCE {path}: no such folder")
    assert line.endswith("no such folder")


def test_a_source_folder_named_in_bytes_that_are_not_utf8_is_refused_in_one_line(
    families: dict[str, Family], tmp_path: Path
) -> None:
    folder = tmp_path / os.fsdecode(b"caf\xe9")  # Latin-1, as Python passes such a name on
    shutil.copytree(families["gpt2"].folder, folder)
    refused(folder, tmp_path, "SOURCE")  # the command line refuses the argument itself
    with pytest.raises(CheckpointError, match="not UTF-8") as error:
        import_model(folder, tmp_path / "out")
    assert "\n" not in str(error.value) and "\\udce9" in str(error.value)
    assert not (tmp_path / "out").exists()
    link = tmp_path / "cafe"
    link.symlink_to(folder)
    assert load_checkpoint(import_model(link, tmp_path / "out")).model is not None
