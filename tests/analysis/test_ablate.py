"""Head ablation on the briefly trained `dates` model: rankings, pruning, and the CLI.

Every number `ablate` reports is recomputed here through another path: `evaluate`'s
teacher-forced loss with the heads masked by name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tformer.analysis.ablate import ablate_pairs as ablate
from tformer.analysis.evaluate import teacher_forced_loss
from tformer.checkpoint.store import Checkpoint
from tformer.cli.commands import app
from tformer.data.sources import load_text_pairs
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.text import translate
from tformer.metrics import corpus_scores
from tformer.model.heads import all_heads, heads_masked, mask_heads, masked, parse_heads
from tformer.training.run import TrainResult

pytestmark = pytest.mark.slow  # the fast tier (-m "not slow") leaves this file out

runner = CliRunner()


@pytest.fixture(scope="module")
def dates_data(date_model: Checkpoint) -> str:
    assert date_model.train_config.data is not None
    return date_model.train_config.data


@pytest.fixture(scope="module")
def held_out(date_model: Checkpoint) -> list[tuple[str, str]]:
    return load_text_pairs(date_model.train_config.data)["validation"][:60]


def test_ranking_is_every_head_by_its_recomputed_loss_increase(
    date_model: Checkpoint, held_out: list[tuple[str, str]]
) -> None:
    model = date_model.model
    first = ablate(model, date_model.tokenizers, held_out)
    second = ablate(model, date_model.tokenizers, held_out)
    assert [e.head for e in first.effects] == [e.head for e in second.effects]
    assert [e.importance for e in first.effects] == [e.importance for e in second.effects]
    assert sorted(e.head for e in first.effects) == sorted(str(h) for h in all_heads(model))
    importances = [e.importance for e in first.effects]
    assert importances == sorted(importances, reverse=True)

    baseline, _ = teacher_forced_loss(date_model, held_out)
    assert first.baseline.loss == pytest.approx(baseline, abs=1e-6)
    for effect in (first.effects[0], first.effects[-1]):
        with heads_masked(model, parse_heads(effect.head, model)):
            loss, _ = teacher_forced_loss(date_model, held_out)
        assert effect.quality.loss == pytest.approx(loss, abs=1e-6)
        assert effect.importance == pytest.approx(loss - baseline, abs=1e-5)
    # A trained model has heads that matter: the most important one costs real loss.
    assert first.effects[0].importance > 0.05
    grid = first.grid("cross")
    top = first.effects[0]
    assert first.grid(top.part)[top.layer][top.index] == top.importance
    assert len(grid) == 2 and len(grid[0]) == 4


def test_pruning_removes_the_least_important_heads_until_none_is_left(
    date_model: Checkpoint, held_out: list[tuple[str, str]]
) -> None:
    model = date_model.model
    mask_heads(model, parse_heads("enc.0.0", model))  # a mask set before is given back
    try:
        result = ablate(model, date_model.tokenizers, held_out[:30], prune_step=0.25)
        assert [str(h) for h in masked(model)] == ["enc.0.0"]
    finally:
        mask_heads(model, [])
    curve = result.prune_curve
    assert [p.removed for p in curve] == [0, 6, 12, 18, 24]
    assert curve[0].quality == result.baseline and curve[0].pruned == []
    # The first step removes the six heads the ranking puts last.
    assert set(curve[1].pruned) == {e.head for e in result.effects[-6:]}
    for before, after in zip(curve, curve[1:], strict=False):
        assert after.pruned[: before.removed] == before.pruned  # nested
    for point in (curve[2], curve[-1]):
        with heads_masked(model, [h for h in all_heads(model) if str(h) in point.pruned]):
            loss, _ = teacher_forced_loss(date_model, held_out[:30])
        assert point.quality.loss == pytest.approx(loss, abs=1e-6)
    assert curve[-1].share == 1.0 and curve[-1].quality.loss > curve[0].quality.loss + 1.0


def test_bleu_metric_ranks_by_the_drop_in_bleu(
    date_model: Checkpoint, held_out: list[tuple[str, str]]
) -> None:
    pairs = held_out[:12]
    result = ablate(date_model.model, date_model.tokenizers, pairs, metric="bleu",
                    decoding=DecodingConfig(max_new_tokens=16))
    outputs = translate(date_model.model, date_model.tokenizers, [s for s, _ in pairs],
                        DecodingConfig(max_new_tokens=16))
    want = corpus_scores([g[0].text for g in outputs], [t for _, t in pairs])
    assert (result.baseline.bleu, result.baseline.chrf) == (want.bleu, want.chrf)
    for effect in result.effects:
        assert effect.quality.bleu is not None
        assert effect.importance == pytest.approx(want.bleu - effect.quality.bleu, abs=1e-6)
    drops = [e.importance for e in result.effects]
    assert drops == sorted(drops, reverse=True) and drops[0] > 0


def test_cli_prints_the_ranking_heatmap_and_curve_and_saves_json_and_png(
    date_run: TrainResult, dates_data: str, tmp_path: Path
) -> None:
    run = str(date_run.run_dir)
    common = [run, "--data", dates_data, "--limit", "24"]
    saved = tmp_path / "heads.json"
    result = runner.invoke(app, ["ablate", *common, "--prune-curve", "--prune-step", "0.5",
                                 "--save", str(saved), "--top", "5"])
    assert result.exit_code == 0, result.output
    for text in ("24 heads by importance", "cross-attention", "greedy pruning", "19 more heads"):
        assert text in result.output
    record = json.loads(saved.read_text(encoding="utf-8"))
    assert record["split"] == "validation" and record["pairs"] == 24
    assert len(record["heads"]) == 24 and len(record["grid"]["enc"]) == 2
    assert [p["removed"] for p in record["prune_curve"]] == [0, 12, 24]

    png = tmp_path / "heads.png"
    result = runner.invoke(app, ["ablate", *common, "--json", "--save", str(png)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["heads"][0]["head"] == record["heads"][0]["head"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--metric", "rouge"], 2, "--metric 'rouge' must be one of loss, bleu"),
        (["--prune-step", "0"], 2, "--prune-step 0.0 must be in (0, 1]"),
        (["--save", "heads.txt"], 2, "unsupported file type"),
        (["--split", "dev"], 3, "--split dev: not in the data"),
        (["--limit", "0"], 2, "--limit 0 must be >= 1"),
    ],
)
def test_cli_refuses_bad_options_in_one_line(
    date_run: TrainResult, dates_data: str, args: list[str], code: int, message: str
) -> None:
    result = runner.invoke(app, ["ablate", str(date_run.run_dir), "--data",
                                 dates_data, *args])
    assert result.exit_code == code, result.output
    assert message in result.output and "Traceback" not in result.output


def test_mask_heads_on_generate_evaluate_and_inspect_attention(
    date_run: TrainResult, dates_data: str, tmp_path: Path
) -> None:
    run = str(date_run.run_dir)
    every_cross = "cross.0.*,cross.1.*"
    sources = ["6 March 2025", "the first of May 1999"]
    plain = runner.invoke(app, ["generate", run, *sources])
    cut = runner.invoke(app, ["generate", run, *sources, "--mask-heads", every_cross])
    assert plain.exit_code == 0 and cut.exit_code == 0, cut.output
    assert plain.stdout.splitlines() == ["2025-03-06", "1999-05-01"]
    # Without cross-attention the decoder cannot see the source: one output for both.
    lines = cut.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]
    assert "masked 8 head(s): cross.0.0" in cut.stderr

    out = tmp_path / "eval"
    result = runner.invoke(app, ["evaluate", run, "--data", dates_data,
                                 "--limit", "8", "--mask-heads", "enc.0.1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    card = json.loads((out / "result.json").read_text(encoding="utf-8"))
    assert card["decoding"]["mask_heads"] == ["enc.0.1"]

    result = runner.invoke(app, ["inspect-attention", run, "6 March 2025", "--mask-heads",
                                 "dec.1.0"])
    assert result.exit_code == 0, result.output

    for command in (["generate", run, "x"], ["inspect-attention", run, "x"],
                    ["evaluate", run, "--data", dates_data]):
        result = runner.invoke(app, [*command, "--mask-heads", "cross.2.0"])
        assert result.exit_code == 2, result.output
        assert "--mask-heads 'cross.2.0': layer 2 is out of range" in result.output


def test_mask_heads_on_score_scores_the_masked_model(
    date_run: TrainResult, date_model: Checkpoint
) -> None:
    from tformer.analysis.score import score_pair

    pair = ("6 March 2025", "2025-03-06")
    result = runner.invoke(app, ["score", str(date_run.run_dir), *pair, "--json",
                                 "--mask-heads", "dec.0.*"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    model = date_model.model
    with heads_masked(model, parse_heads("dec.0.*", model)):
        want = score_pair(model, date_model.tokenizers, *pair)
    plain = score_pair(model, date_model.tokenizers, *pair)
    assert record["loss_sum"] == pytest.approx(want.loss_sum, rel=1e-6)
    assert want.loss_sum > plain.loss_sum + 0.1
