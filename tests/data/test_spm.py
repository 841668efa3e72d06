"""Tests for tformer.data.spm: SentencePiece models and Marian folders as tformer
tokenizers, against the sentencepiece library and transformers' MarianTokenizer.

The models are real ones, trained once per session with the sentencepiece package on Multi30k;
every line of test2016 (both sides) is compared, with lines added that hit the edges: characters
one side's model lacks and the other's has, characters neither has, language tokens.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tformer.config import SPECIAL_TOKENS
from tformer.data.marian_spm import MarianTokenizers, marian_tokenizers, unk_stand_ins
from tformer.data.spm import (
    is_sentencepiece,
    load_tokenizer,
    read_model,
    special_first_order,
    spm_tokenizer,
)
from tformer.data.tokenizer import Tokenizer
from tformer.errors import CheckpointError, ConfigError

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

MULTI30K = Path(__file__).resolve().parents[3] / "shared" / "data" / "multi30k"
needs_multi30k = pytest.mark.skipif(
    not MULTI30K.is_dir(), reason="Multi30k is not beside the checkout"
)
TRAIN_LINES = 8_000  # enough for vocabularies of 2,000 pieces, a second or two a model

# Lines that reach what test2016 rarely does: German letters in English text (pieces of the
# other side's model), scripts no model has, runs mixing both, digits, odd spacing.
EDGES = [
    "Grüße aus Köln, Straße 5.",
    "A naïve café owner in São Paulo.",
    "日本の犬 and a Ελληνικά sign.",
    "üßü ßü üß ß ü",
    "  two   spaces  and a tab\there ",
    "Smørrebrød, crème brûlée — 42 €!",
    "ein Mann: „Hallo“ … 3½",
    "use <sep> and @@ here<sep>x",
    "",
]
SYMBOLS = ["<sep>", "@@"]  # user-defined symbols of one model


@pytest.fixture(autouse=True)
def _quiet_marian() -> Iterator[None]:
    """MarianTokenizer warns that sacremoses is not installed (it does not use it here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def read_lines(name: str) -> list[str]:
    return (MULTI30K / name).read_text(encoding="utf-8").splitlines()


def train_spm(out: Path, name: str, lang: str, kind: str, **options: Any) -> Path:
    lines = read_lines(f"train.{lang}")[:TRAIN_LINES]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(out / name),
        vocab_size=2000,
        model_type=kind,
        num_threads=1,
        minloglevel=2,
        **options,
    )
    return out / f"{name}.model"


@pytest.fixture(scope="session")
def spm_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not MULTI30K.is_dir():
        pytest.skip("Multi30k is not beside the checkout")
    out = tmp_path_factory.mktemp("spm")
    return {
        "unigram.en": train_spm(out, "unigram.en", "en", "unigram"),
        "unigram.de": train_spm(out, "unigram.de", "de", "unigram"),
        "bpe.de": train_spm(out, "bpe.de", "de", "bpe"),
        # Unknown characters as UTF-8 bytes, and pieces always kept whole.
        "bytes.de": train_spm(
            out, "bytes.de", "de", "unigram", byte_fallback=True, user_defined_symbols=SYMBOLS
        ),
        # Another pipeline's choices: no normalisation, no dummy prefix, spaces kept, <pad> at
        # 3 and a control symbol of its own.
        "odd.de": train_spm(
            out,
            "odd.de",
            "de",
            "bpe",
            normalization_rule_name="identity",
            add_dummy_prefix=False,
            remove_extra_whitespaces=False,
            control_symbols=["<ctl>"],
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=3,
        ),
        # tformer's own layout, as a pipeline that knows it would train one.
        "tformer.de": train_spm(
            out, "tformer.de", "de", "unigram", pad_id=0, bos_id=1, eos_id=2, unk_id=3
        ),
    }


def held_out_lines() -> dict[str, list[str]]:
    return {lang: read_lines(f"test2016.{lang}") + EDGES for lang in ("en", "de")}


# -- special_first_order -----------------------------------------------------------------------


def test_order_puts_specials_first_and_keeps_the_rest_in_order() -> None:
    # sentencepiece's default: <unk> 0, <s> 1, </s> 2, no <pad>.
    assert special_first_order(7, pad=None, bos=1, eos=2, unk=0) == [None, 1, 2, 0, 3, 4, 5, 6]
    # Marian: </s> 0, <unk> 1, <pad> last and the decoder start.
    assert special_first_order(6, pad=None, bos=5, eos=0, unk=1) == [None, 5, 0, 1, 2, 3, 4]
    assert special_first_order(6, pad=5, bos=None, eos=0, unk=1) == [5, None, 0, 1, 2, 3, 4]


def test_order_of_tformers_own_layout_is_the_identity() -> None:
    assert special_first_order(9, pad=0, bos=1, eos=2, unk=3) == list(range(9))


def test_order_is_a_permutation_plus_new_rows() -> None:
    order = special_first_order(50, pad=None, bos=49, eos=7, unk=30)
    assert sorted(i for i in order if i is not None) == list(range(50))
    assert order.count(None) == 1 and order[:4] == [None, 49, 7, 30]
    rest = order[4:]
    assert rest == sorted(rest)


@pytest.mark.parametrize(
    ("size", "ids"), [(5, (None, 1, 2, 5)), (5, (None, 1, 1, 0)), (5, (0, 1, 2, -1))]
)
def test_order_refuses_bad_special_ids(size: int, ids: tuple[int | None, ...]) -> None:
    pad, bos, eos, unk = ids
    assert unk is not None
    with pytest.raises(ValueError):
        special_first_order(size, pad=pad, bos=bos, eos=eos, unk=unk)


# -- plain SentencePiece models ----------------------------------------------------------------


def spm_order(path: Path) -> list[int | None]:
    spec = read_model(path).trainer_spec
    return special_first_order(
        spm.SentencePieceProcessor(model_file=str(path)).get_piece_size(),
        pad=spec.pad_id if spec.pad_id >= 0 else None,
        bos=spec.bos_id if spec.bos_id >= 0 else None,
        eos=spec.eos_id if spec.eos_id >= 0 else None,
        unk=spec.unk_id,
    )


@pytest.mark.slow
@needs_multi30k
@pytest.mark.parametrize("name", ["unigram.en", "unigram.de", "bpe.de", "bytes.de", "odd.de"])
def test_spm_pieces_and_ids_equal_sentencepieces(spm_models: dict[str, Path], name: str) -> None:
    path = spm_models[name]
    processor = spm.SentencePieceProcessor(model_file=str(path))
    tok = spm_tokenizer(path)
    order = spm_order(path)
    unk = processor.unk_id()
    assert tok.kind == {1: "unigram", 2: "bpe"}[read_model(path).trainer_spec.model_type]
    has_pad = processor.pad_id() >= 0
    assert tok.vocab_size == processor.get_piece_size() + (not has_pad)  # else <pad> is new
    assert tok.tokens(range(4)) == list(SPECIAL_TOKENS)
    lines = held_out_lines()
    texts = lines["en"] + lines["de"]
    got_batch = tok.encode_batch(texts)
    for text, got in zip(texts, got_batch, strict=True):
        want = processor.encode(text)
        assert [order[i] for i in got] == want, text
        pieces = processor.encode(text, out_type=str)
        # sentencepiece shows an unknown run as its characters; tformer names it <unk>.
        want_pieces = ["<unk>" if i == unk else p for i, p in zip(want, pieces, strict=True)]
        assert tok.tokens(got) == want_pieces, text
        assert got == tok.encode(text)


@needs_multi30k
def test_spm_in_tformers_layout_keeps_its_ids(spm_models: dict[str, Path]) -> None:
    path = spm_models["tformer.de"]
    processor = spm.SentencePieceProcessor(model_file=str(path))
    tok = spm_tokenizer(path)
    assert tok.vocab_size == processor.get_piece_size()
    for text in held_out_lines()["de"]:
        assert tok.encode(text) == processor.encode(text), text


@needs_multi30k
@pytest.mark.parametrize("name", ["unigram.de", "bpe.de", "bytes.de"])
def test_spm_decode_gives_sentencepieces_text(spm_models: dict[str, Path], name: str) -> None:
    path = spm_models[name]
    processor = spm.SentencePieceProcessor(model_file=str(path))
    tok = spm_tokenizer(path)
    decoded = 0
    for text in held_out_lines()["de"]:
        ids = tok.encode(text)
        if 3 not in ids:  # sentencepiece writes an unknown piece as " ⁇ "; tformer skips it
            assert tok.decode(ids) == processor.decode(processor.encode(text)), text
            decoded += 1
    assert decoded > 900


@needs_multi30k
def test_spm_tokenizer_round_trips_through_its_json(
    spm_models: dict[str, Path], tmp_path: Path
) -> None:
    tok = spm_tokenizer(spm_models["unigram.de"])
    tok.save(tmp_path / "tokenizer.json")
    again = Tokenizer.load(tmp_path / "tokenizer.json")
    assert again.sha256() == tok.sha256() == spm_tokenizer(spm_models["unigram.de"]).sha256()
    texts = held_out_lines()["de"]
    assert again.encode_batch(texts) == tok.encode_batch(texts)


# -- Marian folders ----------------------------------------------------------------------------


def pieces_of(path: Path) -> list[str]:
    processor = spm.SentencePieceProcessor(model_file=str(path))
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def marian_vocab(
    *models: Path, codes: tuple[str, ...] = (), drop: frozenset[str] = frozenset()
) -> dict:
    """A joint vocabulary as Marian's converter has it: </s> 0, <unk> 1, (language tokens),
    the pieces of the models, <pad> last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in [*codes, *(p for m in models for p in pieces_of(m))]:
        if piece not in vocab and piece not in ("<s>", *drop):
            vocab[piece] = len(vocab)
    vocab["<pad>"] = len(vocab)
    return vocab


def marian_folder(
    out: Path, source: Path, target: Path, vocab: dict, target_vocab: dict | None = None
) -> Any:
    """A MarianTokenizer saved by save_pretrained, and the tokenizer itself read back."""
    out.mkdir()
    (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    options: dict[str, Any] = {}
    if target_vocab is not None:
        (out / "target_vocab.json").write_text(json.dumps(target_vocab), encoding="utf-8")
        options = {"separate_vocabs": True, "target_vocab_file": str(out / "target_vocab.json")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses"
        made = transformers.MarianTokenizer(
            str(source), str(target), str(out / "vocab.json"), **options
        )
        made.save_pretrained(str(out / "saved"))
        return transformers.MarianTokenizer.from_pretrained(str(out / "saved"))


def import_folder(folder: Path) -> MarianTokenizers:
    """tformer's tokenizers of ``folder``, with the ids a model config would give: those of the
    target vocabulary's <pad> (OPUS-MT's decoder start too) and </s>."""
    target = folder / ("target_vocab.json" if (folder / "target_vocab.json").exists() else "")
    vocab = json.loads((target if target.is_file() else folder / "vocab.json").read_text())
    pad = vocab["<pad>"]
    return marian_tokenizers(folder, pad_id=pad, eos_id=vocab["</s>"], decoder_start_id=pad)


def assert_same_ids(
    marian: Any,
    ours: MarianTokenizers,
    source_texts: list[str],
    target_texts: list[str],
    own_text: frozenset[int] = frozenset(),
) -> None:
    """tformer's ids, mapped through the orders, are MarianTokenizer's without the </s> it
    appends; decoding gives MarianTokenizer's text (whose decode reads the target vocabulary,
    so a separate source vocabulary is not decoded), except where ``own_text`` ids, which
    tformer decodes to their piece where Marian has <unk>, stand."""
    sides = [
        (source_texts, ours.source, ours.source_order, lambda t: marian(t).input_ids),
        (target_texts, ours.target, ours.target_order, lambda t: marian(text_target=t).input_ids),
    ]
    for side, (texts, tok, order, theirs) in enumerate(sides):
        for text, ids in zip(texts, tok.encode_batch(texts), strict=True):
            want = theirs(text)
            assert want[-1] == marian.eos_token_id
            assert [order[i] for i in ids] == want[:-1], text
            if (ours.joint or side == 1) and not own_text & set(ids):
                decoded = marian.decode(want, skip_special_tokens=True)
                assert tok.decode(ids) == decoded, text


@pytest.fixture(scope="session")
def joint_marian(
    spm_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("marian") / "joint"
    en, de = spm_models["unigram.en"], spm_models["unigram.de"]
    marian = marian_folder(folder, en, de, marian_vocab(en, de))
    return folder / "saved", marian


@pytest.mark.slow
@needs_multi30k
def test_marian_joint_vocabulary_ids_equal_marians(joint_marian: tuple[Path, Any]) -> None:
    folder, marian = joint_marian
    ours = import_folder(folder)
    lines = held_out_lines()
    assert ours.joint and ours.source_order is ours.target_order
    assert ours.source.to_str() != ours.target.to_str()  # each side cuts with its own model
    vocab = marian.get_vocab()
    assert ours.source.vocab_size == ours.target.vocab_size == len(vocab) + 1
    # The same vocabulary on both sides: tformer id i is Marian's token order[i].
    by_id = {i: token for token, i in vocab.items()}
    order = ours.source_order
    assert ours.source.tokens(range(4)) == list(SPECIAL_TOKENS)
    assert unk_stand_ins(order) == []
    assert order[:4] == [None, marian.pad_token_id, marian.eos_token_id, marian.unk_token_id]
    for tok in (ours.source, ours.target):
        assert tok.tokens(range(4, tok.vocab_size)) == [by_id[i] for i in order[4:]]
    assert_same_ids(marian, ours, lines["en"], lines["de"])
    # Each side's text through the other side's model too: most of it is foreign pieces.
    assert_same_ids(marian, ours, lines["de"], lines["en"])


def random_texts(n: int, seed: int) -> list[str]:
    """Texts of words and runs of characters from both sides, other scripts, odd spaces and
    compatibility forms (not the special tokens' names, which tformer reads its own way)."""
    rng = random.Random(seed)
    words = " ".join(read_lines("test2016.en")[:300] + read_lines("test2016.de")[:300]).split()
    chars = list("abcXYZ09 .,;:!?'-()äöüßÄÖÜéèçñøå日本語ΕλληνικάЖ€½„“…\t\u3000\u00a0ﬁＡ▁<>")
    texts = []
    for _ in range(n):
        parts = [
            rng.choice(words) if rng.random() < 0.5 else "".join(rng.choices(chars, k=4))
            for _ in range(rng.randint(1, 8))
        ]
        texts.append(rng.choice([" ", ""]).join(parts))
    return texts


@needs_multi30k
def test_marian_ids_on_random_texts(joint_marian: tuple[Path, Any]) -> None:
    folder, marian = joint_marian
    texts = random_texts(600, seed=3)
    assert_same_ids(marian, import_folder(folder), texts, texts)


@needs_multi30k
def test_marian_separate_vocabularies(spm_models: dict[str, Path], tmp_path: Path) -> None:
    en, de = spm_models["unigram.en"], spm_models["unigram.de"]
    source_vocab, target_vocab = marian_vocab(en), marian_vocab(de)
    marian = marian_folder(tmp_path / "separate", en, de, source_vocab, target_vocab)
    ours = import_folder(tmp_path / "separate" / "saved")
    assert not ours.joint
    assert ours.source.vocab_size == len(source_vocab) + 1
    assert ours.target.vocab_size == len(target_vocab) + 1
    assert ours.source_order[:4] == [None, source_vocab["<pad>"], 0, 1]
    assert ours.target_order[:4] == [None, target_vocab["<pad>"], 0, 1]
    lines = held_out_lines()
    assert_same_ids(marian, ours, lines["en"], lines["de"])


@needs_multi30k
def test_marian_multilingual_language_tokens(spm_models: dict[str, Path], tmp_path: Path) -> None:
    en, de = spm_models["unigram.en"], spm_models["unigram.de"]
    vocab = marian_vocab(en, de, codes=(">>de<<", ">>fr<<", ">>pt_BR<<"))
    marian = marian_folder(tmp_path / "multi", en, de, vocab)
    ours = import_folder(tmp_path / "multi" / "saved")
    lines = read_lines("test2016.en")[:300]
    codes = [">>de<<", ">>fr<<", ">>pt_BR<<"]
    sources = [f"{codes[i % 3]} {text}" for i, text in enumerate(lines)]
    assert {ours.source.tokens(ids)[0] for ids in ours.source.encode_batch(sources)} == set(codes)
    sources += [">>fr<<" + text for text in lines[:50]] + [">>de<<", ">>de<< "]
    assert_same_ids(marian, ours, sources, read_lines("test2016.de")[:300])


@needs_multi30k
def test_marian_pieces_missing_from_the_vocabulary_stand_for_unk(
    spm_models: dict[str, Path], tmp_path: Path
) -> None:
    en, de = spm_models["unigram.en"], spm_models["unigram.de"]
    # The most frequent pieces of each model that the other lacks: Marian maps them to <unk>.
    en_pieces, de_pieces = pieces_of(en), pieces_of(de)
    only_en = [p for p in en_pieces[3:] if p not in set(de_pieces)][:15]
    only_de = [p for p in de_pieces[3:] if p not in set(en_pieces)][:15]
    drop = frozenset(only_en + only_de)
    vocab = marian_vocab(en, de, drop=drop)
    marian = marian_folder(tmp_path / "missing", en, de, vocab)
    ours = import_folder(tmp_path / "missing" / "saved")
    order = ours.source_order
    assert len(order) == len(vocab) + 1 + len(drop)
    assert order[-len(drop) :] == [vocab["<unk>"]] * len(drop)
    assert unk_stand_ins(order) == list(range(len(vocab) + 1, len(order)))
    assert set(ours.source.tokens(range(len(vocab) + 1, len(order)))) == drop
    lines = held_out_lines()
    texts = lines["en"]
    extra = frozenset(range(len(vocab) + 1, len(order)))
    assert sum(bool(extra & set(ids)) for ids in ours.source.encode_batch(texts)) > 100
    assert sum(bool(extra & set(ids)) for ids in ours.target.encode_batch(lines["de"])) > 100
    assert_same_ids(marian, ours, lines["en"], lines["de"], own_text=extra)


# -- files and loading -------------------------------------------------------------------------


@needs_multi30k
def test_sentencepiece_files_are_told_from_tokenizer_json(
    spm_models: dict[str, Path], tmp_path: Path
) -> None:
    model = spm_models["unigram.de"]
    renamed = tmp_path / "sp.bin"
    renamed.write_bytes(model.read_bytes())
    tok = spm_tokenizer(model)
    tok.save(tmp_path / "tok.json")
    assert is_sentencepiece(model) and is_sentencepiece(renamed)
    assert not is_sentencepiece(tmp_path / "tok.json")
    (tmp_path / "tok.txt").write_text("\n" + (tmp_path / "tok.json").read_text())
    assert not is_sentencepiece(tmp_path / "tok.txt")
    text = "Ein Mann mit einem orangefarbenen Hut."
    assert load_tokenizer(tmp_path / "tok.txt").encode(text) == tok.encode(text)
    assert load_tokenizer(renamed).sha256() == tok.sha256()
    assert load_tokenizer(tmp_path / "tok.json").sha256() == tok.sha256()


@pytest.mark.parametrize(
    "content", [b"", b"not a model at all", b"\x0a\xff\xff\xff", b'{"json": true}']
)
def test_a_corrupt_model_is_refused_naming_the_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "broken.spm"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="broken.spm: not a SentencePiece model"):
        spm_tokenizer(path)


def test_a_missing_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="missing.model: SentencePiece model not found"):
        load_tokenizer(tmp_path / "missing.model")


@pytest.mark.parametrize("module", ["transformers.convert_slow_tokenizer", "sentencepiece"])
def test_missing_packages_name_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    path = tmp_path / "any.model"
    path.write_bytes(b"\x0a")
    monkeypatch.setitem(sys.modules, module, None)  # importing it now raises ImportError
    with pytest.raises(ConfigError, match=re.escape('pip install "tformer[import]"')):
        spm_tokenizer(path)


def test_a_converter_too_old_to_split_as_sentencepiece_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # transformers before 5.24 builds no pre-tokenizer for a SentencePiece model, so its
    # tokenizer would give other ids: that version is named instead of used.
    converter = pytest.importorskip("transformers.convert_slow_tokenizer").SpmConverter
    path = tmp_path / "any.model"
    path.write_bytes(b"\x0a")

    def before_5_24(proto: Any, vocab: Any, merges: Any = None) -> None:
        raise AssertionError("not to be called")

    monkeypatch.setattr(converter, "build_tokenizer_from_spm_proto", staticmethod(before_5_24))
    with pytest.raises(ConfigError, match=r"needs transformers 5\.24 or newer \(this is 5\."):
        spm_tokenizer(path)


@needs_multi30k
def test_marian_folder_problems_are_named(joint_marian: tuple[Path, Any], tmp_path: Path) -> None:
    folder, marian = joint_marian
    pad, eos = marian.pad_token_id, marian.eos_token_id
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    with pytest.raises(CheckpointError, match="</s> has id 0 in the vocabulary but the model's"):
        marian_tokenizers(broken, pad_id=pad, eos_id=5, decoder_start_id=pad)
    with pytest.raises(CheckpointError, match="decoder_start_token_id 99999 lies outside"):
        marian_tokenizers(broken, pad_id=pad, eos_id=eos, decoder_start_id=99999)
    (broken / "target.spm").unlink()
    with pytest.raises(CheckpointError, match="target.spm: SentencePiece model not found"):
        marian_tokenizers(broken, pad_id=pad, eos_id=eos, decoder_start_id=pad)
    shutil.copy(folder / "target.spm", broken / "target.spm")
    (broken / "vocab.json").write_text('{"</s>": 0, "<pad>": 1}', encoding="utf-8")
    with pytest.raises(CheckpointError, match="vocab.json: the special token <unk> is not in"):
        marian_tokenizers(broken, pad_id=1, eos_id=0, decoder_start_id=1)
    (broken / "vocab.json").write_text('{"</s>": 0, "<unk>": 1, "<pad>": 3}', encoding="utf-8")
    with pytest.raises(CheckpointError, match="vocab.json: the ids must be the integers 0..2"):
        marian_tokenizers(broken, pad_id=3, eos_id=0, decoder_start_id=3)
