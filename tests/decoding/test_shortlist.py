"""The lexical shortlist: IBM Model 1 against a plain-Python reference, the candidates of a
batch, decoding over them against the whole model with every other token ruled out (plain,
accelerated and int8), the file's round trip and its refusals, and the commands end to end."""

from __future__ import annotations

import json
import os
import random
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.cli.test_ensemble_cli import write_member
from tests.conftest import digit_pairs, refusal_lines, write_jsonl
from tformer.cli.commands import app
from tformer.config import SPECIAL_TOKENS, ModelConfig
from tformer.data.batching import pad
from tformer.data.tokenizer import Tokenizer, train_tokenizer
from tformer.decoding.api import decode, stream_tokens
from tformer.decoding.ensemble import Ensemble
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.shortlist import (
    Shortlist,
    build_shortlist,
    load_shortlist,
    translation_table,
    vocabulary_digest,
)
from tformer.errors import CheckpointError, ConfigError
from tformer.fast.accelerate import accelerate
from tformer.fast.int8 import quantize_int8
from tformer.model import TransformerBase, build_model
from tformer.paths import file_sha256

runner = CliRunner()
VOCAB = 40
SRC = pad([[5, 6, 7, 8], [9, 10], [11, 12, 13]])
SETTINGS = {
    "greedy": DecodingConfig(max_new_tokens=6),
    "beam": DecodingConfig(beam_size=3, n_best=3, max_new_tokens=6),
    "beam-penalised": DecodingConfig(beam_size=2, no_repeat_ngram_size=2, max_new_tokens=6),
}


def ibm1_reference(pairs: list[tuple[list[int], list[int]]], iterations: int) -> dict:
    """IBM Model 1 written out as in Brown et al. (1993), one pair and one word at a time."""
    t: dict[tuple[int, int], float] = defaultdict(lambda: 1.0)
    for _ in range(iterations):
        count: dict[tuple[int, int], float] = defaultdict(float)
        total: dict[int, float] = defaultdict(float)
        for src, tgt in pairs:
            for e in tgt:
                z = sum(t[(f, e)] for f in src)
                for f in src:
                    count[(f, e)] += t[(f, e)] / z
                    total[f] += t[(f, e)] / z
        t = defaultdict(lambda: 1.0, {(f, e): c / total[f] for (f, e), c in count.items()})
    return dict(t)


def test_the_translation_table_is_ibm_model_1() -> None:
    rng = random.Random(0)
    pairs = [
        ([rng.randrange(4, 12) for _ in range(rng.randint(1, 5))],
         [rng.randrange(4, 10) for _ in range(rng.randint(1, 5))])
        for _ in range(30)
    ]  # fmt: skip
    src_ids, tgt_ids, prob = translation_table(pairs, 12, 10, iterations=4)
    triples = zip(src_ids.tolist(), tgt_ids.tolist(), prob.tolist(), strict=True)
    got = {(s, t): p for s, t, p in triples}
    want = ibm1_reference(pairs, 4)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9)


def test_each_word_finds_its_translation_and_the_frequent_words_are_counted() -> None:
    pairs = digit_pairs(300, seed=2)
    texts = [p["source"] for p in pairs] + [p["target"] for p in pairs]
    tokenizer = train_tokenizer(texts, vocab_size=80)  # digits "▁" "3", words "▁three"
    ids = [(tokenizer.encode(p["source"]), tokenizer.encode(p["target"])) for p in pairs]
    shortlist = build_shortlist(ids, tokenizer, tokenizer, per_word=1, frequent=3)
    for digit, word in enumerate(["zero", "one", "two", "three", "four", "five"]):
        source = tokenizer.encode(str(digit))[-1]
        assert tokenizer.decode(shortlist.best[source, :1].tolist()) == word
    counts: dict[int, int] = defaultdict(int)
    for _, tgt in ids:
        for token in tgt:
            counts[token] += 1
    commonest = sorted(counts, key=lambda token: -counts[token])[:3]
    assert sorted(shortlist.frequent.tolist()) == sorted(commonest)
    assert (shortlist.best[: len(SPECIAL_TOKENS)] == -1).all()  # <pad> brings no candidates


def small_shortlist(seed: int = 0, per_word: int = 3) -> Shortlist:
    generator = torch.Generator().manual_seed(seed)
    best = torch.randint(len(SPECIAL_TOKENS), VOCAB, (VOCAB, per_word), generator=generator)
    best[0] = -1
    return Shortlist(best, torch.tensor([7, 30]), VOCAB, "source", "target")


def test_the_candidates_are_the_special_tokens_the_frequent_and_each_source_words() -> None:
    shortlist = small_shortlist()
    got = shortlist.candidates(SRC).tolist()
    words = {w for w in SRC.reshape(-1).tolist() if w}
    want = {0, 1, 2, 3, 7, 30} | {t for w in words for t in shortlist.best[w].tolist()}
    assert got == sorted(want)
    assert got[: len(SPECIAL_TOKENS)] == list(range(len(SPECIAL_TOKENS)))


def tiny(seed: int) -> TransformerBase:
    torch.manual_seed(seed)
    config = ModelConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32, n_heads=4,
                         n_encoder_layers=1, n_decoder_layers=2, d_ff=64, dropout=0.0,
                         max_len=32, output_bias=True)  # fmt: skip
    model = build_model(config).eval()
    with torch.no_grad():
        assert model.logits_bias is not None
        model.logits_bias.normal_()  # Marian's bias, so the rows kept must keep theirs
    return model


def ruled_out(reference: TransformerBase, allowed: torch.Tensor) -> TransformerBase:
    """``reference`` with every token outside ``allowed`` at -inf."""
    project = reference.project
    mask = torch.full((VOCAB,), float("-inf"))
    mask[allowed] = 0.0
    reference.project = lambda hidden: project(hidden) + mask  # type: ignore[method-assign]
    return reference


@pytest.mark.parametrize("kind", ["plain", "accelerated", "int8"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_decoding_over_the_candidates_is_the_model_with_every_other_token_ruled_out(
    kind: str, setting: str
) -> None:
    prepare = {"plain": lambda m: m, "accelerated": accelerate, "int8": quantize_int8}[kind]
    model = prepare(tiny(0))
    shortlist = small_shortlist()
    allowed = shortlist.candidates(SRC)
    got = decode(Ensemble([model], shortlist=shortlist), SRC, SETTINGS[setting])
    want = decode(ruled_out(prepare(tiny(0)), allowed), SRC, SETTINGS[setting])
    plain = decode(model, SRC, SETTINGS[setting])
    for got_row, want_row in zip(got, want, strict=True):
        assert [h.ids for h in got_row] == [h.ids for h in want_row]
        for g, w in zip(got_row, want_row, strict=True):
            assert g.token_logprobs == pytest.approx(w.token_logprobs, abs=1e-4)
            assert set(g.ids) <= set(allowed.tolist())
    assert got != plain  # the shortlist does rule out tokens the model would choose


@pytest.mark.parametrize("setting", ["greedy", "beam"])
def test_an_ensemble_over_the_candidates_is_the_ensemble_of_ruled_out_members(
    setting: str,
) -> None:
    shortlist = small_shortlist(3)
    allowed = shortlist.candidates(SRC)
    got = decode(Ensemble([tiny(0), tiny(1)], shortlist=shortlist), SRC, SETTINGS[setting])
    members = [ruled_out(tiny(0), allowed), ruled_out(tiny(1), allowed)]
    want = decode(Ensemble(members), SRC, SETTINGS[setting])
    for got_row, want_row in zip(got, want, strict=True):
        assert [h.ids for h in got_row] == [h.ids for h in want_row]
        for g, w in zip(got_row, want_row, strict=True):
            assert g.token_logprobs == pytest.approx(w.token_logprobs, abs=1e-4)


def test_samples_are_drawn_from_the_candidates_and_repeat_with_the_seed() -> None:
    shortlist = small_shortlist(4)
    shortlisted = Ensemble([tiny(4)], shortlist=shortlist)
    config = DecodingConfig(temperature=1.5, num_samples=4, seed=7, max_new_tokens=8)
    first, again = decode(shortlisted, SRC, config), decode(shortlisted, SRC, config)
    assert [[h.ids for h in row] for row in first] == [[h.ids for h in row] for row in again]
    drawn = {token for row in first for h in row for token in h.ids}
    assert drawn <= set(shortlist.candidates(SRC).tolist())
    assert len(drawn) > 3  # sampling at T = 1.5 spreads over the candidates


def test_a_stream_gives_the_tokens_of_the_batch_decoding() -> None:
    model, shortlist = tiny(1), small_shortlist(1)
    shortlisted = Ensemble([model], shortlist=shortlist)
    config = DecodingConfig(max_new_tokens=6)
    src = [5, 6, 7]
    (hyp,) = decode(shortlisted, torch.tensor([src]), config)[0]
    assert list(stream_tokens(shortlisted, src, config)) == hyp.ids


def test_the_cached_steps_equal_the_recomputed_ones() -> None:
    shortlisted = Ensemble([tiny(2)], shortlist=small_shortlist(2))
    for config in SETTINGS.values():
        recomputed = DecodingConfig(**{**config.__dict__, "use_cache": False})
        got, want = decode(shortlisted, SRC, config), decode(shortlisted, SRC, recomputed)
        assert [[h.ids for h in row] for row in got] == [[h.ids for h in row] for row in want]


# -- the file -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A digit corpus, an untrained checkpoint of its tokenizer and one of another."""
    root = tmp_path_factory.mktemp("shortlist")
    pairs = digit_pairs(200, seed=1)
    write_jsonl(root / "data" / "train.jsonl", pairs[8:])
    write_jsonl(root / "data" / "test.jsonl", pairs[:8])
    texts = [p["source"] for p in pairs] + [p["target"] for p in pairs]
    tokenizer = train_tokenizer(texts, vocab_size=80)
    other = train_tokenizer([p["target"] for p in pairs], vocab_size=40)
    return {
        "data": root / "data",
        "model": write_member(root / "model", tokenizer, 0),
        "other": write_member(root / "other", other, 0),
    }


def invoke(*args: str | Path) -> tuple[int, str, str]:
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def test_the_command_writes_a_file_that_loads_as_built(
    digits: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "digits.shortlist"
    code, stdout, _ = invoke("shortlist", digits["model"], "--data", digits["data"], "--out",
                             out, "--per-word", "2", "--frequent", "4")  # fmt: skip
    assert code == 0, stdout
    assert f"--shortlist {out}" in stdout
    assert oct(os.stat(out).st_mode & 0o777) == oct(0o666 & ~current_umask())
    loaded = load_shortlist(out)
    assert loaded.best.shape[1] == 2 and len(loaded.frequent) == 4
    tokenizer = Tokenizer.load(digits["model"] / "tokenizer.json")
    assert loaded.source_digest == vocabulary_digest(tokenizer)
    three = tokenizer.encode("3")[-1]
    assert "three" in tokenizer.decode(loaded.best[three].tolist())
    code, _, _ = invoke("shortlist", digits["model"], "--data", digits["data"], "--out", out)
    assert code != 0  # an existing file is replaced only with --overwrite


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.fixture(scope="module")
def shortlist_file(digits: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("list") / "digits.shortlist"
    code, stdout, _ = invoke("shortlist", digits["model"], "--data", digits["data"], "--out", out)
    assert code == 0, stdout
    return out


@pytest.mark.parametrize("command", ["generate", "compare"])
def test_decoding_commands_take_the_shortlist(
    command: str, digits: dict[str, Path], shortlist_file: Path
) -> None:
    plain = invoke(command, digits["model"], "3 1 4", "9 2")
    listed = invoke(command, digits["model"], "3 1 4", "9 2", "--shortlist", shortlist_file)
    assert plain[0] == 0 and listed[0] == 0, listed
    assert listed[1].strip()


def test_evaluate_takes_the_shortlist(
    digits: dict[str, Path], shortlist_file: Path, tmp_path: Path
) -> None:
    code, stdout, stderr = invoke("evaluate", digits["model"], "--data", digits["data"], "--out",
                                  tmp_path / "card", "--shortlist", shortlist_file)  # fmt: skip
    assert code == 0, stderr
    assert "BLEU" in stdout
    card = json.loads((tmp_path / "card" / "result.json").read_text(encoding="utf-8"))
    assert card["decoding"]["shortlist"]["path"] == str(shortlist_file)
    assert card["decoding"]["shortlist"]["sha256"] == file_sha256(shortlist_file)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_bytes(b"not a safetensors file at all"), "not a safetensors file"),
        (lambda p: p.mkdir(), "is a folder"),
        (lambda p: os.mkfifo(p), "FIFO"),
        (lambda p: None, "missing"),
    ],
)
def test_a_bad_shortlist_file_is_refused_in_one_line(
    digits: dict[str, Path], tmp_path: Path, make, message: str
) -> None:
    path = tmp_path / "bad.shortlist"
    make(path)
    code, _, stderr = invoke("generate", digits["model"], "3 1", "--shortlist", path)
    assert code != 0
    lines = refusal_lines(stderr)
    assert len(lines) == 1 and str(path) in lines[0] and message in lines[0], stderr


def test_ids_outside_the_vocabulary_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "wide.shortlist"
    Shortlist(torch.tensor([[50]]), torch.tensor([1]), 40, "s", "t").save(path)
    with pytest.raises(CheckpointError, match="do not fit its target vocabulary of 40"):
        load_shortlist(path)


def test_a_shortlist_of_another_vocabulary_is_refused(
    digits: dict[str, Path], shortlist_file: Path
) -> None:
    code, _, stderr = invoke("generate", digits["other"], "3 1", "--shortlist", shortlist_file)
    assert code != 0
    (line,) = refusal_lines(stderr)
    assert "another source vocabulary" in line and str(shortlist_file) in line


def test_sizes_are_checked_before_any_work(digits: dict[str, Path], tmp_path: Path) -> None:
    for flag, value in (("--per-word", "0"), ("--frequent", "-1")):
        code, _, stderr = invoke("shortlist", digits["model"], "--data", digits["data"],
                                 "--out", tmp_path / "x", flag, value)  # fmt: skip
        assert code != 0 and flag in stderr
        assert not (tmp_path / "x").exists()
    with pytest.raises(ConfigError):
        build_shortlist([], Tokenizer.load(digits["model"] / "tokenizer.json"),
                        Tokenizer.load(digits["model"] / "tokenizer.json"), per_word=0,
                        frequent=1)  # fmt: skip
