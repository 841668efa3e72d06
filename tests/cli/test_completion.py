"""Shell completion: `tformer --show-completion` prints a script, and the script's hook completes
commands and options."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tformer.cli.commands import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.mark.parametrize(
    ("shell", "piece"),
    [
        ("bash", "complete -o default -F _tformer_completion tformer"),
        ("zsh", "#compdef tformer"),
        ("fish", "complete --command tformer"),
    ],
)
def test_show_completion_prints_a_script_for_tformer(
    shell: str, piece: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Typer detects the running shell; this makes --show-completion take it as a value.
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    result = runner.invoke(app, ["--show-completion", shell], prog_name="tformer")
    assert result.exit_code == 0, result.output
    assert piece in result.stdout and "_TFORMER_COMPLETE" in result.stdout


def test_help_lists_the_completion_options() -> None:
    result = runner.invoke(app, ["--help"], prog_name="tformer")
    assert "--install-completion" in result.stdout and "--show-completion" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("words", "cword", "want"),
    [("tformer tr", "1", {"train", "train-tokenizer"}), ("tformer train --init", "2",
     {"--init-from"})],  # fmt: skip
)
def test_the_completion_hook_completes(words: str, cword: str, want: set[str]) -> None:
    """What the installed script asks the program: the words typed so far, in the env."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "_TFORMER_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": cword,
    }
    done = subprocess.run(
        [sys.executable, "-m", "tformer"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == want
