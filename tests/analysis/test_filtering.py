"""Corpus filtering: the dual conditional cross-entropy of each pair against the formula
computed by hand from two models' own teacher-forced losses, corrupted pairs scored worse and
dropped, copies found and never kept unless asked, and the selection rules picking exactly the
pairs they name."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.analysis.test_measures import language_model
from tests.checkpoint.test_checkpoint import _model_and_tokenizers
from tests.conftest import digit_pairs, tiny_model, write_jsonl
from tformer.analysis import filtering
from tformer.analysis.filtering import (
    CorpusScores,
    check_reverse,
    contrast_score,
    copied_pairs,
    dual_score,
    mismatched,
    score_corpus,
    select,
)
from tformer.checkpoint import Checkpoint, Tokenizers, load_checkpoint
from tformer.config import BOS_ID, EOS_ID, TrainConfig
from tformer.data.sources import load_text_pairs
from tformer.errors import ConfigError
from tformer.training.reporting import TrainResult
from tformer.training.run import train

Pair = tuple[str, str]


@pytest.fixture(scope="module")
def forward(trained: TrainResult) -> Checkpoint:
    """The digit model (digits -> words), which translates its data well."""
    return load_checkpoint(trained.run_dir)


@pytest.fixture(scope="module")
def reverse(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    """A tiny words -> digits model, trained briefly on the reversed digit task."""
    root = tmp_path_factory.mktemp("reverse")
    flipped = [{"source": p["target"], "target": p["source"]} for p in digit_pairs(2000, 1)]
    write_jsonl(root / "data" / "train.jsonl", flipped)
    config = TrainConfig(data=str(root / "data"), max_tokens=1024, lr=3e-3, warmup_steps=30,
                         max_steps=250, eval_every=250, save_every=250, log_every=50,
                         label_smoothing=0.0, seed=0, val_bleu=0)  # fmt: skip
    return load_checkpoint(train(tiny_model(), config, out=root / "run", vocab_size=64).run_dir)


@pytest.fixture(scope="module")
def clean(toy_data: Path) -> list[Pair]:
    return list(load_text_pairs(str(toy_data))["test"][:120])


def by_hand(ckpt: Checkpoint, source: str, target: str) -> float:
    """H(target | source): torch's own cross-entropy over one pair's logits, no tformer
    scoring code between."""
    src = ckpt.tokenizers.source.encode(source)
    tgt = ckpt.tokenizers.target.encode(target)
    with torch.no_grad():
        logits = ckpt.model(torch.tensor([src]), torch.tensor([[BOS_ID, *tgt]])).logits
    return float(F.cross_entropy(logits[0].float(), torch.tensor([*tgt, EOS_ID])))


def corrupt(pairs: list[Pair]) -> tuple[list[Pair], set[int]]:
    """Every sixth pair spoilt: its target taken from another pair (misaligned) or its source
    copied into its target (an untranslated copy). Returns the corpus and the spoilt ones."""
    out, spoilt = list(pairs), set()
    for i in range(0, len(pairs), 6):
        source = pairs[i][0]
        other = pairs[(i + 7) % len(pairs)][1]
        out[i] = (source, other if i % 12 else source)
        spoilt.add(i)
    return out, spoilt


def test_the_score_is_the_dual_conditional_cross_entropy_of_the_losses_by_hand(
    forward: Checkpoint, reverse: Checkpoint, clean: list[Pair]
) -> None:
    pairs = [*clean[:10], ("3 1", ""), ("", "one"), *clean[10:14]]
    scores = score_corpus(forward, pairs, reverse=reverse)
    for i, (source, target) in enumerate(pairs):
        if not source or not target:  # no side may be empty: no score, never kept
            assert math.isnan(scores.score[i]) and math.isnan(scores.forward[i])
            continue
        h_a, h_b = by_hand(forward, source, target), by_hand(reverse, target, source)
        assert scores.forward[i] == pytest.approx(h_a, abs=1e-5)
        assert scores.reverse is not None and scores.reverse[i] == pytest.approx(h_b, abs=1e-5)
        assert scores.score[i] == pytest.approx(abs(h_a - h_b) + 0.5 * (h_a + h_b), abs=1e-5)
    assert 10 not in select(scores, keep=1.0).kept.tolist()


def test_without_a_reverse_model_the_score_is_the_forward_cross_entropy(
    forward: Checkpoint, clean: list[Pair]
) -> None:
    scores = score_corpus(forward, clean[:8])
    assert scores.reverse is None
    want = [by_hand(forward, s, t) for s, t in clean[:8]]
    assert scores.score.tolist() == pytest.approx(want, abs=1e-5)


def test_chunks_give_the_scores_of_one_pass(
    forward: Checkpoint, clean: list[Pair], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scored a chunk at a time (bounded memory): the same figures, a chunk of unreadable
    pairs only included."""
    pairs = [*clean[:5], ("", "one"), ("2", ""), ("", "x"), *clean[5:9]]
    whole = score_corpus(forward, pairs)
    monkeypatch.setattr(filtering, "CHUNK_PAIRS", 3)
    seen: list[tuple[str, int, int]] = []
    chunked = score_corpus(forward, pairs, progress=lambda *a: seen.append(a))
    np.testing.assert_allclose(chunked.score, whole.score, atol=1e-5)
    assert seen == [("forward", n, 12) for n in (3, 6, 9, 12)]


@pytest.mark.parametrize("dual", [False, True], ids=["forward", "dual"])
def test_the_contrast_score_is_each_models_gain_over_another_pairs_side_by_hand(
    forward: Checkpoint, reverse: Checkpoint, clean: list[Pair], dual: bool
) -> None:
    pairs = clean[:7]
    scores = score_corpus(forward, pairs, reverse=reverse if dual else None, contrast=True)
    assert scores.contrast and (scores.reverse_other is not None) == dual
    for i, (source, target) in enumerate(pairs):
        other = pairs[(i + 3) % 7]  # the pair half the corpus (7 // 2) away
        h_a, h_a_other = by_hand(forward, source, target), by_hand(forward, other[0], target)
        want = h_a - h_a_other
        assert scores.forward_other is not None
        assert scores.forward_other[i] == pytest.approx(h_a_other, abs=1e-5)
        if dual:
            want += by_hand(reverse, target, source) - by_hand(reverse, other[1], source)
        assert scores.score[i] == pytest.approx(want, abs=1e-5)


def test_the_other_pair_is_half_the_corpus_away_and_never_the_pair_itself() -> None:
    pairs = [(f"s{i}", f"t{i}") for i in range(5)]
    assert mismatched(pairs, side=0) == [("s2", "t0"), ("s3", "t1"), ("s4", "t2"),
                                         ("s0", "t3"), ("s1", "t4")]  # fmt: skip
    assert mismatched(pairs, side=1) == [("s0", "t2"), ("s1", "t3"), ("s2", "t4"),
                                         ("s3", "t0"), ("s4", "t1")]  # fmt: skip
    gain = contrast_score(np.array([1.0, 2.0]), np.array([3.0, 2.5]), np.array([0.5, 1.0]),
                          np.array([2.0, 1.0]))  # fmt: skip
    assert gain.tolist() == [-3.5, -0.5]


@pytest.mark.parametrize(("dual", "contrast"), [(False, False), (True, False), (True, True)],
                         ids=["forward", "dual", "contrast"])  # fmt: skip
def test_corrupted_pairs_score_worse_and_keep_drops_them(
    forward: Checkpoint, reverse: Checkpoint, clean: list[Pair], dual: bool, contrast: bool
) -> None:
    pairs, spoilt = corrupt(clean)
    scores = score_corpus(forward, pairs, reverse=reverse if dual else None, contrast=contrast)
    bad = scores.score[sorted(spoilt)]
    good = np.delete(scores.score, sorted(spoilt))
    if contrast:  # a gain: a translation's far below 0, a misaligned pair's near it
        misaligned = scores.score[[i for i in spoilt if i % 12]]
        assert good.mean() < -1.0 and good.mean() < 2 * misaligned.mean()
    else:
        assert bad.mean() > 2 * good.mean()
    kept = set(select(scores, keep=1 - len(spoilt) / len(pairs)).kept.tolist())
    assert len(spoilt & kept) <= len(spoilt) // 10  # most of them dropped


def _scores(values: list[float]) -> CorpusScores:
    array = np.array(values)
    return CorpusScores(array, None, dual_score(array, None))


def test_keep_takes_the_best_share_and_threshold_the_scores_under_it() -> None:
    scores = _scores([0.5, math.nan, 0.2, 0.9, 0.2, 0.7, 0.1, 0.3])
    half = select(scores, keep=0.5)  # 4 of 8: 0.1, then the tie 0.2 / 0.2, then 0.3
    assert half.kept.tolist() == [2, 4, 6, 7] and half.cut == 0.3
    assert select(scores, keep=0.3).kept.tolist() == [2, 6]  # round(2.4): the earlier 0.2
    assert select(scores, keep=1.0).kept.tolist() == [0, 2, 3, 4, 5, 6, 7]  # never the NaN
    assert select(scores, threshold=0.2).kept.tolist() == [2, 4, 6]
    assert select(scores, threshold=0.05).kept.tolist() == []
    assert select(scores, threshold=5.0).cut == 5.0


def test_the_dual_formula() -> None:
    got = dual_score(np.array([1.0, 3.0]), np.array([3.0, 1.0]))
    assert got.tolist() == [4.0, 4.0]  # |1 - 3| + (1 + 3) / 2


@pytest.mark.parametrize(
    ("keep", "threshold", "part"),
    [(None, None, "exactly one"), (0.5, 1.0, "exactly one"), (0.0, None, "--keep 0"),
     (1.5, None, "--keep 1.5"), (None, math.inf, "--threshold inf"),
     (None, math.nan, "--threshold nan")],
)  # fmt: skip
def test_a_rule_that_is_not_exactly_one_in_range_is_refused(
    keep: float | None, threshold: float | None, part: str
) -> None:
    with pytest.raises(ConfigError, match=part):
        select(_scores([1.0]), keep=keep, threshold=threshold)


def test_a_language_model_is_refused(
    forward: Checkpoint, clean: list[Pair], tmp_path: Path
) -> None:
    lm = language_model("decoder-only", tmp_path / "lm")
    with pytest.raises(ConfigError, match="a decoder-only model; corpus filtering"):
        score_corpus(lm, clean[:2])
    with pytest.raises(ConfigError, match="--reverse"):
        score_corpus(forward, clean[:2], reverse=lm)


def test_a_reverse_model_of_the_same_direction_is_refused(tmp_path: Path) -> None:
    model, toks = _model_and_tokenizers(share=False)

    def checkpoint(tokenizers: Tokenizers, name: str) -> Checkpoint:
        return Checkpoint(model, model.config, TrainConfig(), tokenizers, 1, tmp_path / name)

    ahead = checkpoint(toks, "ahead")
    with pytest.raises(ConfigError, match="--reverse .*translates the same way"):
        check_reverse(ahead, checkpoint(toks, "again"))
    check_reverse(ahead, checkpoint(Tokenizers(toks.target, toks.source), "back"))


def test_a_copy_is_a_target_that_is_its_source_case_and_punctuation_aside() -> None:
    pairs = [("A dog runs.", "a dog runs"), ("A dog runs.", "Ein Hund rennt."),
             ("Zwei  Männer!", "zwei männer"), ("...", "..."), ("", ""),
             ("A dog", "A dog runs")]  # fmt: skip
    assert copied_pairs(pairs).tolist() == [True, False, True, False, False, False]


def test_copies_are_never_kept_unless_asked_whatever_their_score() -> None:
    values = np.array([0.5, 0.1, 0.2, 0.9])
    scores = CorpusScores(values, None, values, np.array([False, True, False, False]))
    assert select(scores, keep=0.5).kept.tolist() == [0, 2]  # the best, 0.1, is a copy
    assert select(scores, threshold=0.6).kept.tolist() == [0, 2]
    assert select(scores, keep=1.0).kept.tolist() == [0, 2, 3]
    kept = select(scores, keep=0.5, keep_copies=True)
    assert kept.kept.tolist() == [1, 2] and "--keep-copies" in kept.rule
    assert select(scores, keep=0.5).rule.endswith("of the pairs)")
