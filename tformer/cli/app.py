"""The Typer app and the command line's single error boundary.

``TformerGroup.invoke`` turns a ``TformerError`` into one red line on stderr and its exit
code, with no traceback unless ``--debug`` is given. Commands register themselves on ``app``
from their own modules; ``tformer.cli.commands`` imports them all.
"""

from __future__ import annotations

import typer
from rich.markup import escape
from typer.core import TyperGroup

from tformer.cli.console import err_console
from tformer.errors import TformerError, TrainingInterrupted
from tformer.version import __version__


class TformerGroup(TyperGroup):
    """Turns user-facing errors into one clear line and an exit code."""

    # typer hands every command its own Context subclass, which is what is annotated here.
    def invoke(self, ctx: typer.Context) -> object:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except TrainingInterrupted as error:  # not a failure: stopped on request, resumable
            err_console.print(f"[yellow]{escape(str(error))}[/]", soft_wrap=True)
            ctx.exit(error.exit_code)
        except TformerError as error:
            if (ctx.obj or {}).get("debug"):
                raise
            err_console.print(f"[bold red]error:[/] {escape(str(error))}", soft_wrap=True)
            ctx.exit(error.exit_code)
        except KeyboardInterrupt as error:
            err_console.print("[yellow]interrupted[/]")
            ctx.exit(getattr(error, "exit_code", 130))


app = typer.Typer(
    cls=TformerGroup,
    name="tformer",
    help="Train, sample and inspect an encoder-decoder Transformer.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tformer {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks for errors."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    ctx.obj = {"debug": debug}
