"""`--help`: options grouped in panels, switches shown as switches, help text kept literal."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from tformer.cli.commands import app
from tformer.cli.train import PANELS

runner = CliRunner()


def help_of(monkeypatch: pytest.MonkeyPatch, *command: str) -> str:
    monkeypatch.setenv("COLUMNS", "200")  # one line per option: no word split over lines
    result = runner.invoke(app, [*command, "--help"], prog_name="tformer")
    assert result.exit_code == 0, result.output
    return result.stdout


def test_train_help_groups_the_options_in_panels(monkeypatch: pytest.MonkeyPatch) -> None:
    text = help_of(monkeypatch, "train")
    titles = re.findall(r"╭─ (.+?) ─", text)
    assert titles == ["Options", *PANELS]  # in the order of the table
    options = re.search(r"╭─ Options ─.*?╰", text, re.S)
    assert options is not None and "--help" in options.group() and "--lr" not in options.group()
    lm = re.search(r"╭─ Language models only ─.*?╰", text, re.S)
    assert lm is not None and "--mlm-probability" in lm.group() and "--pack" in lm.group()


def test_switches_show_no_value_and_brackets_stay(monkeypatch: pytest.MonkeyPatch) -> None:
    text = help_of(monkeypatch, "train")
    assert re.search(r"--overwrite\s+Replace the tformer run", text)
    assert 'pip install "tformer[tensorboard]"' in text  # not read as a Rich markup tag
    assert "4m30s" in text  # --time-budget takes compound durations


COMMANDS = sorted(str(command.name) for command in app.registered_commands)


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_no_help_shows_bool(monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    text = help_of(monkeypatch, *([command] if command else []))
    assert "<bool>" not in text
