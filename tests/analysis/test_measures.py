"""One evaluate, score and ablate for every family: ``tformer.evaluate`` / ``score`` / ``ablate``
give, for each family's checkpoint, what that family's own measure gives, and refuse in one
line the examples or options the family does not read."""

from __future__ import annotations

from pathlib import Path

import pytest

import tformer
from tformer.analysis.ablate import ablate_language, ablate_pairs
from tformer.analysis.evaluate import evaluate_pairs
from tformer.analysis.language import evaluate_language
from tformer.analysis.score import score_pair
from tformer.analysis.score_text import score_masked_text, score_text
from tformer.checkpoint import Checkpoint, load_checkpoint
from tformer.config import RECIPES, ModelConfig, TrainConfig
from tformer.data.lm import load_texts
from tformer.data.sources import load_text_pairs
from tformer.decoding.settings import DecodingConfig
from tformer.errors import ConfigError
from tformer.training.reporting import TrainResult
from tformer.training.run import train


def language_model(arch: str, out: Path) -> Checkpoint:
    """A few steps of a tiny language model on the bundled text: its measures need weights,
    not skill."""
    recipe = RECIPES["dates-text"]
    config = TrainConfig(**{**recipe["train"], "time_budget": None, "max_steps": 3,
                            "eval_every": 3, "save_every": 3, "val_bleu": 0})  # fmt: skip
    model = ModelConfig(**{**recipe["model"], "arch": arch, "d_model": 32, "d_ff": 64,
                           "n_encoder_layers": 1, "n_decoder_layers": 1})  # fmt: skip
    return load_checkpoint(train(model, config, out=out).run_dir)


@pytest.fixture(scope="module", params=["decoder-only", "encoder-only"])
def lm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return language_model(request.param, tmp_path_factory.mktemp("lm") / request.param)


@pytest.fixture(scope="module")
def documents() -> list[str]:
    return load_texts(None)["validation"][:12]


@pytest.fixture(scope="module")
def translator(trained: TrainResult) -> Checkpoint:
    return load_checkpoint(trained.run_dir)


@pytest.fixture(scope="module")
def pairs(toy_data: Path) -> list[tuple[str, str]]:
    return load_text_pairs(str(toy_data))["test"][:16]


def test_evaluate_translates_a_translation_models_pairs(
    translator: Checkpoint, pairs: list[tuple[str, str]]
) -> None:
    greedy = DecodingConfig(max_new_tokens=16)
    got = tformer.evaluate(translator, pairs, split="validation", decoding=greedy)
    want = evaluate_pairs(translator, pairs, split="validation", decoding=greedy)
    assert isinstance(got, tformer.Evaluation)
    assert (got.scores.bleu, got.loss, got.hypotheses) == (
        want.scores.bleu, want.loss, want.hypotheses
    )
    assert got.split == "validation" and got.pairs == len(pairs)


def test_evaluate_measures_a_language_models_documents(
    lm: Checkpoint, documents: list[str]
) -> None:
    got = tformer.evaluate(lm, documents)
    want = evaluate_language(lm, documents)
    assert isinstance(got, tformer.LanguageEvaluation)
    assert (got.loss, got.tokens, got.metrics) == (want.loss, want.tokens, want.metrics)
    key = "masked_accuracy" if lm.model.fills_masks else "bits_per_char"
    assert key in got.metrics


def test_score_takes_each_familys_way(
    translator: Checkpoint, lm: Checkpoint, pairs: list[tuple[str, str]], documents: list[str]
) -> None:
    source, reference = pairs[0]
    got = tformer.score(translator, reference, source=source)
    smoothing = translator.train_config.label_smoothing
    want = score_pair(translator.model, translator.tokenizers, source, reference,
                      label_smoothing=smoothing)  # fmt: skip
    assert (got.loss, got.label_ids) == (want.loss, want.label_ids)

    text = documents[0]
    scorer = score_masked_text if lm.model.fills_masks else score_text
    got = tformer.score(lm, text, label_smoothing=0.0)
    want = scorer(lm.model, lm.tokenizers, text, label_smoothing=0.0)
    assert (got.loss, got.label_ids, got.masked) == (want.loss, want.label_ids, want.masked)


def test_ablate_ranks_heads_on_each_familys_examples(
    translator: Checkpoint, lm: Checkpoint, pairs: list[tuple[str, str]], documents: list[str]
) -> None:
    got = tformer.ablate(translator, pairs[:8])
    want = ablate_pairs(translator.model, translator.tokenizers, pairs[:8])
    assert got.to_dict() == want.to_dict()
    got = tformer.ablate(lm, documents[:6])
    want = ablate_language(lm, documents[:6])
    assert got.to_dict() == want.to_dict() and got.unit == "documents"


def test_each_family_refuses_what_it_does_not_read(
    translator: Checkpoint, lm: Checkpoint, pairs: list[tuple[str, str]], documents: list[str]
) -> None:
    with pytest.raises(ConfigError, match="pairs, not on documents"):
        tformer.evaluate(translator, documents)
    with pytest.raises(ConfigError, match="documents .strings., not on pairs"):
        tformer.evaluate(lm, pairs)
    with pytest.raises(ConfigError, match="against its source"):
        tformer.score(translator, pairs[0][1])
    with pytest.raises(ConfigError, match="without a source"):
        tformer.score(lm, documents[0], source="a source")
    with pytest.raises(ConfigError, match="ablated by its loss"):
        tformer.ablate(lm, documents, metric="bleu")
