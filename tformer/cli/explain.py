"""The ``--explain`` table: one row per generated token, showing why it was chosen."""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape
from rich.table import Table

from tformer.analysis.explain import StepExplanation
from tformer.checkpoint.store import Tokenizers
from tformer.data.display import display_token
from tformer.decoding.settings import DecodingConfig, Hypothesis


def _strategy(config: DecodingConfig) -> str:
    if config.beam_size > 1:
        return (
            f"beam search ({config.beam_size} beams): the probabilities are those of the "
            "chosen path; the search ranks whole outputs"
        )
    if config.temperature == 0:
        return "greedy: each step takes the most probable token after the constraints"
    seed = "no seed" if config.seed is None else f"seed {config.seed}"
    return f"sampling ({seed}): each step draws from the last column's distribution"


def explanation_table(
    steps: Sequence[StepExplanation],
    columns: Sequence[str],
    tokenizers: Tokenizers,
    config: DecodingConfig,
    hyp: Hypothesis,
    *,
    title: str = "",
    decoder_only: bool = False,
) -> Table:
    """Columns: step, token, its probability after each processor stage (the model's first),
    the most probable alternatives, and the source tokens attended to most (a decoder-only
    model's: the tokens of <bos> + prompt + output its self-attention row weighted most);
    ``columns`` are the tokens those positions index (``attended_tokens``)."""
    tgt = tokenizers.target
    stages = list(steps[0].probs) if steps else ["model"]
    caption = f"{_strategy(config)}. log p {hyp.logprob:.3f}"
    if config.beam_size > 1:
        caption += f", beam score {hyp.score:.3f}"
    table = Table(
        title=escape(title), title_justify="left", caption=caption, caption_justify="left"
    )
    table.add_column("#", justify="right")
    table.add_column("token", no_wrap=True)
    for stage in stages:
        table.add_column(f"p {stage}", justify="right")
    table.add_column("alternatives (final p)")
    table.add_column(
        "attention to <bos> + prompt + output (last layer)"
        if decoder_only
        else "source attention (last layer)"
    )
    for t, step in enumerate(steps):
        probs = [f"{step.probs[stage]:.3f}" for stage in stages]
        alternatives = ", ".join(
            f"{escape(display_token(tgt, i))} {p:.3f}" for i, p in step.alternatives if p > 0
        )
        source = ", ".join(f"{escape(columns[j])} {w:.2f}" for j, w in step.source)
        table.add_row(str(t), escape(display_token(tgt, step.token)), *probs, alternatives, source)
    return table
