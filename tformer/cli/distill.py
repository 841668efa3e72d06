"""``tformer distill``: translate a corpus's training sources with a teacher into a new corpus
folder (sequence-level knowledge distillation), resumable after an interruption."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from tformer.checkpoint import Tokenizers
from tformer.cli.app import app
from tformer.cli.console import console, err_console
from tformer.cli.data_options import LIMIT, check_limit, checkpoint_family, data_of
from tformer.cli.decoding_options import decoding_config, decoding_parameters
from tformer.cli.ensemble_options import ENSEMBLE, with_members
from tformer.cli.options import (
    CHECKPOINT,
    CHECKPOINT_CHOICE,
    DATA,
    DEVICE,
    SOURCE_FIELD,
    TARGET_FIELD,
    load_chosen,
    warn_long_inputs,
    with_parameters,
)
from tformer.cli.progress import clock
from tformer.data.distilled import PartialCorpus, check_out, partial_folder
from tformer.data.sources import TextPair
from tformer.decoding.distill import teacher_outputs
from tformer.decoding.ensemble import Decodable
from tformer.decoding.settings import DecodingConfig
from tformer.errors import ConfigError, DataError, TrainingInterrupted
from tformer.training.signals import StopOnSignal, exit_code

# The decoding flags a distillation records and a resumed one must repeat; --beam-size has a
# default of its own (the teacher's beam output is what the student learns from).
RECORDED_FLAGS = (
    "length_penalty", "n_best", "min_new_tokens", "max_new_tokens", "repetition_penalty",
    "no_repeat_ngram_size",
)  # fmt: skip


@dataclass(frozen=True)
class Teacher:
    """What the targets come from: a checkpoint's model, or the ensemble of it and the
    --ensemble members (decoded as one model), with the first checkpoint's tokenizers."""

    model: Decodable
    tokenizers: Tokenizers
    paths: list[str]  # every checkpoint folder it decodes with, the first one first
    max_len: int


def load_teacher(checkpoint: Path, members: list[Path] | None, device: str) -> Teacher:
    """The one place a teacher is loaded: one checkpoint, or an ensemble with ``members``."""
    checkpoint_family(checkpoint, "distill", "reads_source")
    loaded = load_chosen(checkpoint, device)
    model, paths = with_members(loaded, members, "distill", device=device, quantize="none")
    absolute = [str(Path(path).absolute()) for path in paths]
    return Teacher(model, loaded.tokenizers, absolute, loaded.model_config.max_len)


@app.command("distill")
@with_parameters(decoding_parameters(*RECORDED_FLAGS), after="beam_size")
def distill_command(
    checkpoint: Path = CHECKPOINT,
    checkpoint_choice: str = CHECKPOINT_CHOICE,
    ensemble: list[Path] | None = ENSEMBLE,
    data: str | None = DATA,
    out: Path = typer.Option(..., "--out", "-o", help="The distilled corpus folder to write."),
    source_field: str = SOURCE_FIELD,
    target_field: str = TARGET_FIELD,
    split: str = typer.Option(
        "train", "--split", help="The split whose sources are translated; the others are "
        "copied pair for pair."
    ),
    limit: int | None = LIMIT,
    beam_size: int = typer.Option(
        4, "--beam-size", "-b", help="Beam search with this many beams; 1 = greedy."
    ),
    max_tokens: int = typer.Option(
        4096, "--max-tokens", help="Padded source tokens, times the beams, decoded together."
    ),
    chunk_size: int = typer.Option(
        256, "--chunk-size", help="Sources translated between two saves of the progress."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the interrupted distillation into --out."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an earlier distillation at --out (or its partial "
        "folder when not resuming)."
    ),
    device: str = DEVICE,
    **values: Any,
) -> None:
    """Translate a corpus's training sources with a teacher into a corpus for a student.

    Writes --out/train.jsonl with the teacher's outputs as targets (--n-best lines a source),
    the other splits unchanged, and tformer-distill.json (teacher, settings, counts). Progress
    is saved after every --chunk-size sources: after Ctrl-C or a crash, the same command with
    --resume goes on where it stopped. Train a student with: tformer train --data OUT
    --preset student.

    Example: tformer distill checkpoints/dates --out checkpoints/dates-distilled --beam-size 4
    """
    config = _check_options(values, beam_size, max_tokens, chunk_size, limit)
    check_out(out, overwrite=overwrite)  # before any work: a refused folder costs nothing
    data, source_field, target_field, _ = data_of(checkpoint, data, source_field, target_field)
    splits = _splits(data, source_field, target_field)
    if split not in splits:
        raise DataError(f"--split {split}: not in the data (splits: {', '.join(splits)})")
    sources = [s for s, _ in splits[split]][:limit]
    teacher = load_teacher(checkpoint, ensemble, device)
    settings = {
        "teacher": teacher.paths[0], **({"ensemble": teacher.paths[1:]} if ensemble else {}),
        "data": data, "split": split,
        "source_field": source_field, "target_field": target_field, "limit": limit,
        "sources_sha256": _digest(sources), "beam_size": beam_size,
        **{name: getattr(config, name) for name in RECORDED_FLAGS},
    }  # fmt: skip
    corpus = PartialCorpus.start(out, settings, len(sources), resume=resume, overwrite=overwrite)
    try:
        warn_long_inputs(teacher.tokenizers.source, sources, teacher.max_len)
        _translate(teacher, corpus, sources, config, max_tokens=max_tokens, chunk=chunk_size)
    finally:
        corpus.close()
    others = {name: list(pairs) for name, pairs in splits.items() if name != split}
    counts = corpus.finish(others, overwrite=overwrite, **settings)
    shown = ", ".join(f"{name} {n:,}" for name, n in counts.items())
    console.print(
        f"wrote {escape(str(out))}: {shown} pairs; train a student with: tformer train "
        f"--data {escape(str(out))} --preset student"
    )


def _check_options(
    values: dict[str, Any], beam_size: int, max_tokens: int, chunk_size: int, limit: int | None
) -> DecodingConfig:
    """The decoding settings, and every option checked before anything is read."""
    check_limit(limit)
    for option, value in (("--max-tokens", max_tokens), ("--chunk-size", chunk_size)):
        if value < 1:
            raise ConfigError(f"{option} {value} must be >= 1")
    return decoding_config({**values, "beam_size": beam_size})


def _splits(data: str | None, source_field: str, target_field: str) -> dict[str, list[TextPair]]:
    from tformer.data.prepare import text_splits  # reads data: only commands that need it

    return {
        name: list(pairs)
        for name, pairs in text_splits(
            data, source_field=source_field, target_field=target_field
        ).items()
    }


def _digest(sources: Sequence[str]) -> str:
    """The SHA-256 of the sources, so a resumed run is known to read the same ones."""
    digest = hashlib.sha256()
    for text in sources:
        digest.update(text.encode("utf-8", "surrogatepass") + b"\n")
    return digest.hexdigest()


def _translate(
    teacher: Teacher,
    corpus: PartialCorpus,
    sources: Sequence[str],
    config: DecodingConfig,
    *,
    max_tokens: int,
    chunk: int,
) -> None:
    """Translate the sources not done yet a chunk at a time, saving after each; SIGINT or
    SIGTERM stops after the chunk in hand (a second one at once)."""
    progress = corpus.progress
    total, start, started = progress.total, progress.done, time.perf_counter()
    if start:
        err_console.print(f"resuming after {start:,} of {total:,} sources")
    with StopOnSignal() as signals:
        while progress.done < total:
            texts = sources[progress.done : progress.done + chunk]
            outputs = teacher_outputs(
                teacher.model, teacher.tokenizers, texts, config, max_tokens=max_tokens
            )
            found = zip(texts, outputs, strict=True)
            pairs = [(text, target) for text, targets in found for target in targets]
            corpus.append(pairs, len(texts))
            _report(progress.done, total, progress.done - start, time.perf_counter() - started)
            if signals.received is not None and progress.done < total:
                raise TrainingInterrupted(
                    f"stopped after {progress.done:,} of {total:,} sources (kept in "
                    f"{partial_folder(corpus.out)}); run the same command with --resume to go on",
                    exit_code(signals.received),
                )


def _report(done: int, total: int, translated: int, elapsed: float) -> None:
    """One progress line: sources done, sentences per second in this run, time left."""
    rate = translated / max(elapsed, 1e-9)
    eta = clock((total - done) / rate) if rate > 0 else "-"
    err_console.print(
        f"distill {done:,}/{total:,} sources ({done / total:.1%}), {rate:,.1f} sentences/s, "
        f"{clock(elapsed)} elapsed, eta {eta}",
        highlight=False,
        soft_wrap=True,
    )
