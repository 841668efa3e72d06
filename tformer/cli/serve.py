"""``tformer serve``: an HTTP translation service and a web page over one checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.markup import escape

from tformer.cli.app import app
from tformer.cli.console import err_console
from tformer.cli.data_options import checkpoint_family
from tformer.cli.ensemble_options import ENSEMBLE, SHORTLIST, with_members
from tformer.cli.options import (
    CHECKPOINT,
    CHECKPOINT_CHOICE,
    DEVICE,
    QUANTIZE,
    apply_quantize,
    config_parameter,
    load_chosen,
    with_parameters,
)
from tformer.serve import require
from tformer.serve.settings import ServeSettings

_SETTINGS = [
    "host",
    "port",
    "allowed_hosts",
    "request_timeout",
    "batch_window_ms",
    "max_batch_tokens",
    "max_input_tokens",
    "max_inputs",
    "max_new_tokens",
    "max_rows",
    "max_body_bytes",
    "max_queue",
]


@app.command("serve")
@with_parameters([config_parameter(ServeSettings, name) for name in _SETTINGS])
def serve_command(
    checkpoint: Path = CHECKPOINT,
    checkpoint_choice: str = CHECKPOINT_CHOICE,
    device: str = DEVICE,
    quantize: str = QUANTIZE,
    ensemble: list[Path] | None = ENSEMBLE,
    shortlist: Path | None = SHORTLIST,
    **values: Any,
) -> None:
    """Serve translations (or a decoder-only model's continuations) over HTTP, with a web page
    at / (needs the serve extra).

    Requests that arrive together are decoded in one batch. The JSON API is described
    at the page /docs of the server. Ctrl-C or SIGTERM finishes the requests in flight
    and stops. Binds to 127.0.0.1 unless --host names another address (docs/serve.md).

    Examples:

      tformer serve checkpoints/dates

      tformer serve checkpoints/dates --port 9000 --quantize int8 --max-inputs 16

      tformer serve checkpoints/dates --ensemble checkpoints/dates-2
    """
    require()
    # fastapi and uvicorn: the optional extra, checked just above
    from tformer.serve.app import create_app
    from tformer.serve.server import check_address, is_loopback, run_server

    settings = ServeSettings(**values)
    check_address(settings.host, settings.port)  # before the minutes a large model may take
    checkpoint_family(checkpoint, "serve", "generates")
    loaded = load_chosen(checkpoint, device)
    apply_quantize(loaded.model, quantize)
    model, members = with_members(
        loaded, ensemble, "serve", device=device, quantize=quantize, shortlist=shortlist
    )

    application = create_app(loaded, settings, quantize=quantize, model=model, members=members)
    if not is_loopback(settings.host):
        err_console.print(
            f"[yellow]warning:[/] --host {escape(settings.host)} is reachable from other "
            "machines; tformer serve has no authentication (it answers the Host names "
            f"{escape(', '.join(settings.hosts()))}: --allowed-hosts)",
            soft_wrap=True,
        )
    max_len = model.config.max_len
    if settings.max_input_tokens is not None and settings.max_input_tokens > max_len:
        err_console.print(
            f"[yellow]warning:[/] --max-input-tokens {settings.max_input_tokens} is over the "
            f"model's max_len of {max_len}: longer inputs are read up to {max_len} tokens (each "
            "answer's warnings say so)",
            soft_wrap=True,
        )

    def ready(url: str) -> None:
        err_console.print(
            f"serving {escape(', '.join(members))} at {escape(url)} (Ctrl-C or SIGTERM stops)",
            soft_wrap=True,
            highlight=False,
        )

    run_server(application, settings.host, settings.port, ready=ready)
