"""Run an application with uvicorn until SIGINT or SIGTERM.

On SIGTERM uvicorn stops accepting connections, finishes the requests in flight, runs the
application's shutdown (the decoding worker ends), and then raises the signal again so the
process dies of it; ``run_server`` keeps a handler of its own in place for that moment, so a
SIGTERM ends the process with exit status 0 once everything in flight is answered.
"""

from __future__ import annotations

import ipaddress
import signal
import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI

from tformer.errors import ConfigError
from tformer.serve.settings import LOCALHOST


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


def check_address(host: str, port: int) -> None:
    """Refuse an address this process cannot listen on (in use, not this machine's, ...)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as error:
        reason = error.strerror or str(error)
        raise ConfigError(
            f"--host {host} --port {port}: cannot listen there ({reason}); "
            "choose another --port, or a --host of this machine"
        ) from None


def run_server(app: FastAPI, host: str = LOCALHOST, port: int = 8000) -> None:
    """Serve ``app`` in this thread until SIGINT (KeyboardInterrupt) or SIGTERM (returns).

    Raises:
        ConfigError: the address cannot be listened on.
    """
    check_address(host, port)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="on"
    )
    server = uvicorn.Server(config)
    previous = signal.signal(signal.SIGTERM, _after_shutdown)
    try:
        server.run()
    except SystemExit:  # uvicorn's own exit when it cannot start (logged above)
        raise ConfigError(f"--host {host} --port {port}: the server could not start") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
