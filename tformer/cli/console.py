"""Where output goes: results to stdout, progress and messages to stderr."""

from __future__ import annotations

from rich.console import Console

console = Console()
err_console = Console(stderr=True)
