"""A decoder-only model served: the API continues prompts as ``tformer generate`` does, streams,
and answers attention and explanations over <bos> + prompt + output; the page follows."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from tformer.checkpoint.store import load_checkpoint  # noqa: E402
from tformer.config import BOS  # noqa: E402
from tformer.decoding.settings import DecodingConfig  # noqa: E402
from tformer.decoding.text import translate  # noqa: E402
from tformer.training.run import TrainResult  # noqa: E402

from .conftest import Client, Running, free_port, jsdom_driver, serving  # noqa: E402

PROMPTS = ["6 March 2025 =", "December 1999 ="]


@pytest.fixture(scope="module")
def served_lm(gpt_run: TrainResult) -> Iterator[Running]:
    from tformer.serve.settings import ServeSettings

    with serving(load_checkpoint(gpt_run.run_dir), ServeSettings(port=free_port())) as running:
        yield running


def test_continuations_are_generates(served_lm: Running) -> None:
    answer = served_lm.client.post("/v1/translate", {"inputs": PROMPTS, "beam_size": 3})
    assert answer.status == 200, answer.text
    ckpt = load_checkpoint(served_lm.loaded.path)
    expected = translate(ckpt.model, ckpt.tokenizers, PROMPTS, DecodingConfig(beam_size=3))
    served = [[o["output"] for o in r["outputs"]] for r in answer.json()["results"]]
    assert served == [[g.text for g in per_prompt] for per_prompt in expected]
    assert all(served)  # the model continues each prompt with something


def test_a_stream_sends_the_continuations_tokens(served_lm: Running) -> None:
    reply = served_lm.client.post("/v1/translate", {"inputs": PROMPTS[0], "stream": True})
    assert reply.status == 200
    events = [block for block in reply.text.split("\n\n") if block.strip()]
    tokens = [json.loads(e.split("data: ", 1)[1]) for e in events if e.startswith("event: token")]
    done = json.loads(events[-1].split("data: ", 1)[1])
    whole = served_lm.client.post("/v1/translate", {"inputs": PROMPTS[0]}).json()
    assert tokens and tokens[-1]["text"] == done["outputs"][0]["output"]
    assert done["outputs"][0]["output"] == whole["results"][0]["outputs"][0]["output"]


def test_attention_and_explanations_read_bos_prompt_and_output(served_lm: Running) -> None:
    client: Client = served_lm.client
    output = client.post("/v1/translate", {"inputs": PROMPTS[0]}).json()
    first = output["results"][0]["outputs"][0]
    prompt_tokens = served_lm.loaded.tokenizers.source.tokens(
        served_lm.loaded.tokenizers.source.encode(PROMPTS[0])
    )
    maps = client.post("/v1/attention", {"source": PROMPTS[0], "kind": "decoder"})
    assert maps.status == 200, maps.text
    columns = maps.json()["columns"]
    assert columns[: 1 + len(prompt_tokens)] == [BOS, *prompt_tokens]
    refused = client.post("/v1/attention", {"source": PROMPTS[0], "kind": "cross"})
    assert refused.status == 422 and "no cross attention" in refused.json()["error"]
    answer = client.post("/v1/explain", {"source": PROMPTS[0]})
    assert answer.status == 200, answer.text
    explained = answer.json()
    assert explained["source_tokens"] == [BOS, *prompt_tokens, *first["tokens"]]
    assert len(explained["steps"]) == first["length"] + 1  # its tokens and <eos>
    for step in explained["steps"]:
        for column in step["source"]:
            assert explained["source_tokens"][column["position"]] == column["token"]


def test_the_page_continues_a_prompt_in_jsdom(served_lm: Running) -> None:
    node, driver = jsdom_driver()
    wanted = json.dumps({"source": PROMPTS[0], "kind": "decoder", "settings": {}})
    run = subprocess.run([node, str(driver), f"http://127.0.0.1:{served_lm.client.port}/",
                          wanted], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    seen, page = (json.loads(x) for x in run.stdout.splitlines())
    assert page["errors"] == [] and seen["error"] == ""
    assert seen["label"] == "prompt" and seen["button"] == "continue"
    expected = served_lm.client.post("/v1/translate", {"inputs": PROMPTS[0]}).json()
    assert seen["outputs"] == [expected["results"][0]["outputs"][0]["output"]]
    assert seen["kinds"] == ["decoder"] and seen["rendered"].startswith("decoder/")
    assert seen["renderedAfter"].endswith("/1") and seen["cells"] > 0
    assert "prompt + output" in seen["explainHeader"][-1]
