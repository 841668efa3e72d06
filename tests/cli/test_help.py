"""`--help`: options grouped in panels, switches shown as switches, help text kept literal."""

from __future__ import annotations

import re
from typing import Any

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


def _adjacent_lines(text: str) -> list[tuple[str, str]]:
    """Pairs of prose lines that follow each other in one paragraph of a help page's own text
    (above its first panel; indented examples left out)."""
    lines = text.split("╭─", 1)[0].splitlines()[2:]  # after Usage
    indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    prose = [x.strip() if len(x) - len(x.lstrip()) == indent else "" for x in lines]
    return [(a, b) for a, b in zip(prose, prose[1:], strict=False) if a and b]


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_every_help_page_is_literal_unbroken_and_complete(
    monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """Rendered as a user sees it, on a terminal too wide to wrap anything: no `[...]` of the
    source text eaten as markup, no line break inside a sentence, no option without help."""
    import typer

    monkeypatch.setenv("COLUMNS", "2000")
    result = runner.invoke(app, [*([command] if command else []), "--help"], prog_name="tformer")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    group: Any = typer.main.get_command(app)
    cmd = group.commands[command] if command else group
    sources = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
    for source in sources:
        for bracketed in re.findall(r"\[[a-z][\w,-]*\]", source.replace("\\[", "[")):
            assert bracketed in text, f"{bracketed} of the help text is not shown"
    for line, after in _adjacent_lines(result.stdout):
        assert not (after[:1].islower() and not line.endswith((".", ":", ";", ")"))), (
            f"a line break inside a sentence: {line!r} / {after!r}"
        )
    for param in cmd.params:
        if param.param_type_name == "option" and not param.hidden:
            assert (param.help or "").strip(), f"{param.opts} has no help"


def test_decoding_flags_keep_their_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decoding flags, given to each command from one list, sit where the command puts
    them in --help (after its inputs), in the config's field order."""
    flags = re.findall(r"│ (--[\w-]+)", help_of(monkeypatch, "generate"))
    start = flags.index("--input-file")
    assert flags[start : start + 15] == [
        "--input-file", "--temperature", "--top-k", "--top-p", "--min-p",
        "--repetition-penalty", "--no-repeat-ngram-size", "--beam-size", "--length-penalty",
        "--n-best", "--min-new-tokens", "--max-new-tokens", "--num-samples", "--seed",
        "--batch-size",
    ]  # fmt: skip
