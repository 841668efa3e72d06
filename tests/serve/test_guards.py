"""The server's defences before the model: Host allow-list, JSON content type, slow clients,
tokenising off the event loop; and the inputs-too-long warning the command line also gives."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from tformer.serve.settings import ServeSettings, split_host  # noqa: E402

from .conftest import REQUEST_TIMEOUT, Client, Running  # noqa: E402

T = "/v1/translate"


@pytest.mark.parametrize(
    ("content_type", "message"),
    [
        (
            "text/plain",
            "Content-Type 'text/plain' is not JSON; send the body as JSON with the "
            "header Content-Type: application/json",
        ),
        ("application/x-www-form-urlencoded", "is not JSON"),
        ("application/json; charset=latin-1", "JSON is read as UTF-8"),
        (None, "the request has no Content-Type; send the body as JSON"),
    ],
)
def test_a_body_not_declared_json_gets_415_naming_the_type(
    client: Client, content_type: str | None, message: str
) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    reply = _post_raw(client, b'{"inputs": "1"}', headers)
    assert reply[0] == 415, reply
    assert message in reply[1]


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=UTF-8", "application/x+json"]
)
def test_json_content_types_are_answered(client: Client, content_type: str) -> None:
    reply = client.post(T, {"inputs": "4 2"}, headers={"Content-Type": content_type})
    assert reply.status == 200, reply.text
    assert reply.json()["results"][0]["outputs"][0]["output"] == "four two"


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1", 200),
        ("LOCALHOST:8000", 200),
        ("[::1]:1234", 200),
        ("localhost.", 200),
        ("rebound.example.com", 400),
        ("127.0.0.1.nip.io:80", 400),
        ("127.0.0.1:80:80", 400),
        ("", 400),
    ],
)
def test_only_allowed_host_names_are_answered(client: Client, host: str, status: int) -> None:
    """A page whose DNS name was rebound to 127.0.0.1 sends its own name as Host."""
    reply = client.request("GET", "/v1/model", headers={"Host": host})
    assert reply.status == status, reply.text
    if status == 400:
        error = reply.json()["error"]
        assert (
            "is not a name this server answers to (--allowed-hosts: 127.0.0.1, localhost, "
            "::1)" in error
        )
        assert "\n" not in error


def test_allowed_hosts_parse_names_ports_and_addresses() -> None:
    settings = ServeSettings(allowed_hosts="Example.org, api.example.org:8443,[::1]:80,*")
    assert settings.hosts() == ("example.org", "api.example.org:8443", "[::1]:80", "*")
    assert split_host("api.example.org:8443") == ("api.example.org", 8443)
    assert split_host("::1") == ("::1", None)
    assert ServeSettings(host="0.0.0.0").hosts() == ("0.0.0.0", "localhost", "127.0.0.1", "::1")
    for bad in ("exa mple.org", "example.org:http", "[::1", "a/b"):
        with pytest.raises(Exception, match="--allowed-hosts .* is not a host name"):
            ServeSettings(allowed_hosts=bad)


SLOW = {  # what each slow client sends before it stops: (bytes, the answer it gets)
    "half the headers": (b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty", 408),
    "half the body": (
        b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
        b'\r\nContent-Length: 40\r\n\r\n{"inputs": ',
        408,
    ),
    "nothing": (b"", None),  # closed without an answer, as an idle keep-alive connection is
}


@pytest.mark.slow
def test_connections_that_never_send_a_whole_request_are_closed_in_time(client: Client) -> None:
    """Each slow connection is answered 408 and closed after --request-timeout (one that sent
    nothing just closed); other requests are served meanwhile."""
    slow = {what: socket.create_connection(("127.0.0.1", client.port), timeout=30) for what in SLOW}
    try:
        for what, (sent, _) in SLOW.items():
            slow[what].sendall(sent)
        start = time.monotonic()
        assert client.post(T, {"inputs": "1"}).status == 200  # served while they wait
        answers = {what: _read_all(sock) for what, sock in slow.items()}
        waited = time.monotonic() - start
    finally:
        for sock in slow.values():
            sock.close()
    for what, (_, status) in SLOW.items():
        if status is None:
            assert answers[what] == b"", what
        else:
            assert answers[what].startswith(b"HTTP/1.1 408 "), (what, answers[what])
            assert b'"error": "the request did not arrive whole within 2 s' in answers[what]
    assert REQUEST_TIMEOUT - 0.5 < waited < REQUEST_TIMEOUT + 10, waited
    assert client.get("/health").status == 200


@pytest.mark.parametrize(
    "sent",
    [
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n",
        b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -1\r\n\r\n",
        b"\x00\x01\xff" * 50,
    ],
    ids=["two-hosts", "negative-length", "not-http"],
)
def test_malformed_http_is_refused_in_one_json_line(client: Client, sent: bytes) -> None:
    with socket.create_connection(("127.0.0.1", client.port), timeout=30) as bad:
        bad.sendall(sent)
        answer = _read_all(bad)
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert answer.endswith(b'{"error": "not a valid HTTP/1.1 request; send a well-formed request"}')
    assert client.get("/health").status == 200


def test_a_number_too_long_to_read_is_named() -> None:
    from tformer.serve.limits import unreadable

    with pytest.raises(ValueError) as raised:
        json.loads('{"seed": ' + "9" * 5000 + "}")
    assert unreadable(raised.value) == (
        "the body holds a number with too many digits to read; send smaller numbers"
    )


def test_tokenising_runs_off_the_event_loop(
    client: Client, served: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one request's text is being tokenised (held here), /health answers at once."""
    service = served.app.state.service
    real, started, release = service.encode, threading.Event(), threading.Event()

    def held(*args: Any) -> Any:
        started.set()
        release.wait(30)
        return real(*args)

    monkeypatch.setattr(service, "encode", held)
    replies: list[Any] = []
    sender = threading.Thread(target=lambda: replies.append(client.post(T, {"inputs": "4 2"})))
    sender.start()
    try:
        assert started.wait(30)
        start = time.monotonic()
        assert client.get("/health").status == 200
        assert time.monotonic() - start < 1.0
    finally:
        release.set()
        sender.join(30)
    assert replies[0].status == 200


def test_inputs_longer_than_the_model_get_the_command_line_warning(
    client: Client, served: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --max-input-tokens above the model's max_len (64), the answer says what was cut,
    in the words `tformer generate` prints."""
    monkeypatch.setattr(served.app.state.service, "max_input_tokens", 100)
    long, tokenizers = " ".join("7" * 40), served.loaded.tokenizers
    length = len(tokenizers.source.encode(long))
    assert 64 < length <= 100
    reply = client.post(T, {"inputs": ["4 2", long]})
    assert reply.status == 200, reply.text
    assert reply.json()["warnings"] == [
        f"1 of 2 inputs are longer than the model's max_len of 64 tokens (input 2 has {length}); "
        "only their first 64 tokens were read"
    ]
    assert client.post(T, {"inputs": "4 2"}).json()["warnings"] == []
    target = " ".join(["four"] * 70)
    length = len(tokenizers.target.encode(target))
    explained = client.post("/v1/explain", {"source": "4", "target": target})
    assert explained.status == 200, explained.text
    assert explained.json()["warnings"] == [
        f"target has {length} tokens; with <bos> the model's max_len of 64 leaves room for 63, "
        "so only its first 63 tokens were read"
    ]


def _post_raw(client: Client, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    """A POST with exactly ``headers`` (the client's own adds a JSON content type)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", client.port, timeout=30)
    try:
        conn.request("POST", T, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


@pytest.mark.slow
def test_a_huge_request_at_the_default_limits_never_holds_up_other_requests(
    served: Running,
) -> None:
    """A body just under the default --max-body-bytes (1 MiB: 64 inputs of 16 KB, each far
    past the model's max_len) is tokenised off the event loop and refused: /health answers
    quickly all the while, and the huge request gets its one-line answer in bounded time."""
    from .conftest import free_port, serving

    settings = ServeSettings(port=free_port())  # the defaults a user gets
    text = " ".join(["1 2 3 4 5 6 7 8 9"] * 900)  # 16 KB
    body = {"inputs": [text] * settings.max_inputs}
    assert len(json.dumps(body)) < settings.max_body_bytes
    with serving(served.loaded, settings) as running:
        replies: list[Any] = []
        sender = threading.Thread(target=lambda: replies.append(running.client.post(T, body)))
        start = time.monotonic()
        sender.start()
        slowest = 0.0
        while sender.is_alive() and time.monotonic() - start < 60:
            asked = time.monotonic()
            assert running.client.get("/health").status == 200
            slowest = max(slowest, time.monotonic() - asked)
            time.sleep(0.02)
        sender.join(60)
    assert not sender.is_alive(), "the huge request was not answered within 60 s"
    assert slowest < 1.0, slowest
    assert replies[0].status == 422, replies[0].text
    assert "this server reads at most" in replies[0].json()["error"], replies[0].text
