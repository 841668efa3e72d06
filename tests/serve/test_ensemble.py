"""``tformer serve`` over an ensemble: real HTTP requests answered as the library decodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_ensemble_cli import INPUTS, write_member
from tests.serve.conftest import free_port, serving
from tformer.checkpoint.store import load_checkpoint
from tformer.data.tokenizer import train_tokenizer
from tformer.decoding.ensemble import ensemble_of
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.text import translate

pytest.importorskip("fastapi")


def test_a_served_ensemble_answers_as_the_library_decodes(tmp_path: Path) -> None:
    from tformer.serve.settings import ServeSettings

    tokenizer = train_tokenizer(["3 1 4 one two three", "9 2 7 nine seven"] * 20, vocab_size=40)
    paths = [write_member(tmp_path / name, tokenizer, seed) for name, seed in (("a", 0), ("b", 1))]
    loaded = [load_checkpoint(p) for p in paths]
    model = ensemble_of(loaded)
    config = DecodingConfig(beam_size=2, max_new_tokens=6)
    want = translate(model, loaded[0].tokenizers, INPUTS, config)
    members = [str(p) for p in paths]
    settings = ServeSettings(port=free_port())
    with serving(loaded[0], settings, model=model, members=members) as running:
        client = running.client
        reply = client.post("/v1/translate", {"inputs": INPUTS, "beam_size": 2,
                                              "max_new_tokens": 6})  # fmt: skip
        assert reply.status == 200, reply.text
        got = [r["outputs"][0] for r in reply.json()["results"]]
        assert [g["ids"] for g in got] == [w[0].hypothesis.ids for w in want]
        for g, w in zip(got, want, strict=True):
            assert g["score"] == pytest.approx(w[0].hypothesis.score, abs=1e-4)
        assert client.get("/v1/model").json()["ensemble"] == members
        explained = client.post("/v1/explain", {"source": INPUTS[0]})
        assert explained.status == 422, explained.text
        assert "ensemble" in explained.json()["error"]
