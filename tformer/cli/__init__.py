"""The ``tformer`` command line: a thin layer over the Python API, one module per command.

``app`` (the Typer app and the single error boundary) lives in ``tformer.cli.app``; importing
``tformer.cli.commands`` registers every command on it.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from typing import NoReturn

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
    try:
        app(prog_name="tformer")
    except SystemExit as exit_:
        if is_rank_of_several():
            exit_rank(exit_.code)
        raise
    if is_rank_of_several():
        exit_rank(0)


def is_rank_of_several() -> bool:
    """This process is one rank of a data-parallel job that torchrun started."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def exit_rank(code: object) -> NoReturn:
    """End a data-parallel rank without the interpreter's shutdown.

    The gloo process group's worker threads outlive ``destroy_process_group`` once DDP has run
    (objects of torch's still hold the group), and tearing them down while the interpreter
    finalizes was seen to abort a rank that had finished well ("terminate called without an
    active exception"), failing the whole job. So a rank runs the exit handlers, flushes its
    output and leaves at once; what it wrote is already closed (docs/training.md).
    """
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): printed, status 1, as Python itself does
        print(code, file=sys.stderr)
        status = 1
    # The registered handlers (loggers, temporary files) still run, as in a normal exit.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said
            pass
    os._exit(status)
