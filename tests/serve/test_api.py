"""Every endpoint over HTTP, its answers checked against the library's own results."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from tformer.analysis.attention import inspect_attention  # noqa: E402
from tformer.checkpoint.store import Checkpoint, load_checkpoint  # noqa: E402
from tformer.decoding.settings import DecodingConfig  # noqa: E402
from tformer.decoding.text import translate  # noqa: E402
from tformer.training.run import TrainResult  # noqa: E402

from .conftest import Client, Running, same_outputs  # noqa: E402


@pytest.fixture(scope="module")
def reference(trained: TrainResult) -> Checkpoint:
    """The same checkpoint loaded apart from the server's (the server's model is its own)."""
    return load_checkpoint(trained.run_dir)


def test_health_and_model(client: Client, served: Running) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    model = client.get("/v1/model").json()
    loaded = served.loaded
    assert model["config"] == loaded.model_config.to_dict()
    assert model["parameters"] == loaded.model.parameter_counts()
    assert model["step"] == loaded.step
    assert model["tokenizer"]["source"]["sha256"] == loaded.tokenizers.source.sha256()
    assert len(model["manifest_sha256"]) == 64


def test_openapi_describes_every_endpoint(client: Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/health", "/v1/model", "/v1/translate", "/v1/attention", "/v1/explain"} <= set(paths)


@pytest.mark.parametrize(
    "settings",
    [{}, {"beam_size": 3, "n_best": 2, "length_penalty": 0.5}, {"temperature": 0.9, "seed": 7}],
    ids=["greedy", "beam", "seeded-sampling"],
)
def test_translate_equals_the_library(
    client: Client, reference: Checkpoint, settings: dict
) -> None:
    texts = ["3 1 4", "1 5 9 2 6", "7"]
    reply = client.post("/v1/translate", {"inputs": texts, "max_new_tokens": 30, **settings})
    assert reply.status == 200, reply.text
    answer = reply.json()
    config = DecodingConfig(max_new_tokens=30, **settings)
    want = translate(reference.model, reference.tokenizers, texts, config)
    assert [r["input"] for r in answer["results"]] == texts
    for result, outputs in zip(answer["results"], want, strict=True):
        assert [o["output"] for o in result["outputs"]] == [g.text for g in outputs]
        for got, gen in zip(result["outputs"], outputs, strict=True):
            assert got["ids"] == gen.hypothesis.ids
            assert got["token_logprobs"] == pytest.approx(gen.hypothesis.token_logprobs, abs=1e-4)
            assert got["score"] == pytest.approx(gen.hypothesis.score, abs=1e-4)
            assert len(got["tokens"]) == len(got["ids"])
    assert answer["settings"]["max_new_tokens"] == 30
    # The model learnt the task: the served output is the right one.
    assert answer["results"][0]["outputs"][0]["output"] == "three one four" or settings


def test_one_input_as_a_string(client: Client, reference: Checkpoint) -> None:
    answer = client.post("/v1/translate", {"inputs": "2 2"}).json()
    assert answer["results"][0]["input"] == "2 2"
    # The library's answer (the tiny model's learning of a repeated digit is not under test).
    (want,) = translate(reference.model, reference.tokenizers, ["2 2"],
                        DecodingConfig(max_new_tokens=40))  # fmt: skip
    assert answer["results"][0]["outputs"][0]["output"] == want[0].text
    assert set(want[0].text.split()) <= {"two"}
    assert answer["settings"]["max_new_tokens"] == 40  # the server's cap, below the library's


def test_unseeded_sampling_reports_the_seed_it_used(client: Client) -> None:
    body = {"inputs": ["4 4 4"], "temperature": 1.5, "num_samples": 3}
    first = client.post("/v1/translate", body).json()
    seed = first["settings"]["seed"]
    assert isinstance(seed, int)
    again = client.post("/v1/translate", {**body, "seed": seed}).json()
    (got,), (want,) = again["results"], first["results"]
    assert len(got["outputs"]) == 3
    same_outputs(got["outputs"], want["outputs"])


def events(text: str) -> list[tuple[str, dict]]:
    found = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        found.append((lines["event"], json.loads(lines["data"])))
    return found


@pytest.mark.parametrize(
    "settings", [{}, {"temperature": 1.0, "seed": 3, "num_samples": 2}], ids=["greedy", "sampled"]
)
def test_stream_sends_the_same_tokens(client: Client, settings: dict) -> None:
    body = {"inputs": "8 6 7 5", **settings}
    whole = client.post("/v1/translate", body).json()["results"][0]["outputs"]
    reply = client.post("/v1/translate", {**body, "stream": True})
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    found = events(reply.text)
    assert found[-1][0] == "done"
    same_outputs(found[-1][1]["outputs"], whole)
    for sample, output in enumerate(whole):
        tokens = [d for name, d in found if name == "token" and d["sample"] == sample]
        assert [d["id"] for d in tokens] == output["ids"]
        assert tokens[-1]["text"] == output["output"]


def test_attention_equals_inspect_attention(client: Client, reference: Checkpoint) -> None:
    body = {"source": "3 1 4", "kind": "cross", "layer": -1, "head": "all"}
    answer = client.post("/v1/attention", body).json()
    result = inspect_attention(reference, "3 1 4")
    selection = result.selection("cross", -1, "all")
    assert answer["target"] == result.target_text == "three one four"
    assert answer["rows"] == selection.rows and answer["columns"] == selection.columns
    assert answer["dims"] == ["head", "row", "column"] and answer["layer"] == 0
    got = torch.tensor(answer["weights"])
    torch.testing.assert_close(got, selection.weights, atol=1e-5, rtol=0)
    forced = client.post(
        "/v1/attention", {"source": "3 1", "target": "nine", "kind": "decoder", "head": 1}
    ).json()
    # Rows are labelled by what they predict, columns by what they read.
    assert forced["target_generated"] is False and forced["columns"][0] == "<bos>"
    assert len(forced["rows"]) == 2 and forced["rows"][0].endswith("nine")
    assert forced["rows"][1] == "<eos>" and forced["columns"][1] == forced["rows"][0]
    assert len(forced["weights"]) == 2


def test_explain_gives_a_step_per_token(client: Client, reference: Checkpoint) -> None:
    answer = client.post("/v1/explain", {"source": "5 0", "temperature": 0.7, "top_k": 3}).json()
    assert answer["stages"][0] == "model" and "top-k" in " ".join(answer["stages"])
    steps = answer["steps"]
    assert steps[-1]["token"] == "<eos>"
    for step in steps:
        assert set(step["probs"]) == set(answer["stages"])
        assert 0 < step["probs"]["model"] <= 1
        assert step["source"] and step["alternatives"]
    # Greedy: the explained output is the translated one, with the same log-probability.
    greedy = client.post("/v1/explain", {"source": "5 0"}).json()
    output = client.post("/v1/translate", {"inputs": "5 0"}).json()["results"][0]["outputs"][0]
    assert greedy["output"] == output["output"] == "five zero"
    assert [s["id"] for s in greedy["steps"][:-1]] == output["ids"]
    assert greedy["logprob"] == pytest.approx(output["logprob"], abs=1e-4)
    # A given target is teacher-forced, token by token.
    given = client.post("/v1/explain", {"source": "5 0", "target": "five one"}).json()
    ids = reference.tokenizers.target.encode("five one")
    assert [s["id"] for s in given["steps"]][:-1] == ids and given["steps"][-1]["token"] == "<eos>"
    assert given["logprob"] < greedy["logprob"]


def test_page_is_self_contained(client: Client) -> None:
    reply = client.get("/")
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/html")
    page = reply.text
    for needle in ('src="http', "href=\"http", "@import", "cdn", "//fonts."):
        assert needle not in page
    for part in ('id="source"', 'id="attention-template"', "/v1/translate", "/v1/explain"):
        assert part in page
    assert "__" + "ATTENTION_SCRIPT__" not in page and "function heatmap" in page
