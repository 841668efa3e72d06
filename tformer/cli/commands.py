"""Every command of the ``tformer`` app: importing a command's module registers it."""

from tformer.cli import (
    ablate,
    align,
    average,
    compare,
    compare_runs,
    compare_systems,
    distill,
    evaluate,
    export,
    fill_mask,
    filter_corpus,
    generate,
    import_model,
    info,
    inspect_attention,
    prepare,
    score,
    serve,
    tokenizer,
    train,
    verify,
)
from tformer.cli.app import app, check_command_text

check_command_text(app)

__all__ = [
    "ablate",
    "align",
    "app",
    "average",
    "compare",
    "compare_runs",
    "compare_systems",
    "distill",
    "evaluate",
    "export",
    "fill_mask",
    "filter_corpus",
    "generate",
    "import_model",
    "info",
    "inspect_attention",
    "prepare",
    "score",
    "serve",
    "tokenizer",
    "train",
    "verify",
]
