"""``tformer serve`` over an ensemble, or over a lexical shortlist: real HTTP requests answered
as the library decodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.cli.test_ensemble_cli import INPUTS, write_member
from tests.serve.conftest import free_port, serving
from tformer.checkpoint.store import load_checkpoint
from tformer.data.tokenizer import train_tokenizer
from tformer.decoding.ensemble import ensemble_of
from tformer.decoding.settings import DecodingConfig
from tformer.decoding.shortlist import build_shortlist
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


def test_a_served_shortlist_answers_and_streams_as_the_library_decodes(tmp_path: Path) -> None:
    """One model over a lexical shortlist: the tokens of a request, whole and streamed, are
    the library's; one model's views (/v1/explain) stay open."""
    from tformer.serve.settings import ServeSettings

    texts = ["3 1 4 one two three", "9 2 7 nine seven"] * 20
    tokenizer = train_tokenizer(texts, vocab_size=40)
    loaded = load_checkpoint(write_member(tmp_path / "a", tokenizer, 0))
    pairs = [(tokenizer.encode(t[:5]), tokenizer.encode(t[6:])) for t in texts]
    shortlist = build_shortlist(pairs, tokenizer, tokenizer, per_word=2, frequent=1)
    shortlist.save(tmp_path / "digits.shortlist")
    model = ensemble_of([loaded], shortlist=(shortlist, "digits.shortlist"))
    want = translate(model, loaded.tokenizers, INPUTS, DecodingConfig(max_new_tokens=6))
    with serving(loaded, ServeSettings(port=free_port()), model=model) as running:
        client = running.client
        reply = client.post("/v1/translate", {"inputs": INPUTS, "max_new_tokens": 6})
        assert reply.status == 200, reply.text
        got = [r["outputs"][0]["ids"] for r in reply.json()["results"]]
        assert got == [w[0].hypothesis.ids for w in want]
        streamed = client.post("/v1/translate", {"inputs": INPUTS[0], "max_new_tokens": 6,
                                                 "stream": True})  # fmt: skip
        ids = [json.loads(line[6:])["id"] for line in streamed.text.splitlines()
               if line.startswith("data: ") and '"id"' in line]  # fmt: skip
        assert ids == got[0] and got[0]  # a real output, token by token
        info = client.get("/v1/model").json()
        assert info["shortlist"] is True and "ensemble" not in info
        assert client.post("/v1/explain", {"source": INPUTS[0]}).status == 200
    allowed = set(shortlist.candidates(torch.tensor([tokenizer.encode(INPUTS[0])])).tolist())
    assert set(got[0]) <= allowed
