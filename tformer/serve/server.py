"""Run an application with uvicorn until SIGINT or SIGTERM.

On SIGTERM uvicorn stops accepting connections, finishes the requests in flight, runs the
application's shutdown (the decoding worker ends), and then raises the signal again so the
process dies of it; ``run_server`` keeps a handler of its own in place for that moment, so a
SIGTERM ends the process with exit status 0 once everything in flight is answered.
"""

from __future__ import annotations

import ipaddress
import signal
from types import FrameType

import uvicorn
from fastapi import FastAPI

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


def run_server(app: FastAPI, host: str = LOCALHOST, port: int = 8000) -> None:
    """Serve ``app`` in this thread until SIGINT (KeyboardInterrupt) or SIGTERM (returns)."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="on"
    )
    server = uvicorn.Server(config)
    previous = signal.signal(signal.SIGTERM, _after_shutdown)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not server.started:
        raise OSError(f"could not serve on {host}:{port} (the address may be in use)")
