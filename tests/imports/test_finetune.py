"""Fine-tuning an imported model: `train --init-from` keeps its tokenizers (two SentencePiece
models over one joint vocabulary, one shared embedding), applies the imported-model defaults
(stated in the run's output, each overridable), and the loss falls."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import write_jsonl
from tests.imports.conftest import MarianCase, lines
from tformer.checkpoint import load_checkpoint
from tformer.cli.commands import app
from tformer.imports import import_model
from tformer.training.configs import IMPORTED_DEFAULTS
from tformer.training.reporting import Reporter, TrainResult
from tformer.training.run import Settings, train

STEPS = 40


def pairs(split: str, count: int, toy_data: Path) -> list[dict[str, str]]:
    sources, targets = lines(split, "en", count, toy_data), lines(split, "de", count, toy_data)
    return [{"source": s, "target": t} for s, t in zip(sources, targets, strict=True)]


@pytest.mark.slow
def test_fine_tuning_an_import_keeps_its_tokenizer_and_the_loss_falls(
    marian_case: Callable[[str], MarianCase], toy_data: Path, tmp_path: Path
) -> None:
    imported = import_model(marian_case("swish-shared-tied").folder, tmp_path / "opus")
    data = tmp_path / "mine"
    write_jsonl(data / "train.jsonl", pairs("train", 400, toy_data))
    write_jsonl(data / "validation.jsonl", pairs("val", 20, toy_data))
    out = tmp_path / "tuned"
    result = CliRunner().invoke(app, [
        "train", "--init-from", str(imported), "--data", str(data), "--out", str(out),
        "--max-steps", str(STEPS), "--eval-every", str(STEPS), "--save-every", str(STEPS),
        "--log-every", "5", "--max-tokens", "1024", "--lr", "1e-3", "--warmup-steps", "5",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    announced = next(x for x in result.output.splitlines() if x.startswith("an imported model"))
    assert "--schedule constant" in announced
    # Only the defaults taken: not the two flags given, nor the cap of the warm-up given.
    for given in ("--lr", "--warmup-steps", "--warmup-share"):
        assert given not in announced, announced
    tuned = load_checkpoint(out)
    start = load_checkpoint(imported)
    train = tuned.train_config
    # The imported-model defaults, but for the two flags given.
    assert (train.lr, train.warmup_steps) == (1e-3, 5)
    for key in ("schedule", "val_bleu", "best_metric", "patience"):
        assert getattr(train, key) == IMPORTED_DEFAULTS[key], key
    # Its own two tokenizers (one joint vocabulary) and shared embeddings, kept.
    assert not tuned.tokenizers.shared and tuned.model_config.share_embeddings
    for side in ("source", "target"):
        assert getattr(tuned.tokenizers, side).sha256() == getattr(start.tokenizers, side).sha256()
    assert tuned.model_config == start.model_config
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]  # the training loss, every 5 steps
    assert len(losses) == STEPS // 5 and losses[-1] < 0.9 * losses[0], losses
    assert any("val_bleu" in r or "bleu" in r for r in records)  # validation BLEU by default


BUDGET = 12.0
# The two saves after the last step (best/ and the step checkpoint) of a tiny model, with room
# for a loaded machine: the budget's 5% is for everything else.
SAVES = 2.0


class Clock(Reporter):
    """When training started and finished, and the messages of the run."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.started = self.finished = 0.0

    def start(self, summary: dict[str, object]) -> None:
        self.started = time.perf_counter()

    def message(self, text: str) -> None:
        self.messages.append(text)

    def finish(self, result: TrainResult) -> None:
        self.finished = time.perf_counter()


@pytest.mark.slow
def test_a_time_budget_holds_with_the_imported_defaults(
    marian_case: Callable[[str], MarianCase], toy_data: Path, tmp_path: Path
) -> None:
    """The imported-model defaults (validation BLEU at every evaluation, the final
    translation of the split) under --time-budget: the run ends within 5% of its budget but
    for the final saves, the validation split is translated once, at the end, and the
    warm-up is cut to a tenth of the steps the budget holds, fixed once."""
    imported = import_model(marian_case("swish-shared-tied").folder, tmp_path / "opus")
    data = tmp_path / "mine"
    write_jsonl(data / "train.jsonl", pairs("train", 2000, toy_data))
    write_jsonl(data / "validation.jsonl", pairs("val", 300, toy_data))
    clock = Clock()
    values = {"data": str(data), "time_budget": BUDGET, "lr": 1e-3, "max_tokens": 512,
              "log_every": 2}  # fmt: skip
    result = train(
        settings=Settings(values=values), init_from=imported, out=tmp_path / "tuned",
        reporter=clock,
    )  # fmt: skip
    took = clock.finished - clock.started
    assert 0.9 * BUDGET <= took <= 1.05 * BUDGET + SAVES, took
    announced = next(m for m in clock.messages if m.startswith("an imported model"))
    assert "--warmup-steps 200" in announced and "--warmup-share 0.1" in announced
    assert "--lr" not in announced  # given, so not a default
    metrics = (tmp_path / "tuned" / "metrics.jsonl").read_text()
    records = [json.loads(line) for line in metrics.splitlines()]
    # The last evaluation's BLEU comes from the one translation of the split (a fast machine
    # also passes the 500-step evaluation, which translates only the --val-bleu pairs).
    assert [r["step"] for r in records if "val_bleu" in r][-1] == result.step
    assert sum(m.startswith("translating the validation split") for m in clock.messages) == 1
    assert result.final_pairs is not None and result.final_pairs[0] >= 1
    # Cut once, from the pace of the first steps, to a tenth of the steps the budget holds:
    # far under the 200 default steps, so the learning rate peaks early in the run.
    cuts = [m for m in clock.messages if m.startswith("warm-up ")]
    assert len(cuts) == 1 and "cut to --warmup-share 0.1" in cuts[0], clock.messages
    warmup = int(cuts[0].split()[1])
    assert not any(m.startswith("warning: --warmup-steps") for m in clock.messages)
    assert 1 <= warmup <= result.step // 2, (cuts, result.step)
    peaked = [r["step"] for r in records if r.get("lr") == 1e-3]
    # The pace is timed over the steps after the first: the cut applies from step 5 on.
    assert peaked and peaked[0] <= max(warmup, 5) + 1, (peaked, warmup)
