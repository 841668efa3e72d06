"""Options shared by several commands, defined once. Defaults come from the config classes."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import sys
import typing
from collections.abc import Callable, Sequence
from inspect import Parameter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.markup import escape

from tformer import checkpoint as ckpt
from tformer.checkpoint.store import Checkpoint, load_checkpoint
from tformer.cli.console import err_console
from tformer.config import TrainConfig, flag
from tformer.data.tokenizer import DEFAULT_TOKENIZER_SAMPLE, TOKENIZER_KINDS
from tformer.decoding.api import long_inputs_warning, long_target_warning
from tformer.decoding.settings import check_rows
from tformer.device import resolve_device
from tformer.errors import CheckpointError, ConfigError, DataError
from tformer.source_files import split_lines

if TYPE_CHECKING:  # importing the tokenizers library is slow: only commands that need it do
    from tformer.data.tokenizer import Tokenizer
    from tformer.model import TransformerBase

F = TypeVar("F", bound=Callable[..., Any])


def default(cls: type, name: str) -> Any:
    """A dataclass field's default, so ``--help`` always shows what the library uses."""
    return {f.name: f.default for f in dataclasses.fields(cls)}[name]


# The line naming the checkpoint a command chose, said once its own checks have passed.
_chosen_note: list[str] = []


def chosen_checkpoint(ctx: typer.Context, path: Path) -> Path:
    """A run folder -> the checkpoint a command uses (``--checkpoint latest|best``), named in
    one line on stderr when there was a choice: ``--checkpoint`` given, or a ``best/`` that
    holds another step than the latest. A checkpoint folder is used as given; commands
    without ``--checkpoint`` resolve the run folder themselves, as before."""
    _chosen_note.clear()  # a command's note never outlives it
    if "checkpoint_choice" not in {p.name for p in ctx.command.params}:
        return path
    choice = str(ctx.params.get("checkpoint_choice") or "latest")
    if choice not in ckpt.CHOICES:
        raise ConfigError(f"--checkpoint {choice!r} must be one of {', '.join(ckpt.CHOICES)}")
    try:
        folder = ckpt.resolve(path, choice)
    except CheckpointError:
        return path  # the command reports it, after its own flags are checked
    if folder == path:
        return path  # a checkpoint folder
    source = ctx.get_parameter_source("checkpoint_choice")
    given = source is not None and source.name == "COMMANDLINE"
    used = "best" if folder.parent == path / ckpt.BEST else "latest"
    best = ckpt.resolve(path / ckpt.BEST) if ckpt.is_run_dir(path / ckpt.BEST) else None
    if used == "best" or best is None:
        note = "; the run has no best/" if used != choice else ""
    elif ckpt.step_of(best) != ckpt.step_of(folder):
        note = f"; best/ holds step {ckpt.step_of(best)}: --checkpoint best"
    elif not given:
        return folder  # best/ is the same step: nothing to choose between
    else:
        note = "; best/ is the same step"
    # Said once the command's own checks have passed and the checkpoint loads (load_chosen),
    # so a refusal stays one line.
    _chosen_note.append(f"using {escape(str(folder))} ({used}{note})")
    return folder


def load_chosen(path: Path, device: str) -> Checkpoint:
    """Load the checkpoint a command uses, then name it when :func:`chosen_checkpoint` had a
    choice to report."""
    loaded = load_checkpoint(path, resolve_device(device))
    say_chosen()
    return loaded


def say_chosen() -> None:
    """The line :func:`chosen_checkpoint` left for after the command's checks, if any."""
    for note in _chosen_note:
        err_console.print(note, highlight=False, soft_wrap=True)
    _chosen_note.clear()


CHECKPOINT = typer.Argument(
    ...,
    help="A run folder written by `tformer train` (its latest checkpoint, or best/ with "
    "--checkpoint best, where a command has it) or one checkpoint folder.",
    show_default=False,
    callback=chosen_checkpoint,
)
CHECKPOINT_CHOICE = typer.Option(
    "latest",
    "--checkpoint",
    is_eager=True,  # read before the run folder argument is resolved
    help="Which checkpoint of a run folder: latest | best (best/: the best validation so far, "
    "as --best-metric says). The one used is named on stderr.",
)


def field_help(cls: type, name: str) -> str:
    """A config field's help text (written once, in the dataclass)."""
    return str({f.name: f for f in dataclasses.fields(cls)}[name].metadata["help"])


DEVICE = typer.Option(
    default(TrainConfig, "device"), "--device", help=field_help(TrainConfig, "device")
)
QUANTIZE = typer.Option(
    "none",
    "--quantize",
    help="int8: decode with int8 linear layers on the CPU (quantised on load; the checkpoint "
    "stays float32). none: float32.",
)
DATA = typer.Option(None, "--data", help=field_help(TrainConfig, "data"), show_default=False)
SOURCE_FIELD = typer.Option(
    default(TrainConfig, "source_field"),
    "--source-field",
    "--src-lang",
    help=field_help(TrainConfig, "source_field"),
)
TARGET_FIELD = typer.Option(
    default(TrainConfig, "target_field"),
    "--target-field",
    "--tgt-lang",
    help=field_help(TrainConfig, "target_field"),
)
# The options of an automatic tokenizer, shared by `train` and `prepare`.
TOKENIZER_KIND = typer.Option("bpe", "--tokenizer-kind", help=" | ".join(TOKENIZER_KINDS))
VOCAB_SIZE = typer.Option(8000, "--vocab-size", help="For an automatic tokenizer.")
SEPARATE_VOCAB = typer.Option(
    False, "--separate-vocab", help="Separate source and target vocabularies."
)
TOKENIZER_SAMPLE = typer.Option(
    DEFAULT_TOKENIZER_SAMPLE,
    "--tokenizer-sample",
    help="Train an automatic tokenizer on at most this many training pairs, drawn at random "
    "(all of a smaller corpus).",
)


TEXTS = typer.Argument(
    None, help="Inputs (default: --input-file or stdin, one a line).", show_default=False
)
INPUT_FILE = typer.Option(
    None, "--input-file", "-i", help="Inputs, one a line.", show_default=False
)
BATCH_SIZE = typer.Option(64, "--batch-size", help="Rows decoded together.")


def existing_file(path: Path | None, option: str) -> Path | None:
    """Refuse a missing file, or something that is not a regular file, naming the option."""
    if path is not None and not path.is_file():
        if path.is_dir():
            raise ConfigError(f"{option} {path}: is a folder; give a file")
        if path.exists() or path.is_symlink():
            raise ConfigError(
                f"{option} {path}: not a regular file (a FIFO, device, socket or broken link); "
                "give a regular file"
            )
        raise ConfigError(f"{option} {path}: no such file")
    return path


def file_option(path: Path, option: str) -> Path:
    """Refuse a file option (``--save``, a tokenizer's ``--out``) that names a folder or lies
    under a file; missing folders on the way are made when it is written."""
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a folder; give a file name")
    return _not_under_a_file(path, option)


def _not_under_a_file(path: Path, option: str) -> Path:
    """Refuse ``path`` when its nearest existing ancestor is a file (no folder can go there)."""
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{option} {path}: {parent} is a file, so no folder can go there")
            break
    return path


def check_batch_size(batch_size: int) -> None:
    """``--batch-size``: at least 1, at most ``MAX_ROWS`` rows decoded together."""
    if batch_size < 1:
        raise ConfigError(f"--batch-size {batch_size} must be >= 1")
    check_rows("--batch-size", batch_size)


def warn_long_inputs(
    tokenizer: Tokenizer, texts: Sequence[str], max_len: int, *, prompts: bool = False
) -> None:
    """One warning line on stderr when inputs are longer than the model's ``max_len`` tokens.

    Decoding reads only the first ``max_len`` tokens of such an input (see
    ``tformer.decoding.api.decode``); this says so, with the first one cut and its length.
    A decoder-only model's ``prompts`` keep their last ``max_len - 1`` tokens (after <bos>).
    """
    lengths = [len(ids) for ids in tokenizer.encode_batch(list(texts))]
    _warn(long_inputs_warning(lengths, max_len, prompts=prompts))


def warn_long_target(tokenizer: Tokenizer, target: str, max_len: int) -> None:
    """One warning line when a teacher-forced ``--target`` does not fit after ``<bos>``."""
    _warn(long_target_warning(len(tokenizer.encode(target)), max_len))


def _warn(message: str | None) -> None:
    if message is not None:
        err_console.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)


def config_parameter(cls: type, name: str, *aliases: str, annotation: Any = None) -> Parameter:
    """A command parameter for a config field: its flag, default and help come from the field.

    The help text lives once, in the field's ``metadata["help"]``; ``--help`` shows the
    dataclass default. ``Literal`` choices are taken as text (the config names the choices
    when a value is refused).
    """
    spec = {f.name: f for f in dataclasses.fields(cls)}[name]
    if annotation is None:
        annotation = _cli_type(typing.get_type_hints(cls)[name])
    decls = [flag(name), *aliases]
    if annotation is bool:
        decls = [f"{flag(name)}/--no-{name.replace('_', '-')}"]
    option = typer.Option(
        spec.default,
        *decls,
        help=spec.metadata["help"],
        show_default=spec.default is not None,
    )
    return Parameter(name, Parameter.KEYWORD_ONLY, default=option, annotation=annotation)


def _cli_type(hint: Any) -> Any:
    """``Literal[...]`` -> str (and ``X | None`` kept optional), which Typer understands."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Literal:
        return str
    if type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return _cli_type(inner[0]) | None
    return hint


def with_parameters(extra: list[Parameter], *, after: str | None = None) -> Callable[[F], F]:
    """Add ``extra`` keyword parameters to a command that takes them as ``**values``: at the
    end, or right after its parameter ``after`` (``--help`` lists options in this order)."""

    def decorate(command: F) -> F:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.kind is not Parameter.VAR_KEYWORD]
        at = len(own) if after is None else [p.name for p in own].index(after) + 1
        # Typer passes every parameter by keyword, so those after ``extra`` may be keyword-only.
        rest = [p.replace(kind=Parameter.KEYWORD_ONLY) for p in own[at:]]
        parameters = [*own[:at], *extra, *rest]
        command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        return command

    return decorate


def dataclass_parameters(flags: type) -> list[Parameter]:
    """The fields of dataclass ``flags``, each defaulting to its ``typer.Option``, as keyword
    parameters for :func:`with_parameters`: a command's options declared once, with types."""
    hints = typing.get_type_hints(flags)
    return [
        Parameter(field.name, Parameter.KEYWORD_ONLY, default=field.default,
                  annotation=hints[field.name])  # fmt: skip
        for field in dataclasses.fields(flags)
    ]


def in_panels(panels: dict[str, tuple[str, ...]]) -> Callable[[F], F]:
    """Group a command's options in ``--help`` panels: panel title -> parameter names.

    Applied after ``with_parameters``; an option left out of every panel is a ``ConfigError``
    at import time, so a new option cannot fall into the default panel unnoticed.
    """
    where = {name: title for title, names in panels.items() for name in names}
    order = {name: n for n, name in enumerate(where)}  # panels, and options in them, in order

    def decorate(command: F) -> F:
        signature = inspect.signature(command, eval_str=True)
        placed = []
        for parameter in signature.parameters.values():
            info = parameter.default
            if isinstance(info, typer.models.ParameterInfo):
                if parameter.name not in where:
                    raise ConfigError(f"--help: {parameter.name} is in no panel")
                info = copy.copy(info)  # shared options keep their own panel elsewhere
                info.rich_help_panel = where[parameter.name]
                parameter = parameter.replace(default=info, kind=Parameter.KEYWORD_ONLY)
            placed.append(parameter)
        placed.sort(key=lambda p: order.get(p.name, -1))  # ctx first
        command.__signature__ = signature.replace(parameters=placed)  # type: ignore[attr-defined]
        return command

    return decorate


def read_inputs(texts: list[str] | None, input_file: Path | None) -> list[str]:
    """Inputs from arguments, else ``--input-file``, else stdin; one input a line."""
    if texts and input_file is not None:
        raise ConfigError("give inputs as arguments or with --input-file, not both")
    if texts:
        return list(texts)
    if input_file is not None:
        existing_file(input_file, "--input-file")
        return split_lines(_utf8(input_file.read_bytes(), f"--input-file {input_file}"))
    if sys.stdin is None or sys.stdin.isatty():
        raise ConfigError(
            "no input: give TEXT arguments, --input-file FILE, pipe lines in, or use --interactive"
        )
    stream = getattr(sys.stdin, "buffer", None)  # bytes: text mode would also split on "\r"
    if stream is None:
        return split_lines(sys.stdin.read())
    return split_lines(_utf8(stream.read(), "stdin"))


def _utf8(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise DataError(f"{where}: line {line}: not UTF-8 text (byte {error.start})") from None


def apply_quantize(model: TransformerBase, quantize: str) -> None:
    """``--quantize int8``: quantise ``model`` in place (CPU only); ``none`` leaves it."""
    from tformer.fast.int8 import check_quantize, quantize_int8  # loads torch

    device = next(model.parameters()).device
    if check_quantize(quantize, device):
        quantize_int8(model)


MASK_HEADS = typer.Option(
    None,
    "--mask-heads",
    help="Silence these attention heads (output zeroed before W^O): PART.LAYER.HEAD, "
    "comma-separated, PART enc | dec | cross, 0-based, * for every head of a layer "
    "(e.g. enc.0.1,cross.1.*).",
    show_default=False,
)


def apply_mask_heads(model: TransformerBase, mask_heads: str | None) -> list[str]:
    """``--mask-heads``: silence the named heads of ``model`` in place; their names."""
    if mask_heads is None:
        return []
    from tformer.model.heads import mask_heads as silence
    from tformer.model.heads import parse_heads

    heads = parse_heads(mask_heads, model)
    silence(model, heads)
    names = [str(h) for h in heads]
    err_console.print(f"masked {len(names)} head(s): {', '.join(names)}", highlight=False)
    return names
