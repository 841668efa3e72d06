"""The ``tformer`` command line: a thin layer over the Python API, one module per command.

``app`` (the Typer app and the single error boundary) lives in ``tformer.cli.app``; importing
``tformer.cli.commands`` registers every command on it.
"""

from __future__ import annotations

import atexit
import gc

from tformer.fast.process import configure_process


def main() -> None:
    """Console-script entry point: the process settings first, then the commands."""
    configure_process()
    # At exit, the interpreter's last garbage collection would walk every object the command
    # loaded, torch's included, only to free memory the ending process gives back anyway; exit
    # handlers and finalizers still run (docs/performance.md, "Start-up and exit").
    atexit.register(gc.freeze)
    # Imported here, not above: torch (loaded by the commands) must start after the huge-page
    # switch that configure_process sets.
    from tformer.cli.commands import app

    # Named tformer also under `python -m tformer`, so --show-completion writes a script for
    # the tformer command.
    app(prog_name="tformer")
