"""What a newcomer meets in a first short run: a warm-up longer than the run is named, the
final validation fits the task (BLEU / chrF; exact match for short targets) and can be skipped,
the progress line has an ETA and a clock that goes on after --resume, and commands say which
checkpoint of a run folder they use (--checkpoint latest|best)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tformer import checkpoint as ckpt
from tformer.cli.commands import app
from tformer.cli.progress import loss_labels

runner = CliRunner()
SMALL = ["--preset", "tiny", "--vocab-size", "64", "--max-tokens", "256", "--log-every", "1",
         "--eval-every", "1", "--seed", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def short_run(toy_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """Two steps with the default warm-up (4,000 steps): (run folder, stdout, stderr)."""
    out = tmp_path_factory.mktemp("first-hour") / "run"
    result = runner.invoke(
        app, ["train", "--data", str(toy_data), "--out", str(out), "--max-steps", "2", *SMALL]
    )
    assert result.exit_code == 0, result.output
    return out, result.stdout, result.stderr


def test_a_warm_up_longer_than_the_run_is_warned_once(short_run: tuple[Path, str, str]) -> None:
    _, _, err = short_run
    warnings = [line for line in err.splitlines() if "--warmup-steps" in line]
    assert len(warnings) == 1 and "--warmup-steps 4,000" in warnings[0]
    assert "(2 steps)" in warnings[0] and "never reaches its peak" in warnings[0]


def test_the_final_validation_reports_bleu_and_exact_match_for_short_targets(
    short_run: tuple[Path, str, str],
) -> None:
    run, out, _ = short_run
    assert re.search(r"validation BLEU \d+\.\d chrF \d+\.\d", out)
    assert "exact match on validation" in out  # digit words: a few words a target
    final = [r for r in ckpt.read_metrics(run) if "validation_final_bleu" in r]
    assert len(final) == 1 and final[0]["validation_final_pairs"] == 100
    assert "validation_exact_match" in final[0]


def test_progress_lines_show_an_eta_and_resume_keeps_the_clock(
    short_run: tuple[Path, str, str],
) -> None:
    run, _, err = short_run
    lines = [line for line in err.splitlines() if re.match(r"step +\d+ +loss", line)]
    assert lines and all(re.search(r"\d+:\d\d +eta \d+:\d\d", line) for line in lines)
    before = [r["elapsed"] for r in ckpt.read_metrics(run) if "loss" in r][-1]
    result = runner.invoke(app, ["train", "--resume", str(run), "--max-steps", "3",
                                 "--final-eval", "none"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "translating the validation split" not in result.stderr
    assert "validation BLEU" not in result.stdout and "exact match" not in result.stdout
    after = [r for r in ckpt.read_metrics(run) if "loss" in r][-1]
    assert after["step"] == 3 and after["elapsed"] > before  # the budget is cumulative


def test_progress_lines_say_which_loss_is_label_smoothed(
    short_run: tuple[Path, str, str],
) -> None:
    """The training loss is label-smoothed (--label-smoothing 0.1 by default), the
    validation loss is not: each line names its loss as such."""
    _, _, err = short_run
    train = [line for line in err.splitlines() if re.match(r"step +\d+ +loss", line)]
    assert train and all("loss (label-smoothed 0.1) " in line for line in train), train
    val = [line for line in err.splitlines() if re.match(r"step +\d+ +val loss", line)]
    assert val and all("val loss (unsmoothed) " in line for line in val), val


def test_without_label_smoothing_the_losses_are_plain() -> None:
    assert loss_labels(0.0) == ("loss", "val loss")
    assert loss_labels(0.2) == ("loss (label-smoothed 0.2)", "val loss (unsmoothed)")


def test_commands_name_the_checkpoint_they_use(short_run: tuple[Path, str, str]) -> None:
    run = short_run[0]
    latest, best = ckpt.resolve(run), ckpt.resolve(run / ckpt.BEST)
    named = runner.invoke(app, ["generate", str(run), "3 1", "--max-new-tokens", "2",
                                "--checkpoint", "latest"])  # fmt: skip
    assert named.exit_code == 0, named.output
    assert named.stderr.splitlines()[0].startswith(f"using {latest} (latest; best/ ")
    chosen = runner.invoke(
        app, ["generate", str(run), "3 1", "--max-new-tokens", "2", "--checkpoint", "best"]
    )
    assert chosen.exit_code == 0, chosen.output
    assert f"using {best} (best)" in chosen.stderr.splitlines()
    plain = runner.invoke(app, ["generate", str(run), "3 1", "--max-new-tokens", "2"])
    assert plain.exit_code == 0, plain.output
    if ckpt.step_of(best) == ckpt.step_of(latest):
        assert "using" not in plain.stderr  # one checkpoint to choose from: nothing to say
    else:
        line = f"using {latest} (latest; best/ holds step {ckpt.step_of(best)}: --checkpoint best)"
        assert line in plain.stderr.splitlines()
    bad = runner.invoke(app, ["evaluate", str(run), "--checkpoint", "worst"])
    assert bad.exit_code != 0 and "--checkpoint 'worst' must be one of latest, best" in bad.stderr
    given = runner.invoke(app, ["generate", str(best), "3 1", "--max-new-tokens", "2"])
    assert given.exit_code == 0 and "using" not in given.stderr  # a checkpoint folder: as given


def test_best_is_the_latest_where_a_run_has_no_best(tmp_path: Path,
                                                     short_run: tuple[Path, str, str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(short_run[0], run, ignore=shutil.ignore_patterns(ckpt.BEST))
    result = runner.invoke(app, ["generate", str(run), "3 1", "--max-new-tokens", "2",
                                 "--checkpoint", "best"])  # fmt: skip
    assert result.exit_code == 0, result.output
    line = f"using {ckpt.resolve(run)} (latest; the run has no best/)"
    assert line in result.stderr.splitlines()
