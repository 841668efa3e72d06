"""Checkpoints written before the architecture options existed still load and decode the same.

Such a checkpoint's config.json (and the model record in its weights' header) has no
``positions``, ``kv_heads`` or ``normalization`` key: the test removes them from a freshly
saved checkpoint, rewrites the manifest as the old tformer wrote it, and holds the result to
the original.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from tests.checkpoint.test_checkpoint import _resumable
from tformer.checkpoint import CONFIG, WEIGHTS, load_checkpoint
from tformer.checkpoint.files import write_manifest
from tformer.cli.commands import app
from tformer.config import ADDED_MODEL_KEYS, BOS_ID
from tformer.decoding.api import decode
from tformer.decoding.settings import DecodingConfig


def strip_new_keys(folder: Path) -> None:
    config = json.loads((folder / CONFIG).read_text())
    for key in ADDED_MODEL_KEYS:
        del config["model"][key]
    (folder / CONFIG).write_text(json.dumps(config, indent=2))
    with safe_open(str(folder / WEIGHTS), framework="pt") as handle:
        metadata = dict(handle.metadata())
    record = json.loads(metadata["model"])
    for key in ADDED_MODEL_KEYS:
        del record[key]
    metadata["model"] = json.dumps(record, sort_keys=True)
    save_file(load_file(str(folder / WEIGHTS)), str(folder / WEIGHTS), metadata=metadata)
    write_manifest(folder)


def test_a_checkpoint_without_the_new_keys_loads_and_decodes_identically(
    tmp_path: Path,
) -> None:
    folder = _resumable(tmp_path)
    before = load_checkpoint(folder)
    src = torch.tensor([[4, 5, 6], [7, 8, 0]])
    tgt = torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 9, 10]])
    want_logits = before.model.eval()(src, tgt).logits
    want = decode(before.model, src, DecodingConfig(max_new_tokens=6))

    strip_new_keys(folder)
    assert "positions" not in json.loads((folder / CONFIG).read_text())["model"]
    after = load_checkpoint(folder)
    assert after.model_config == before.model_config  # the defaults: the paper's model
    a, b = after.model.state_dict(), before.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(after.model.eval()(src, tgt).logits, want_logits)
    got = decode(after.model, src, DecodingConfig(max_new_tokens=6))
    assert [[h.ids for h in row] for row in got] == [[h.ids for h in row] for row in want]
    result = CliRunner().invoke(app, ["verify", str(folder)])
    assert result.exit_code == 0, result.output
