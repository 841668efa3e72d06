"""Paired significance of two systems' translations of one test set (Koehn 2004).

The test is sacreBLEU's own (``sacrebleu.significance.PairedTest``, what ``sacrebleu
--paired-bs`` and ``--paired-ar`` run): paired bootstrap resampling, or paired approximate
randomisation, over BLEU and chrF measured as ``tformer.metrics`` measures them. This module
reads the two systems (hypothesis files, or the card folders ``tformer evaluate`` writes),
checks that they translate the same references line by line, bounds the work, and reports the
difference B - A, each system's 95% confidence interval and the p-value.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tformer.analysis.evaluate import BUNDLED_DATES, data_fingerprint
from tformer.config.checks import SEED_LIMIT
from tformer.errors import CheckpointError, ConfigError, DataError, TformerError
from tformer.source_files import MIB, read_json, read_lines

TESTS = {"bs": "paired bootstrap resampling", "ar": "paired approximate randomisation"}
DEFAULT_SAMPLES = {"bs": 1000, "ar": 10000}  # sacreBLEU's defaults for each test
AR_CONFIDENCE = 1000  # bootstrap resamples behind AR's intervals (sacreBLEU's default)
DEFAULT_SEED = 12345  # sacreBLEU's
MIN_SAMPLES, MAX_SAMPLES = 100, 100_000  # below 100 the 2.5% tails are one or no resample
MAX_LINES = 1_000_000
# Resampled lines in one test: sacreBLEU gathers every resample's statistics at once, about
# 80 bytes a line (chrF's 18 counts as float32 and an index), so this bounds the memory.
MAX_DRAWS = 32_000_000
TEXT_BYTES = 256 * MIB
CARD_BYTES = 64 * MIB
ALPHA = 0.05
CARD = "result.json"
HYPOTHESES = "hypotheses.txt"


@dataclass(frozen=True)
class SystemScore:
    """One system's corpus score and the bootstrap's 95% interval around its mean."""

    score: float
    mean: float
    ci: float  # half the width of the interval: mean +- ci, as sacreBLEU prints it

    def to_json(self) -> dict[str, float]:
        return {
            "score": round(self.score, 4),
            "mean": round(self.mean, 4),
            "ci": round(self.ci, 4),
            "ci_low": round(self.mean - self.ci, 4),
            "ci_high": round(self.mean + self.ci, 4),
        }


@dataclass(frozen=True)
class MetricTest:
    """The paired test of one metric: both systems' scores and the p-value of B != A."""

    metric: str
    signature: str
    a: SystemScore
    b: SystemScore
    p_value: float

    @property
    def difference(self) -> float:
        return self.b.score - self.a.score

    @property
    def significant(self) -> bool:
        return self.p_value < ALPHA

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "signature": self.signature,
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "difference": round(self.difference, 4),
            "p_value": self.p_value,
            "significant": self.significant,
        }


@dataclass(frozen=True)
class PairedSignificance:
    """Two systems compared on one test set, metric by metric."""

    test: str  # "bs" or "ar"
    n_samples: int
    seed: int
    lines: int
    identical: bool  # the two outputs are the same line for line
    metrics: tuple[MetricTest, ...]
    system_a: str = "A"
    system_b: str = "B"
    references: str = ""

    @property
    def method(self) -> str:
        return TESTS[self.test]

    def verdict(self) -> str:
        """One line: whether B differs significantly from A at p < 0.05, metric by metric."""
        if self.identical:
            return f"at p < {ALPHA}, B does not differ from A: the outputs are identical"
        parts = []
        for m in self.metrics:
            if m.significant:
                way = "better" if m.difference > 0 else "worse"
                parts.append(f"{m.metric}: B is significantly {way} than A (p = {m.p_value:.4f})")
            else:
                parts.append(f"{m.metric}: no significant difference (p = {m.p_value:.4f})")
        return f"at p < {ALPHA}, " + "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "test": f"paired-{self.test}",
            "method": self.method,
            "n_samples": self.n_samples,
            "seed": self.seed,
            "lines": self.lines,
            "alpha": ALPHA,
            "system_a": self.system_a,
            "system_b": self.system_b,
            "references": self.references,
            "identical": self.identical,
            "metrics": [m.to_json() for m in self.metrics],
            "verdict": self.verdict(),
        }


def check_test(test: str, n_samples: int | None, seed: int) -> int:
    """The number of resamples (or trials) ``test`` runs, ``n_samples`` checked.

    Raises:
        ConfigError: an unknown test, ``n_samples`` or ``seed`` out of range, naming the flag.
    """
    if test not in TESTS:
        raise ConfigError(f"test {test!r} is not one of {', '.join(TESTS)}")
    n = DEFAULT_SAMPLES[test] if n_samples is None else n_samples
    if not MIN_SAMPLES <= n <= MAX_SAMPLES:
        raise ConfigError(
            f"--n-samples {n} is out of range; use {MIN_SAMPLES:,} to {MAX_SAMPLES:,}"
        )
    # sacreBLEU reads a seed of 0 as no seed at all (a new draw every run).
    if not 1 <= seed <= SEED_LIMIT:
        raise ConfigError(f"--seed {seed} is out of range; use a seed from 1 to {SEED_LIMIT}")
    return n


def paired_significance(
    references: Sequence[str],
    hyps_a: Sequence[str],
    hyps_b: Sequence[str],
    *,
    test: str = "bs",
    n_samples: int | None = None,
    seed: int = DEFAULT_SEED,
    names: tuple[str, str, str] = ("the references", "system A", "system B"),
) -> PairedSignificance:
    """BLEU and chrF of ``hyps_a`` and ``hyps_b`` against ``references`` (one a line), with
    sacreBLEU's paired test of B against A.

    Args:
        test: "bs" (paired bootstrap resampling) or "ar" (paired approximate randomisation).
        n_samples: resamples ("bs") or trials ("ar"); None for sacreBLEU's default.
        seed: the resampling's seed (at least 1): the same seed gives the same figures.
        names: the references and the two systems as messages name them (their files).

    Raises:
        ConfigError: a bad ``test``, ``n_samples`` or ``seed``, or more resampled lines than
            ``MAX_DRAWS``.
        DataError: no lines, or line counts that differ.
    """
    n = check_test(test, n_samples, seed)
    counts = (len(references), len(hyps_a), len(hyps_b))
    for x, y in ((1, 2), (0, 1)):
        if counts[x] != counts[y]:
            raise DataError(
                f"{names[y]}: {counts[y]:,} lines, but {names[x]}: {counts[x]:,} lines; both "
                "must hold one line for each line of the same test set"
            )
    if not references:
        raise DataError(f"{names[0]}: no lines to compare")
    lines = len(references)
    if lines > MAX_LINES:
        raise DataError(f"{names[0]}: {lines:,} lines, over the {MAX_LINES:,} one test may have")
    if n * lines > MAX_DRAWS:
        raise ConfigError(
            f"--n-samples {n:,} x {lines:,} lines is {n * lines:,} resampled lines, over the "
            f"{MAX_DRAWS:,} one test may draw; lower --n-samples"
        )
    signatures, scores = _paired_test(references, hyps_a, hyps_b, test, n, seed)
    identical = list(hyps_a) == list(hyps_b)
    tests = tuple(
        MetricTest(
            metric=name,
            signature=str(signature),
            a=_system_score(scores[name][0]),
            b=_system_score(scores[name][1]),
            # sacreBLEU counts the resamples whose difference exceeds the observed one, so
            # outputs that never differ would read p = 1 / (n + 1): no evidence, so p = 1.
            p_value=1.0 if identical else float(scores[name][1].p_value),
        )
        for name, signature in signatures.items()
    )
    return PairedSignificance(
        test=test, n_samples=n, seed=seed, lines=lines, identical=identical, metrics=tests,
        system_a=names[1], system_b=names[2], references=names[0],
    )  # fmt: skip


_SEED_LOCK = threading.Lock()


@contextmanager
def _sacrebleu_seed(seed: int) -> Iterator[None]:
    """``SACREBLEU_SEED`` set to ``seed`` while the test runs, then put back as it was."""
    # sacreBLEU reads its seed from the environment only; the lock keeps two threads' tests
    # from reading each other's.
    with _SEED_LOCK:
        before = os.environ.get("SACREBLEU_SEED")
        os.environ["SACREBLEU_SEED"] = str(seed)
        try:
            yield
        finally:
            if before is None:
                del os.environ["SACREBLEU_SEED"]
            else:
                os.environ["SACREBLEU_SEED"] = before


def _paired_test(
    references: Sequence[str],
    hyps_a: Sequence[str],
    hyps_b: Sequence[str],
    test: str,
    n: int,
    seed: int,
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """sacreBLEU's PairedTest of B against the baseline A: signatures and results by metric."""
    from sacrebleu.significance import PairedTest  # slow to import; only this test needs it

    from tformer.metrics import sacrebleu_metrics

    bleu, chrf = sacrebleu_metrics()
    with _sacrebleu_seed(seed):
        paired = PairedTest(
            [("A", list(hyps_a)), ("B", list(hyps_b))],
            {"BLEU": bleu, "chrF": chrf},
            [list(references)],
            test_type=test,
            n_samples=n,
            # -1 for the bootstrap: its intervals come from its own resamples.
            n_ar_confidence=AR_CONFIDENCE if test == "ar" else -1,
        )
        signatures, scores = paired()
    return signatures, scores


def _system_score(result: Any) -> SystemScore:
    return SystemScore(score=float(result.score), mean=float(result.mean), ci=float(result.ci))


# -- systems from files -----------------------------------------------------------------------


@dataclass(frozen=True)
class System:
    """One system's outputs: a hypotheses file, or the card folder of ``tformer evaluate``."""

    path: Path
    hypotheses: list[str]
    card: dict[str, Any] | None = None


def _lines(path: Path, what: str) -> list[str]:
    """The lines of ``path`` through the one reader of outside files, as a data error."""
    try:
        return read_lines(path, TEXT_BYTES, MAX_LINES, what)
    except CheckpointError as error:
        raise DataError(str(error)) from None


def read_system(path: Path) -> System:
    """A system's hypotheses: the file ``path`` (one a line), or ``hypotheses.txt`` of the
    ``tformer evaluate`` card folder ``path`` with its card.

    Raises:
        DataError: naming the file: missing, not a regular file, not UTF-8, empty, too large,
            or a folder that is no card of translations.
    """
    if not path.is_dir():
        return System(path, _lines(path, "one hypothesis a line"))
    missing = "a folder given as a system must be one `tformer evaluate` wrote"
    try:
        card = read_json(path / CARD, CARD_BYTES, missing)
    except CheckpointError as error:
        raise DataError(str(error)) from None
    if "documents" in card:
        raise DataError(
            f"{path}: the card of a language model, which has no translations to compare"
        )
    for key, kind in (("split", str), ("data", str), ("data_sha256", str), ("pairs", int)):
        if not isinstance(card.get(key), kind) or isinstance(card.get(key), bool):
            raise DataError(
                f"{path / CARD}: no {key!r} of the right type: not a card `tformer evaluate` "
                "wrote of a translation model"
            )
    return System(path, _lines(path / HYPOTHESES, "one hypothesis a line"), card)


def check_same_test_set(a: System, b: System) -> None:
    """Refuse two card folders measured on different splits or data.

    Raises:
        DataError: naming both folders and what each measured.
    """
    if a.card is None or b.card is None:
        return
    if (a.card["split"], a.card["data_sha256"]) != (b.card["split"], b.card["data_sha256"]):
        raise DataError(
            f"{a.path} measured {_test_set(a.card)} but {b.path} measured {_test_set(b.card)}: "
            "compare two systems' outputs of the same test set"
        )


def _test_set(card: dict[str, Any]) -> str:
    return (
        f"split {card['split']!r} of {card['data']} ({card['pairs']:,} pairs, "
        f"sha256 {card['data_sha256'][:12]})"
    )


def card_references(system: System) -> list[str]:
    """The references of the split ``system``'s card names, checked against its fingerprint.

    Raises:
        DataError: the data cannot be read, or is no longer what the card measured.
    """
    from tformer.data.prepare import text_splits  # reads data: only this path needs it

    card = system.card
    assert card is not None
    recorded = card.get("train")
    train: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    fields = {
        key: train[key] if isinstance(train.get(key), str) else default
        for key, default in (("source_field", "source"), ("target_field", "target"))
    }
    data = None if card["data"] == BUNDLED_DATES else card["data"]
    where = f"{system.path}: the references of its {_test_set(card)}"
    try:
        pairs = list(text_splits(data, **fields).get(card["split"], ()))[: card["pairs"]]
    except TformerError as error:
        raise DataError(f"{where} cannot be read ({error}); give --references FILE") from None
    if data_fingerprint(pairs) != card["data_sha256"]:
        raise DataError(f"{where} are no longer what it measured; give --references FILE")
    return [target for _, target in pairs]


def compare_systems(
    system_a: Path,
    system_b: Path,
    *,
    references: Path | None = None,
    test: str = "bs",
    n_samples: int | None = None,
    seed: int = DEFAULT_SEED,
) -> PairedSignificance:
    """:func:`paired_significance` of two systems read by :func:`read_system`.

    Args:
        references: one reference a line; None for the references of the split a card folder
            names (read from its data and checked against the card's fingerprint).

    Raises:
        ConfigError: a bad option, or no references to be had.
        DataError: a file cannot be read, or the two systems or the references do not line up.
    """
    check_test(test, n_samples, seed)  # before any file is read
    a, b = read_system(system_a), read_system(system_b)
    check_same_test_set(a, b)
    if references is not None:
        refs, refs_name = _lines(references, "one reference a line"), str(references)
    else:
        carded = a if a.card is not None else b if b.card is not None else None
        if carded is None:
            raise ConfigError(
                "give --references FILE: neither system is a `tformer evaluate` card folder "
                "that names its split"
            )
        refs, refs_name = card_references(carded), _references_name(carded)
    names = (refs_name, _hypotheses_name(a), _hypotheses_name(b))
    return paired_significance(
        refs, a.hypotheses, b.hypotheses, test=test, n_samples=n_samples, seed=seed,
        names=names,
    )  # fmt: skip


def _hypotheses_name(system: System) -> str:
    return str(system.path / HYPOTHESES if system.card is not None else system.path)


def _references_name(system: System) -> str:
    assert system.card is not None
    return f"split {system.card['split']!r} of {system.card['data']}"
