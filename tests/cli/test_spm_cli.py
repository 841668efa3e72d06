"""SentencePiece models through the command line: train, prepare and train-tokenizer take a
``.spm`` / ``.model`` file and write a tformer tokenizer.json that cuts text as it does."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import SHARED, write_jsonl
from tformer.cli.commands import app
from tformer.data.spm import spm_tokenizer
from tformer.data.tokenizer import Tokenizer

spm = pytest.importorskip("sentencepiece")
pytest.importorskip("transformers")

MULTI30K = SHARED / "data" / "multi30k"
pytestmark = pytest.mark.skipif(not MULTI30K.is_dir(), reason="Multi30k is not beside the checkout")
TINY = [
    "--preset", "tiny", "--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--d-ff", "64",
    "--max-len", "48", "--max-tokens", "512", "--eval-every", "2", "--save-every", "2",
]  # fmt: skip


def lines(name: str) -> list[str]:
    return (MULTI30K / name).read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A joint SentencePiece model of Multi30k's two sides (a file named .spm, as Marian and
    OPUS-MT name theirs), and a few hundred of its pairs as a data folder."""
    root = tmp_path_factory.mktemp("spm-cli")
    texts = lines("train.en")[:3000] + lines("train.de")[:3000]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(root / "joint"),
        vocab_size=1000,
        num_threads=1,
        minloglevel=2,
    )
    (root / "joint.model").rename(root / "joint.spm")
    pairs = [
        {"source": en, "target": de}
        for en, de in zip(lines("train.en")[:300], lines("train.de")[:300], strict=True)
    ]
    write_jsonl(root / "data" / "train.jsonl", pairs[:280])
    write_jsonl(root / "data" / "validation.jsonl", pairs[280:])
    return root


def assert_cuts_as_sentencepiece(tok: Tokenizer, model: Path) -> None:
    """Every test2016 line gets sentencepiece's pieces (<unk> where it shows the characters)."""
    processor = spm.SentencePieceProcessor(model_file=str(model))
    for text in lines("test2016.en") + lines("test2016.de"):
        want = [
            "<unk>" if i == processor.unk_id() else processor.id_to_piece(i)
            for i in processor.encode(text)
        ]
        assert tok.tokens(tok.encode(text)) == want, text


def invoke(*args: str | Path) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.slow
def test_train_with_a_sentencepiece_model(world: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    invoke("train", "--data", world / "data", "--tokenizer", world / "joint.spm", "--out", out,
           "--max-steps", "2", *TINY)  # fmt: skip
    saved = out / (out / "latest").read_text().strip() / "tokenizer.json"
    tok = Tokenizer.load(saved)
    assert tok.sha256() == spm_tokenizer(world / "joint.spm").sha256()
    assert tok.vocab_size == 1001  # sentencepiece's 1,000 pieces and tformer's <pad>
    assert_cuts_as_sentencepiece(tok, world / "joint.spm")


def test_prepare_with_a_sentencepiece_model(world: Path, tmp_path: Path) -> None:
    out = tmp_path / "prepared"
    invoke("prepare", "--data", world / "data", "--tokenizer", world / "joint.spm", "--out", out)
    tok = Tokenizer.load(out / "tokenizer.json")
    assert_cuts_as_sentencepiece(tok, world / "joint.spm")


def test_train_tokenizer_converts_a_sentencepiece_model(world: Path, tmp_path: Path) -> None:
    out = tmp_path / "tok.json"
    said = invoke("train-tokenizer", "--sentencepiece", world / "joint.spm", "--out", out)
    assert "1,001 tokens" in said
    tok = Tokenizer.load(out)
    assert tok.sha256() == spm_tokenizer(world / "joint.spm").sha256()
    assert_cuts_as_sentencepiece(tok, world / "joint.spm")
