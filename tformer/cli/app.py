"""The Typer app and the command line's single error boundary.

``TformerGroup.invoke`` turns a ``TformerError`` into one red line on stderr and its exit
code, with no traceback unless ``--debug`` is given. Commands register themselves on ``app``
from their own modules; ``tformer.cli.commands`` imports them all.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterable
from typing import Any, NoReturn

import typer
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from tformer.cli.console import err_console
from tformer.config import check_text
from tformer.errors import ConfigError, OutOfMemoryError, TformerError, TrainingInterrupted
from tformer.version import __version__

# What to lower after running out of memory, per command (training names its own batch size).
MEMORY_FLAGS = {
    "generate": "--batch-size, --beam-size or --num-samples",
    "compare": "--batch-size or --beam-size",
    "evaluate": "--batch-size or --beam-size (or --limit)",
    "train": "--max-tokens (with --accumulate to keep the batch size)",
    "inspect-attention": "the input's length",
    "score": "the pair's length (or --limit)",
    "average": "the number of checkpoints averaged",
    "align": "--max-tokens (or --limit)",
}


def out_of_memory(error: BaseException, command: str | None) -> OutOfMemoryError | None:
    """The one-line refusal for an out-of-memory ``error``, or None when it is something else.

    torch raises ``torch.OutOfMemoryError`` on a GPU and a RuntimeError ("not enough memory",
    "can't allocate memory") when a CPU allocation fails; Python raises MemoryError.
    """
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    text = str(error)
    is_oom = isinstance(error, MemoryError) or (
        oom_type is not None and isinstance(error, oom_type)
    )
    if isinstance(error, RuntimeError) and (
        "not enough memory" in text
        or "out of memory" in text.lower()
        or "can't allocate memory" in text
    ):
        is_oom = True
    if not is_oom:
        return None
    lower = MEMORY_FLAGS.get(command or "", "the size of the work asked for")
    name = f"tformer {command}" if command else "tformer"
    detail = text.strip().splitlines()[0][:160] if text.strip() else type(error).__name__
    return OutOfMemoryError(f"{name} ran out of memory ({detail}); lower {lower}")


def too_deep(error: BaseException) -> TformerError | None:
    """The one-line refusal for input nested deeper than Python can read (a hostile JSON or
    YAML file no reader named itself), or None for any other error."""
    if not isinstance(error, RecursionError):
        return None
    return TformerError(
        "an input file is nested too deeply to read (damaged or hostile); check the files "
        "this command was given"
    )


def os_error(error: OSError) -> TformerError:
    """A file-system error that no command turned into a message of its own, in one line."""
    where = f"{error.filename}: " if error.filename is not None else ""
    reason = error.strerror or str(error) or type(error).__name__
    message = TformerError(f"{where}{reason}; check the path, its permissions and free space")
    return message


def quiet_libraries() -> None:
    """Keep the libraries' own log lines and warnings (datasets, the hub client, tokenizers)
    off stderr: the CLI reports what matters in its own line."""
    os.environ.setdefault("HF_DATASETS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in ("datasets", "huggingface_hub", "fsspec", "filelock", "urllib3"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for module in ("datasets", "huggingface_hub", "pyarrow", "multiprocess"):
        warnings.filterwarnings("ignore", module=module)


BROKEN_PIPE_EXIT = 1  # as rich exits when its console meets a closed pipe


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def tidy_help(params: Iterable[Any]) -> None:
    """Show a switch as a switch (``--overwrite``, not ``--overwrite <bool>``) and keep help
    text literal: Rich would read ``pip install "tformer[tensorboard]"`` as a markup tag."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""  # typer shows the metavar, when set, in place of <bool>
        if getattr(param, "help", None) and not getattr(param, "_tidy", False):
            param.help = escape(param.help)
            param._tidy = True  # escaped once, however often the app is built


def reflow(text: str) -> str:
    """``text`` with each paragraph's lines joined, so the terminal wraps them evenly (a
    docstring's own line breaks wrapped raggedly); indented paragraphs (examples) stay."""
    paragraphs = text.strip().split("\n\n")
    return "\n\n".join(
        paragraph
        if any(line[:1].isspace() for line in paragraph.splitlines())
        else " ".join(paragraph.split())
        for paragraph in paragraphs
    )


def _tidy_command(command: Any) -> None:
    """``tidy_help`` on every option of ``command`` when it is asked for them, so those typer
    and click add late (``--help``, ``--install-completion``) are tidied too; the command's
    own text is kept literal the same way."""
    for name in ("help", "short_help", "epilog"):
        text = getattr(command, name, None)
        if text and not getattr(command, f"_tidy_{name}", False):
            setattr(command, name, escape(reflow(text)))
            setattr(command, f"_tidy_{name}", True)
    get_params = command.get_params

    def tidied(ctx: Any) -> Any:
        params = get_params(ctx)
        tidy_help(params)
        return params

    command.get_params = tidied


class TformerGroup(TyperGroup):
    """Turns user-facing errors into one clear line and an exit code."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _tidy_command(self)
        for command in self.commands.values():
            _tidy_command(command)

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
            self._fail(ctx, error)
        except KeyboardInterrupt as error:
            err_console.print("[yellow]interrupted[/]")
            ctx.exit(getattr(error, "exit_code", 130))
        except BrokenPipeError:
            # The reader went away (`tformer generate ... | head`): stop quietly, as `cat` does.
            _silence_stdout()
            ctx.exit(BROKEN_PIPE_EXIT)
        except (MemoryError, RuntimeError, OSError) as error:
            # The safety net: out of memory anywhere (not only in training), and file-system
            # errors no command named itself, still end in one line and an exit code.
            found = (
                os_error(error)
                if isinstance(error, OSError)
                else too_deep(error) or out_of_memory(error, ctx.invoked_subcommand)
            )
            if found is None or (ctx.obj or {}).get("debug"):
                raise
            self._fail(ctx, found)

    def _fail(self, ctx: typer.Context, error: TformerError) -> NoReturn:
        err_console.print(f"[bold red]error:[/] {escape(str(error))}", soft_wrap=True)
        ctx.exit(error.exit_code)


class TformerCommand(TyperCommand):
    """A command whose text values are checked before it runs: an argument that was not
    UTF-8 (Python makes lone surrogates of such bytes) is refused in one line naming it.

    Paths are left alone: a file name need not be UTF-8 on POSIX systems.
    """

    def invoke(self, ctx: typer.Context) -> object:  # type: ignore[override]
        for param in self.params:
            value = ctx.params.get(param.name or "")
            values = value if isinstance(value, (list, tuple)) else [value]
            texts = [v for v in values if isinstance(v, str)]
            for number, text in enumerate(texts, start=1):
                name = param.opts[0] if param.param_type_name == "option" else param.name
                where = name if len(texts) == 1 else f"{name} {number}"
                check_text(text, f"{where}".upper() if name == param.name else where, ConfigError)
        return super().invoke(ctx)


def check_command_text(typer_app: typer.Typer) -> None:
    """Make every command registered on ``typer_app`` a ``TformerCommand``."""
    for info in typer_app.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = TformerCommand


app = typer.Typer(
    cls=TformerGroup,
    name="tformer",
    help="Train, sample and inspect an encoder-decoder Transformer.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (docs/README.md)
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
    if not debug:
        quiet_libraries()
