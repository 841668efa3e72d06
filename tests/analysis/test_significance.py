"""Paired significance: sacreBLEU's paired bootstrap and approximate randomisation of two
systems, checked against sacreBLEU's own PairedTest; refusals of what cannot be compared."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from tformer import compare_systems, paired_significance
from tformer.analysis.significance import MAX_DRAWS, MAX_SAMPLES, MIN_SAMPLES
from tformer.errors import ConfigError, DataError

WORDS = ("the cat dog sat ran on under a mat park house red small quickly today we they "
         "saw found old new tree river city night morning book").split()


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 12))) for _ in range(n)]


def corrupted(lines: list[str], every: int = 1, seed: int = 1) -> list[str]:
    """Every ``every``-th line with three of its words replaced."""
    rng = random.Random(seed)
    out = []
    for i, line in enumerate(lines):
        words = line.split()
        if i % every == 0:
            for j in rng.sample(range(len(words)), 3):
                words[j] = rng.choice(WORDS)
        out.append(" ".join(words))
    return out


REFS = sentences(200)
WORSE = corrupted(REFS)
BETTER = corrupted(REFS, every=10, seed=2)  # the references on nine lines of ten


@pytest.mark.parametrize("test", ["bs", "ar"])
def test_identical_systems_do_not_differ(test: str) -> None:
    result = paired_significance(REFS, WORSE, list(WORSE), test=test, n_samples=200)
    assert result.identical
    assert [m.metric for m in result.metrics] == ["BLEU", "chrF2"]
    for m in result.metrics:
        assert m.difference == 0.0 and m.a.score == m.b.score
        assert m.p_value == 1.0 and not m.significant
    assert "does not differ" in result.verdict()


@pytest.mark.parametrize("test", ["bs", "ar"])
def test_a_clearly_better_system_is_significant(test: str) -> None:
    result = paired_significance(REFS, WORSE, BETTER, test=test, n_samples=500)
    assert not result.identical and result.lines == len(REFS)
    for m in result.metrics:
        assert m.difference > 10 and m.p_value < 0.05 and m.significant
        assert m.a.mean - m.a.ci < m.a.score < m.a.mean + m.a.ci  # the 95% interval
        assert m.a.mean + m.a.ci < m.b.mean - m.b.ci  # the intervals are apart
    assert "BLEU: B is significantly better than A" in result.verdict()
    worse = paired_significance(REFS, BETTER, WORSE, test=test, n_samples=500)
    assert all(m.difference < 0 and m.significant for m in worse.metrics)
    assert "significantly worse" in worse.verdict()


@pytest.mark.parametrize(("test", "seed"), [("bs", 12345), ("bs", 7), ("ar", 99)])
def test_the_figures_are_sacrebleus_own(
    test: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same inputs and seed through sacreBLEU's PairedTest, as `sacrebleu --paired-*` runs
    it, give the same scores, intervals, p-values and signatures."""
    a, b = WORSE, corrupted(REFS, every=2, seed=3)  # a closer race: p is not at its floor
    ours = paired_significance(REFS, a, b, test=test, n_samples=300, seed=seed)
    monkeypatch.setenv("SACREBLEU_SEED", str(seed))
    signatures, scores = PairedTest(
        [("A", a), ("B", b)], {"BLEU": BLEU(), "chrF": CHRF()}, [REFS], test_type=test,
        n_samples=300, n_ar_confidence=1000 if test == "ar" else -1,
    )()  # fmt: skip
    assert [m.metric for m in ours.metrics] == list(signatures)
    for m in ours.metrics:
        want_a, want_b = scores[m.metric]
        assert m.signature == str(signatures[m.metric])
        assert (m.a.score, m.a.mean, m.a.ci) == (want_a.score, want_a.mean, want_a.ci)
        assert (m.b.score, m.b.mean, m.b.ci) == (want_b.score, want_b.mean, want_b.ci)
        assert m.p_value == want_b.p_value
        assert m.difference == want_b.score - want_a.score
    assert f"seed:{seed}" in ours.metrics[0].signature
    assert f"{test}:300" in ours.metrics[0].signature


def test_the_seed_decides_the_resamples_and_leaves_the_environment_alone() -> None:
    before = os.environ.get("SACREBLEU_SEED")
    b = corrupted(REFS, every=2, seed=3)
    one = paired_significance(REFS, WORSE, b, n_samples=200, seed=1)
    again = paired_significance(REFS, WORSE, b, n_samples=200, seed=1)
    other = paired_significance(REFS, WORSE, b, n_samples=200, seed=2)
    assert one == again
    assert one.metrics[0].a.mean != other.metrics[0].a.mean
    assert os.environ.get("SACREBLEU_SEED") == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_samples": MIN_SAMPLES - 1}, "--n-samples 99 is out of range"),
        ({"n_samples": MAX_SAMPLES + 1}, "--n-samples 100001 is out of range"),
        ({"seed": 0}, "--seed 0 is out of range"),
        ({"seed": -5}, "--seed -5 is out of range"),
        ({"test": "t"}, "test 't' is not one of bs, ar"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        paired_significance(REFS, WORSE, BETTER, **kwargs)  # type: ignore[arg-type]


def test_the_work_is_bounded_before_any_resampling() -> None:
    lines = MAX_DRAWS // MAX_SAMPLES + 1
    refs = sentences(lines)
    with pytest.raises(ConfigError, match="resampled lines, over the .*lower --n-samples"):
        paired_significance(refs, refs, refs, n_samples=MAX_SAMPLES)


def test_lines_that_do_not_line_up_are_refused() -> None:
    with pytest.raises(DataError, match="system B: 199 lines, but system A: 200 lines"):
        paired_significance(REFS, WORSE, BETTER[:-1])
    with pytest.raises(DataError, match="system A: 199 lines, but the references: 200 lines"):
        paired_significance(REFS, WORSE[:-1], BETTER[:-1])
    with pytest.raises(DataError, match="no lines to compare"):
        paired_significance([], [], [])


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_files_compare_as_their_lines(tmp_path: Path) -> None:
    refs = write_lines(tmp_path / "ref.txt", REFS)
    a, b = write_lines(tmp_path / "a.txt", WORSE), write_lines(tmp_path / "b.txt", BETTER)
    result = compare_systems(a, b, references=refs, n_samples=200)
    assert result == paired_significance(
        REFS, WORSE, BETTER, n_samples=200, names=(str(refs), str(a), str(b))
    )
    (tmp_path / "crlf.txt").write_bytes(b"".join(x.encode() + b"\r\n" for x in BETTER))
    crlf = compare_systems(a, tmp_path / "crlf.txt", references=refs, n_samples=200)
    assert crlf.metrics == result.metrics  # Windows line ends are line ends
