"""Bad requests: a 4xx with a one-line reason, never a 500, and the server answers after."""

from __future__ import annotations

import http.client
import threading
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from .conftest import MAX_BODY, MAX_QUEUE, Client, Running  # noqa: E402

T = "/v1/translate"
A = "/v1/attention"
E = "/v1/explain"

CASES: list[tuple[str, str, Any, int, str]] = [
    # (name, path, JSON body or raw bytes, status, part of the message)
    ("malformed-json", T, b'{"inputs": ', 400, "not valid JSON"),
    ("not-utf8", T, b"\xff\xfe{", 400, "not UTF-8 JSON"),
    ("not-an-object", T, b"[1, 2]", 422, "valid dictionary"),
    ("nested-too-deeply", T, b"[" * 2000 + b"]" * 2000, 400, "nested too deeply to read"),
    ("float-overflow", T, b'{"inputs": "1", "temperature": 1e400}', 422,
     "--temperature inf must be a finite number"),
    ("lone-surrogate", T, b'{"inputs": "1 \\udc80 2"}', 422,
     "inputs: not valid Unicode text (a lone surrogate U+DC80 at character 2"),
    ("lone-surrogate-in-list", T, b'{"inputs": ["1", "\\ud800"]}', 422, "inputs[1]: not valid"),
    ("lone-surrogate-source", A, b'{"source": "\\udfff"}', 422, "source: not valid Unicode text"),
    ("lone-surrogate-target", E, b'{"source": "1", "target": "\\udc80"}', 422,
     "target: not valid Unicode text"),
    ("missing-inputs", T, {}, 422, "inputs: Field required"),
    ("string-for-int", T, {"inputs": "1", "beam_size": "4"}, 422, "beam_size: Input should be"),
    ("bool-for-int", T, {"inputs": "1", "top_k": True}, 422, "top_k: Input should be"),
    ("list-of-numbers", T, {"inputs": [1, 2]}, 422, "inputs"),
    ("unknown-field", T, {"inputs": "1", "beam": 4}, 422, "beam: unknown field"),
    ("beam-size-0", T, {"inputs": "1", "beam_size": 0}, 422, "--beam-size 0 must be >= 1"),
    ("n-best-over-beam", T, {"inputs": "1", "beam_size": 2, "n_best": 3}, 422,
     "--n-best 3 exceeds --beam-size 2"),
    ("top-p-when-greedy", T, {"inputs": "1", "top_p": 0.9}, 422, "only apply when sampling"),
    ("nan-temperature", T, b'{"inputs": "1", "temperature": NaN}', 422,
     "--temperature nan must be a finite number"),
    ("huge-seed", T, {"inputs": "1", "temperature": 1.0, "seed": 2**70}, 422, "--seed"),
    ("over-new-token-cap", T, {"inputs": "1", "max_new_tokens": 41}, 422,
     "over this server's cap of 40"),
    ("too-many-inputs", T, {"inputs": ["1"] * 9}, 422, "at most 8 a request"),
    ("no-inputs", T, {"inputs": []}, 422, "empty list"),
    ("over-long-input", T, {"inputs": ["1", "2 " * 30]}, 422,
     "this server reads at most 20 (tformer serve --max-input-tokens)"),
    ("too-many-rows", T, {"inputs": ["1"] * 4, "temperature": 1.0, "num_samples": 5}, 422,
     "is 20 rows"),
    ("stream-many", T, {"inputs": ["1", "2"], "stream": True}, 422, "stream sends one input"),
    ("stream-beam", T, {"inputs": "1", "stream": True, "beam_size": 2}, 422,
     "beam search knows its best output only at the end"),
    ("attention-kind", A, {"source": "1", "kind": "self"}, 422, "kind: Input should be"),
    ("attention-layer", A, {"source": "1", "layer": 5}, 422, "--layer 5 is out of range"),
    ("attention-head", A, {"source": "1", "head": "max"}, 422, "head"),
    ("attention-long-target", A, {"source": "1", "target": "one " * 30}, 422,
     "target has"),
    ("explain-output", E, {"source": "1", "output": 3}, 422, "output 3 is out of range"),
    ("explain-negative-output", E, {"source": "1", "output": -1}, 422, "output: Input should"),
    ("body-too-large", T, {"inputs": ["1 2 3"] * 1000}, 413, "over 4096 bytes"),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_refused_in_one_line(
    client: Client, path: str, body: Any, status: int, message: str
) -> None:
    raw = body if isinstance(body, bytes) else None
    reply = client.post(path, None if raw is not None else body, raw=raw)
    assert reply.status == status, reply.text
    error = reply.json()["error"]
    assert message in error
    assert "\n" not in error and len(error) < 400
    assert client.get("/health").status == 200


def test_http_errors_are_one_line_too(client: Client) -> None:
    missing = client.get("/v1/nothing")
    assert missing.status == 404 and missing.json() == {"error": "Not Found"}
    wrong = client.get(T)
    assert wrong.status == 405 and wrong.json() == {"error": "Method Not Allowed"}


def test_a_chunked_body_over_the_limit_is_cut_off(client: Client) -> None:
    """No Content-Length to refuse up front: the body is counted as it arrives."""
    conn = http.client.HTTPConnection("127.0.0.1", client.port, timeout=30)
    chunks = iter([b'{"inputs": "', b"1 " * MAX_BODY, b'"}'])
    conn.request("POST", T, body=chunks, headers={"Content-Type": "application/json"},
                 encode_chunked=True)
    response = conn.getresponse()
    assert response.status == 413
    assert "--max-body-bytes" in response.read().decode()
    conn.close()
    assert client.get("/health").status == 200


@pytest.mark.parametrize(
    ("raised", "status", "message"),
    [
        (RuntimeError("boom\nmore lines"), 500, "internal error (RuntimeError: boom)"),
        (RuntimeError("CUDA out of memory. Tried"), 503, "out of memory (CUDA out of memory."),
    ],
)
def test_an_unforeseen_error_is_one_line_and_the_server_goes_on(
    client: Client, served: Running, monkeypatch: pytest.MonkeyPatch,
    raised: Exception, status: int, message: str,
) -> None:
    def fail(*args: Any) -> None:
        raise raised

    monkeypatch.setattr(served.app.state.service, "explanation", fail)
    reply = client.post(E, {"source": "1"})
    assert reply.status == status
    assert reply.json()["error"].startswith(message)
    monkeypatch.undo()
    assert client.post(E, {"source": "1"}).status == 200
    assert client.get("/health").status == 200


def test_a_full_queue_is_refused_at_once_and_the_server_goes_on(
    client: Client, served: Running
) -> None:
    """With the worker held and --max-queue requests waiting, one more of any kind gets a 503
    with Retry-After at once; the waiting ones are then all served."""
    batcher = served.app.state.service.batcher
    started, release = threading.Event(), threading.Event()

    def hold() -> bool:
        started.set()
        return release.wait(60)

    held = batcher.call(hold)
    try:
        assert started.wait(60)  # the worker is busy with it, so the queue is empty
        waiting = [batcher.call(lambda: "served") for _ in range(MAX_QUEUE)]
        for path, body in ((T, {"inputs": "1"}), (T, {"inputs": "1", "stream": True}),
                           (A, {"source": "1"}), (E, {"source": "1"})):  # fmt: skip
            reply = client.post(path, body, timeout=10)
            assert reply.status == 503, (path, reply.text)
            assert reply.headers["retry-after"] == "1"
            assert reply.json()["error"] == (
                f"the server is busy: {MAX_QUEUE} requests are already waiting (--max-queue); "
                "retry shortly"
            )
        assert client.get("/health").status == 200  # answered without the worker
    finally:
        release.set()
    assert held.result(timeout=60) is True
    assert [future.result(timeout=60) for future in waiting] == ["served"] * len(waiting)
    assert client.post(T, {"inputs": "1"}).status == 200
