"""The server's own settings: where it listens, how it batches, and what it accepts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tformer.config import check_numbers
from tformer.decoding.settings import MAX_ROWS
from tformer.errors import ConfigError

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
    port: int = _field(8000, "The port to listen on.")
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

    def __post_init__(self) -> None:
        check_numbers(self)
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
