"""Every command of the ``tformer`` app: importing a command's module registers it."""

from tformer.cli import (
    ablate,
    average,
    compare,
    compare_runs,
    evaluate,
    export,
    generate,
    info,
    inspect_attention,
    prepare,
    serve,
    tokenizer,
    train,
    verify,
)
from tformer.cli.app import app

__all__ = [
    "ablate",
    "app",
    "average",
    "compare",
    "compare_runs",
    "evaluate",
    "export",
    "generate",
    "info",
    "inspect_attention",
    "prepare",
    "serve",
    "tokenizer",
    "train",
    "verify",
]
