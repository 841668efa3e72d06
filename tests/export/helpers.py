"""What the export tests share: running an exported folder's README snippet, tformer's own
outputs to hold the exports to."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tformer.checkpoint import load_checkpoint
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.text import Generation, translate


def readme_snippet(folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run the Python block of ``folder``'s README.md as a user would, from inside
    ``folder``, and return the names it defined (its model, tokenizers, functions)."""
    text = (folder / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1, text
    monkeypatch.chdir(folder)
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(compile(blocks[0], str(folder / "README.md"), "exec"), namespace)  # noqa: S102
    return namespace


def tformer_generations(
    checkpoint: Path, texts: list[str], config: DecodingConfig
) -> list[Generation]:
    """tformer's best output for each of ``texts``."""
    ckpt = load_checkpoint(checkpoint)
    return [g[0] for g in translate(ckpt.model, ckpt.tokenizers, texts, config)]


def tformer_outputs(
    checkpoint: Path, texts: list[str], config: DecodingConfig
) -> tuple[list[list[int]], list[str]]:
    """tformer's best output ids and texts for ``texts``."""
    generations = tformer_generations(checkpoint, texts, config)
    return [g.hypothesis.ids for g in generations], [g.text for g in generations]
