"""The server's own settings: where it listens, how it batches, and what it accepts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tformer.config import check_numbers
from tformer.decoding.settings import MAX_ROWS
from tformer.errors import ConfigError
from tformer.paths import excerpt

LOCALHOST = "127.0.0.1"


def _field(default: Any, help: str) -> Any:
    """A field with its help text: the help of its ``tformer serve`` option."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """Where the server listens, how it batches, and what it accepts.

    Field ``foo_bar`` is the flag ``--foo-bar`` of ``tformer serve``.
    """

    host: str = _field(
        LOCALHOST, "The address to listen on (another than 127.0.0.1 must be asked for)."
    )
    port: int = _field(8000, "The port to listen on (0: any free port, printed at start).")
    allowed_hosts: str | None = _field(
        None,
        "Host headers answered, comma-separated (a name or address, :port to pin the port, * "
        "for any); any other gets 400 (default: --host, localhost, 127.0.0.1 and ::1).",
    )
    batch_window_ms: float = _field(
        10.0, "How long the worker waits after a request for others to decode with it."
    )
    max_batch_tokens: int = _field(
        16384,
        "A batch stops collecting requests once its rows x (source tokens + max new tokens) "
        "reach this.",
    )
    max_input_tokens: int | None = _field(
        None, "The longest input accepted, in source tokens (default: the model's max_len)."
    )
    max_inputs: int = _field(64, "The most inputs in one request.")
    max_new_tokens: int = _field(
        256, "The largest max_new_tokens a request may ask for (also its default when lower)."
    )
    max_rows: int = _field(
        256, "The most inputs x outputs per input (beams or samples) in one request."
    )
    max_body_bytes: int = _field(
        1 << 20, "Request bodies over this many bytes are refused (413) before being read."
    )
    max_queue: int = _field(
        256,
        "The most requests waiting for the model; one more is refused at once (503, "
        "Retry-After) until the queue shrinks.",
    )

    request_timeout: float = _field(
        20.0,
        "Seconds a connection has to send a whole request (headers and body); a slower one "
        "gets 408 and is closed.",
    )

    def __post_init__(self) -> None:
        check_numbers(self)
        if not 0.1 <= self.request_timeout <= 3600:
            raise ConfigError(f"--request-timeout {self.request_timeout:g} must be in 0.1..3600")
        self.hosts()  # refuses a malformed entry now, not at the first request
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port} must be in 0..65535 (0: any free port)")
        if not 0 <= self.batch_window_ms <= 10_000:
            raise ConfigError(
                f"--batch-window-ms {self.batch_window_ms:g} must be in 0..10000 (0: no wait)"
            )
        for name in ("max_batch_tokens", "max_inputs", "max_new_tokens", "max_rows", "max_queue"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)} must be >= 1")
        if self.max_input_tokens is not None and self.max_input_tokens < 1:
            raise ConfigError(f"--max-input-tokens {self.max_input_tokens} must be >= 1")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"--max-body-bytes {self.max_body_bytes} must be >= 1024")
        if self.max_rows > MAX_ROWS:
            raise ConfigError(
                f"--max-rows {self.max_rows} is over {MAX_ROWS}, the most rows decoded "
                "together; lower --max-rows"
            )

    def hosts(self) -> tuple[str, ...]:
        """The Host header values answered (``allowed_hosts``, else the defaults), lowercase;
        an entry with a port matches that port only, one without matches any port."""
        if self.allowed_hosts is None:
            return tuple(dict.fromkeys((self.host.lower(), *LOCAL_NAMES)))
        entries = tuple(e.strip().lower() for e in self.allowed_hosts.split(","))
        for entry in entries:
            if entry != "*" and split_host(entry) is None:
                raise ConfigError(
                    f"--allowed-hosts {excerpt(self.allowed_hosts)}: {excerpt(entry)} is not a "
                    "host name or address (with an optional :port); give names separated by "
                    "commas, e.g. localhost,example.org:8000"
                )
        return entries


LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def split_host(value: str) -> tuple[str, int | None] | None:
    """(host, port or None) of a Host header value (``name``, ``name:port``, ``[v6]:port``,
    ``v6`` address bare), lowercase; None when it is not one."""
    value = value.strip().lower()
    if value.startswith("["):
        host, close, rest = value[1:].partition("]")
        if not close:
            return None
    elif value.count(":") > 1:  # a bare IPv6 address (as --host or an entry gives it)
        host, rest = value, ""
    else:
        host, colon, port = value.partition(":")
        rest = colon + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit() and len(rest) <= 6):
        return None
    host = host[:-1] if host.endswith(".") else host  # "localhost." is "localhost"
    if not host or not all(c.isascii() and (c.isalnum() or c in "-._:") for c in host):
        return None
    return host, int(rest[1:]) if rest else None
