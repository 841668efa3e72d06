"""Real Marian models for the import tests, built locally (no hub): SentencePiece models trained
with the sentencepiece package on Multi30k (or the digit task where Multi30k is absent), a
MarianTokenizer saved by save_pretrained, and tiny MarianMTModels with random weights, each
made once per session."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import Result
from typer.testing import CliRunner

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

from tests.data.test_spm import marian_folder, marian_vocab  # noqa: E402

MULTI30K = Path(__file__).resolve().parents[3] / "shared" / "data" / "multi30k"
SPM_LINES = 3000
SPM_VOCAB = 250
EOS_PUSH = 2.5


def tformer(*args: str | Path) -> Result:
    """A tformer command run in this process (a subprocess would import torch and transformers
    again for each command)."""
    from tformer.cli.commands import app

    return CliRunner().invoke(app, [str(a) for a in args])


def lines(split: str, lang: str, count: int, toy_data: Path) -> list[str]:
    """``count`` lines of a Multi30k split, or of the digit task's sources / targets."""
    if MULTI30K.is_dir():
        return (MULTI30K / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
    name = {"train": "train", "val": "validation", "test2016": "test"}[split]
    key = "source" if lang == "en" else "target"
    with open(toy_data / f"{name}.jsonl", encoding="utf-8") as handle:
        return [json.loads(line)[key] for line in handle][:count]


def train_spm(out: Path, lang: str, toy_data: Path) -> Path:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines("train", lang, SPM_LINES, toy_data)),
        model_prefix=str(out / lang),
        vocab_size=SPM_VOCAB,
        model_type="unigram",
        num_threads=1,
        minloglevel=2,
    )
    return out / f"{lang}.model"


@dataclass
class MarianCase:
    """One Marian model saved with its tokenizer, and the transformers objects."""

    folder: Path
    model: Any  # MarianMTModel, eval mode
    tokenizer: Any  # MarianTokenizer


# name -> (activation, joint vocabulary and shared embeddings, tied output)
CASES: dict[str, tuple[str, bool, bool]] = {
    "swish-shared-tied": ("swish", True, True),
    "relu-shared-untied": ("relu", True, False),
    "gelu-separate-tied": ("gelu", False, True),
    "swish-separate-untied": ("swish", False, False),
}


def marian_model(tokenizer: Any, activation: str, shared: bool, tied: bool, seed: int) -> Any:
    """A tiny MarianMTModel with random weights far from their initial values (every tensor
    must map), and a nonzero final_logits_bias."""
    target_size = len(tokenizer.target_encoder) if not shared else None
    config = transformers.MarianConfig(
        vocab_size=len(tokenizer.encoder),
        decoder_vocab_size=target_size,
        share_encoder_decoder_embeddings=shared,
        tie_word_embeddings=tied,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function=activation,
        max_position_embeddings=64,
        scale_embedding=True,
        dropout=0.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        forced_eos_token_id=None,
    )
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:
                continue
            p.normal_(std=0.3 if p.dim() == 2 else 0.2)
            if "layer_norm" in name and name.endswith("weight"):
                p.add_(1.0)
        model.final_logits_bias.normal_(std=0.5)
        # Random models seldom end; a push towards </s> makes outputs of many lengths, so
        # that beam search's length penalty and finished hypotheses are exercised too.
        model.final_logits_bias[0, tokenizer.eos_token_id] += EOS_PUSH
        if shared:  # untied, transformers shares nothing; a converted OPUS-MT model has one matrix
            inner = model.model
            for embedding in (inner.encoder.embed_tokens, inner.decoder.embed_tokens):
                embedding.weight.copy_(inner.shared.weight)
    return model


@pytest.fixture(scope="session")
def spm_pair(toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("import-spm")
    return train_spm(out, "en", toy_data), train_spm(out, "de", toy_data)


@pytest.fixture(scope="session")
def marian_case(
    spm_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], MarianCase]:
    """name (of ``CASES``) -> a saved Marian folder, built once."""
    done: dict[str, MarianCase] = {}

    def get(name: str) -> MarianCase:
        if name not in done:
            activation, shared, tied = CASES[name]
            en, de = spm_pair
            root = tmp_path_factory.mktemp("marian") / name
            if shared:
                tokenizer = marian_folder(root, en, de, marian_vocab(en, de))
            else:
                tokenizer = marian_folder(root, en, de, marian_vocab(en), marian_vocab(de))
            model = marian_model(tokenizer, activation, shared, tied, seed=len(done))
            folder = root / "saved"
            model.save_pretrained(str(folder))
            done[name] = MarianCase(folder, model, tokenizer)
        return done[name]

    return get
