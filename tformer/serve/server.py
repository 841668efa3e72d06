"""Run an application with uvicorn until SIGINT or SIGTERM.

On SIGTERM uvicorn stops accepting connections, finishes the requests in flight, runs the
application's shutdown (the decoding worker ends), and then raises the signal again so the
process dies of it; ``run_server`` keeps a handler of its own in place for that moment, so a
SIGTERM ends the process with exit status 0 once everything in flight is answered.

uvicorn closes a connection that stays idle between requests (keep-alive), but not one that
sends half a request and then waits: each such connection would hold a socket and a request
for ever (slowloris). ``DeadlineH11`` gives each request ``--request-timeout`` seconds from
the moment the server waits for it until its body has arrived whole, then answers 408 and
closes the connection; the time the model takes to answer is not counted.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import signal
import socket
from collections.abc import Callable
from types import FrameType

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from tformer.errors import ConfigError
from tformer.serve.settings import LOCALHOST, ServeSettings


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _after_shutdown(signum: int, frame: FrameType | None) -> None:
    """uvicorn raises SIGTERM again after its graceful shutdown: nothing is left to do."""


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to (``host``, ``port``) and listening (port 0: a free port).

    Raises:
        ConfigError: the address cannot be listened on (in use, not this machine's, ...).
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(2048)
        except BaseException:
            sock.close()
            raise
    except OSError as error:
        reason = error.strerror or str(error)
        raise ConfigError(
            f"--host {host} --port {port}: cannot listen there ({reason}); "
            "choose another --port, or a --host of this machine"
        ) from None
    return sock


def check_address(host: str, port: int) -> None:
    """Refuse an address this process cannot listen on (in use, not this machine's, ...)."""
    listen(host, port).close()


def url_of(sock: socket.socket) -> str:
    """``http://host:port/`` of a listening socket, with the port it really got."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def run_server(
    app: FastAPI,
    host: str = LOCALHOST,
    port: int = 8000,
    *,
    request_timeout: float | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``app`` in this thread until SIGINT (KeyboardInterrupt) or SIGTERM (returns).

    Args:
        request_timeout: seconds a request has to arrive whole (default: the app's
            ``--request-timeout``).
        ready: called with the URL served (its real port, also for port 0) once listening.

    Raises:
        ConfigError: the address cannot be listened on.
    """
    if request_timeout is None:
        service = getattr(app.state, "service", None)
        settings = service.settings if service is not None else ServeSettings()
        request_timeout = settings.request_timeout
    sock = listen(host, port)
    server = uvicorn_server(app, host, port, request_timeout)
    previous = signal.signal(signal.SIGTERM, _after_shutdown)
    try:
        if ready is not None:
            ready(url_of(sock))  # connections queue on the socket until the app has started
        server.run(sockets=[sock])
    except SystemExit:  # uvicorn's own exit when it cannot start (logged above)
        raise ConfigError(f"--host {host} --port {port}: the server could not start") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()


def uvicorn_server(app: FastAPI, host: str, port: int, request_timeout: float) -> uvicorn.Server:
    """The uvicorn server ``run_server`` runs: warnings only, no access log, the app's
    lifespan, HTTP/1.1 only, and each request given ``request_timeout`` seconds to arrive
    whole."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        http=deadline_protocol(request_timeout),
        ws="none",  # no WebSocket routes: an upgrade request is plain HTTP, under the deadline
    )
    return uvicorn.Server(config)


def deadline_protocol(seconds: float) -> type[H11Protocol]:
    """``DeadlineH11`` with a deadline of ``seconds`` (uvicorn builds one per connection)."""
    return type("DeadlineH11", (DeadlineH11,), {"request_timeout": seconds})


class DeadlineH11(H11Protocol):
    """uvicorn's h11 protocol, with a deadline for each request to arrive whole."""

    request_timeout = 20.0
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """Malformed HTTP (uvicorn's own refusal, in plain text): in the API's JSON shape."""
        self.transport.write(
            _whole_response(
                400, "Bad Request", "not a valid HTTP/1.1 request; send a well-formed request"
            )
        )
        self.transport.close()

    def _watch(self) -> None:
        """Arm the deadline while a request is awaited or arriving; disarm it once whole."""
        awaited = self.conn.their_state in (h11.IDLE, h11.SEND_BODY)
        if not awaited or self.transport.is_closing():
            self._disarm()
        elif self._deadline is None:
            self._deadline = self.loop.call_later(self.request_timeout, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        begun = self.conn.their_state is h11.SEND_BODY or bool(self.conn.trailing_data[0])
        answered = self.conn.their_state is h11.SEND_BODY and self.cycle.response_started
        if begun and not answered:  # a client that sent nothing is closed as keep-alive does
            message = (
                f"the request did not arrive whole within {self.request_timeout:g} s "
                "(tformer serve --request-timeout); send its headers and body without pausing"
            )
            self.transport.write(_whole_response(408, "Request Timeout", message))
        self.transport.close()


def _whole_response(status: int, reason: str, message: str) -> bytes:
    """A whole response in the API's one-line JSON shape, to send before closing (written
    past h11, whose state may not allow a response before the request's headers are in)."""
    body = json.dumps({"error": message}).encode()
    head = [
        f"HTTP/1.1 {status} {reason}".encode(),
        b"content-type: application/json",
        b"connection: close",
        b"content-length: " + str(len(body)).encode(),
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body
