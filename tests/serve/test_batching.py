"""Requests that arrive together are decoded in one batch, each with the result it gets alone."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from .conftest import Client, Running, same_outputs  # noqa: E402

TEXTS = ["3 1 4", "1 5 9 2 6", "5", "3 5 8 9 7 9", "3 2", "3 8 4 6", "2 6 4", "3 3 8 3 2"]
SETTINGS: list[dict[str, Any]] = [
    {},
    {"temperature": 1.0, "seed": 11},
    {"temperature": 0.8, "top_p": 0.9, "seed": 4, "num_samples": 2},
    {"beam_size": 2, "n_best": 2},
]


def requests() -> list[dict[str, Any]]:
    """Each text with each setting; every third request carries two inputs."""
    bodies = []
    for s, settings in enumerate(SETTINGS):
        for n, text in enumerate(TEXTS):
            inputs = [text, TEXTS[(n + s + 1) % len(TEXTS)]] if n % 3 == 0 else [text]
            bodies.append({"inputs": inputs, "max_new_tokens": 20, **settings})
    return bodies


def same_answers(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["settings"] == want["settings"]
    for g_result, w_result in zip(got["results"], want["results"], strict=True):
        assert g_result["input"] == w_result["input"]
        same_outputs(g_result["outputs"], w_result["outputs"])


@pytest.mark.slow
def test_concurrent_requests_batch_and_match_alone(client: Client, served: Running) -> None:
    bodies = requests()
    batcher = served.app.state.service.batcher
    alone = []
    for body in bodies:
        before = batcher.batches
        alone.append(client.post("/v1/translate", body).json())
        assert batcher.batches == before + 1  # one request at a time: a batch each

    answers: list[Any] = [None] * len(bodies)
    gate = threading.Barrier(len(bodies))

    def send(n: int) -> None:
        gate.wait()
        answers[n] = client.post("/v1/translate", bodies[n])

    before = batcher.batches
    threads = [threading.Thread(target=send, args=(n,)) for n in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    # Requests with equal settings decode together: far fewer batches than requests.
    assert batcher.batches - before < len(bodies) // 2
    for reply, want in zip(answers, alone, strict=True):
        assert reply.status == 200, reply.text
        same_answers(reply.json(), want)
