"""A real server on a free localhost port (uvicorn in a thread), and a small HTTP client."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tformer.checkpoint.store import Checkpoint, load_checkpoint
from tformer.training.run import TrainResult

MAX_BODY = 4096
MAX_QUEUE = 64  # above the 32 concurrent requests of the batching test
REQUEST_TIMEOUT = 2.0  # seconds; the slow-client tests wait this long


def same_outputs(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """The same outputs, their log-probabilities to rounding: decoded again, alone or in
    another batch, a product may take another (equally exact) path, as packed weights are kept
    between requests and batches have other row counts."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        exact = {k for k in w if "logprob" not in k and k != "score"}
        assert {k: g[k] for k in exact} == {k: w[k] for k in exact}
        assert g["token_logprobs"] == pytest.approx(w["token_logprobs"], abs=1e-4)
        assert (g["logprob"], g["score"]) == pytest.approx((w["logprob"], w["score"]), abs=1e-4)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


@dataclass
class Client:
    port: int

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> Reply:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
            sent = {"Content-Type": "application/json", **(headers or {})}
            conn.request(method, path, body=data, headers=sent)
            response = conn.getresponse()
            text = response.read().decode("utf-8")
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, text)
        finally:
            conn.close()

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Reply:
        return self.request("POST", path, body, **kwargs)

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def wait_ready(self, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if self.get("/health").status == 200:
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("the server did not answer /health")


def jsdom_driver() -> tuple[str, Path]:
    """node and page_driver.js, or a skip saying which of node and jsdom is missing."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the page cannot be run in jsdom")
    if subprocess.run([node, "-e", "require('jsdom')"], capture_output=True).returncode != 0:
        pytest.skip("jsdom cannot be loaded by node (npm install jsdom; NODE_PATH)")
    return node, Path(__file__).with_name("page_driver.js")


@dataclass
class Running:
    client: Client
    loaded: Checkpoint
    app: Any


@pytest.fixture(scope="package")
def served(trained: TrainResult) -> Iterator[Running]:
    """The digit model served with small limits (the tests cross them) and a 50 ms window."""
    from tformer.serve.settings import ServeSettings

    loaded = load_checkpoint(trained.run_dir)
    settings = ServeSettings(
        port=free_port(),
        batch_window_ms=50,
        max_inputs=8,
        max_input_tokens=20,
        max_new_tokens=40,
        max_rows=16,
        max_body_bytes=MAX_BODY,
        max_queue=MAX_QUEUE,
        request_timeout=REQUEST_TIMEOUT,
    )
    with serving(loaded, settings) as running:
        yield running


@contextmanager
def serving(loaded: Checkpoint, settings: Any, **options: Any) -> Iterator[Running]:
    """``loaded`` served by uvicorn in a thread with these ``ServeSettings`` (and
    ``create_app``'s ``options``), until the end."""
    from tformer.serve.app import create_app
    from tformer.serve.server import uvicorn_server

    app = create_app(loaded, settings, **options)
    server = uvicorn_server(app, "127.0.0.1", settings.port, settings.request_timeout)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    client = Client(settings.port)
    client.wait_ready()
    try:
        yield Running(client, loaded, app)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def client(served: Running) -> Client:
    return served.client
