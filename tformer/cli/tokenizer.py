"""``tformer train-tokenizer``: train a subword tokenizer on a data set's text."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import typer
from rich.markup import escape

from tformer.cli.app import app
from tformer.cli.console import console, err_console
from tformer.cli.data_options import TEXT_FIELD
from tformer.cli.options import DATA, SOURCE_FIELD, TARGET_FIELD, existing_file, file_option
from tformer.config import Arch, family_record, one_of
from tformer.data.lm import load_texts
from tformer.data.prepared import is_prepared
from tformer.data.sources import load_text_pairs
from tformer.data.spm import spm_tokenizer
from tformer.data.tokenizer import TOKENIZER_KINDS, check_tokenizer_options, train_tokenizer
from tformer.errors import ConfigError, DataError
from tformer.paths import check_output_file


@app.command("train-tokenizer")
def train_tokenizer_command(
    data: str | None = DATA,
    source_field: str = SOURCE_FIELD,
    target_field: str = TARGET_FIELD,
    kind: str = typer.Option("bpe", "--kind", "--tokenizer-kind", help=" | ".join(TOKENIZER_KINDS)),
    vocab_size: int = typer.Option(
        8000, "--vocab-size", help="The size of the vocabulary to learn."
    ),
    min_frequency: int = typer.Option(
        2, "--min-frequency", help="Merge/keep only pieces seen this often."
    ),
    separate: bool = typer.Option(
        False,
        "--separate-vocab",
        help="Train one tokenizer per side: OUT's name gets .source / .target before .json.",
    ),
    out: Path = typer.Option(
        Path("checkpoints/tokenizer.json"),
        "--out",
        "-o",
        help="The tokenizer file to write (see --separate-vocab for two).",
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an existing --out file (a regular file only)."
    ),
    arch: str = typer.Option(
        "encoder-decoder",
        "--arch",
        help="decoder-only | encoder-only: train on a language model's plain text (--text-field); "
        "encoder-only adds the <mask> token (id 4) its training needs.",
    ),
    text_field: str = TEXT_FIELD,
    sentencepiece: Path | None = typer.Option(
        None,
        "--sentencepiece",
        help="Convert this SentencePiece model (.model / .spm) into --out instead of training: "
        "the same pieces, its ids with the special tokens moved to 0-3.",
        show_default=False,
    ),
) -> None:
    """Train a BPE (default), unigram or WordPiece tokenizer on the training split.

    Special tokens <pad> <bos> <eos> <unk> get ids 0-3; text is NFKC-normalised; digits are
    split one per token. An existing --out is replaced only with --overwrite.
    --sentencepiece converts a SentencePiece model into --out instead of training.
    Example: tformer train-tokenizer --vocab-size 4000 -o tok.json
    """
    file_option(out, "--out")
    if sentencepiece is not None:
        _convert(sentencepiece, out, overwrite, separate, arch)
        return
    check_tokenizer_options(vocab_size, min_frequency)
    paths = _output_paths(out, separate, overwrite)
    sides, count, where = _training_texts(
        data, arch, separate, source_field=source_field, target_field=target_field,
        text_field=text_field,
    )  # fmt: skip
    specials = family_record(arch).tokenizer_specials
    out.parent.mkdir(parents=True, exist_ok=True)
    for suffix, texts in sides.items():
        tok = train_tokenizer(
            texts,
            kind=kind,
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            show_progress=err_console.is_terminal,
            where=where[suffix],
            specials=specials,
        )
        path = paths[suffix]
        tok.save(path)
        console.print(
            f"wrote {escape(str(path))}: {tok.kind}, {tok.vocab_size:,} tokens "
            f"(trained on {count:,} texts)"
        )


def _output_paths(out: Path, separate: bool, overwrite: bool) -> dict[str, Path]:
    """The file of each tokenizer written, keyed by the suffix --separate-vocab gives its name;
    refused where one exists and --overwrite is not given."""
    suffixes = [".source", ".target"] if separate else [""]
    paths = {s: out.with_name(out.stem + s + out.suffix) if s else out for s in suffixes}
    for path in paths.values():
        check_output_file(path, "--out", overwrite=overwrite)
    return paths


def _training_texts(
    data: str | None,
    arch: str,
    separate: bool,
    *,
    source_field: str,
    target_field: str,
    text_field: str,
) -> tuple[dict[str, Iterable[str]], int, dict[str, str]]:
    """The train split's texts for each tokenizer (keyed as :func:`_output_paths`), how many
    each reads, and where they come from (named when the tokenizer cannot be trained)."""
    if is_prepared(data):
        raise DataError(
            f"--data {data}: a prepared folder keeps token ids, not the training text; train "
            "the tokenizer on the text it was prepared from"
        )
    one_of("--arch", arch, Arch)
    if family_record(arch).reads == "documents":
        if separate:
            raise ConfigError(f"--separate-vocab needs two sides; a --arch {arch} model has one")
        docs = load_texts(data, text_field)["train"]
        return {"": docs}, len(docs), {"": f"--data {data or 'bundled text'}, the train split"}
    train = load_text_pairs(data, source_field=source_field, target_field=target_field)["train"]
    # Texts alternate source, target: text 2k+1 is pair k+1's source (k+1's target with
    # --separate-vocab's second tokenizer).
    sides: dict[str, Iterable[str]] = {"": (t for pair in train for t in pair)}
    count = 2 * len(train)
    where = {"": "the train split (texts alternate source, target)"}
    if separate:
        sides = {".source": (s for s, _ in train), ".target": (t for _, t in train)}
        where = {".source": "the train split's sources", ".target": "the train split's targets"}
        count = len(train)
    return sides, count, {k: f"--data {data or 'bundled dates'}, {v}" for k, v in where.items()}


def _convert(model: Path, out: Path, overwrite: bool, separate: bool, arch: str) -> None:
    """--sentencepiece: write ``model`` as a tformer tokenizer.json at ``out``."""
    existing_file(model, "--sentencepiece")
    if separate:
        raise ConfigError("--sentencepiece converts one model; leave out --separate-vocab")
    needs = family_record(arch).tokenizer_specials
    if needs:
        raise ConfigError(
            f"--sentencepiece: a SentencePiece model has no {' '.join(needs)} token, which "
            f"--arch {arch} needs; train a tokenizer for it instead"
        )
    check_output_file(out, "--out", overwrite=overwrite)
    tok = spm_tokenizer(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(out)
    console.print(
        f"wrote {escape(str(out))}: {tok.kind}, {tok.vocab_size:,} tokens "
        f"(from {escape(str(model))})"
    )
