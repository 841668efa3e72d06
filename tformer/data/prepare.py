"""``prepare``: the job behind ``tformer prepare``, tokenising a corpus ahead of training.

Reads the data as ``train`` would, trains a tokenizer on a sample of the training pairs (or
takes the one given), then writes every split into a prepared folder (``tformer.data.prepared``)
that is renamed into place only when complete. ``tformer train --data DIR`` then starts at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tformer.data.columns import sample_rows
from tformer.data.fingerprint import FINGERPRINTED, fingerprint_of, pairs_sha256
from tformer.data.pairs import no_training_pairs
from tformer.data.parallel import Pairs
from tformer.data.prepared import (
    PREPARED,
    Prepared,
    Progress,
    is_prepared,
    open_prepared,
    prepared_manifest,
    tokenizer_files,
)
from tformer.data.prepared_write import PrepareOptions, write_split
from tformer.data.sources import SPLITS, TextPair, bundled_data_dir, load_text_pairs
from tformer.data.spm import load_tokenizer
from tformer.data.streaming import stream_splits
from tformer.data.tokenizer import DEFAULT_TOKENIZER_SAMPLE, Tokenizer, train_tokenizer
from tformer.errors import CheckpointError, ConfigError, DataError
from tformer.folders import written_files
from tformer.paths import file_sha256, inside

CACHE_ENV = "TFORMER_CACHE"


def default_cache_dir() -> Path:
    """``$TFORMER_CACHE``, else ``$XDG_CACHE_HOME/tformer``, else ``~/.cache/tformer``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tformer"


def tokenizers_for(
    pairs: Sequence[TextPair],
    *,
    kind: str = "bpe",
    vocab_size: int = 8000,
    shared: bool = True,
    sample: int = DEFAULT_TOKENIZER_SAMPLE,
    seed: int = 0,
    specials: tuple[str, ...] = (),
) -> tuple[Tokenizer, Tokenizer]:
    """(source, target) tokenizers trained on ``sample`` pairs drawn from ``pairs`` (the same
    object twice when ``shared``), with ``specials`` after tformer's own."""
    if sample < 1:
        raise ConfigError(f"--tokenizer-sample {sample} must be at least 1 pair")
    chosen = sample_rows(pairs, sample, seed)
    if shared:
        tok = train_tokenizer(
            (t for pair in chosen for t in pair),
            kind=kind,
            vocab_size=vocab_size,
            specials=specials,
        )
        return tok, tok
    source = train_tokenizer((s for s, _ in chosen), kind=kind, vocab_size=vocab_size)
    target = train_tokenizer((t for _, t in chosen), kind=kind, vocab_size=vocab_size)
    return source, target


def prepare(
    data: str | None,
    out: Path,
    *,
    tokenizer: Path | None = None,
    tokenizer_kind: str = "bpe",
    vocab_size: int = 8000,
    shared_vocab: bool = True,
    tokenizer_sample: int = DEFAULT_TOKENIZER_SAMPLE,
    max_len: int = 256,
    strict: bool = False,
    overwrite: bool = False,
    source_field: str = "source",
    target_field: str = "target",
    progress: Progress | None = None,
    num_proc: int | None = None,
    streaming: bool = False,
) -> Prepared:
    """Tokenise ``data`` (as ``train --data`` reads it) into the prepared folder ``out``.

    Args:
        tokenizer: a tokenizer.json or SentencePiece model to use; else one is trained on
            ``tokenizer_sample`` training pairs as ``tokenizer_kind``, ``vocab_size`` and
            ``shared_vocab`` say.
        max_len: pairs whose source, or target + <eos>, is longer are dropped (refused when
            ``strict``), as training drops them; train with the same ``--max-len`` or less.
        overwrite: replace an earlier prepared folder at ``out`` (nothing else is replaced).
        progress: called with (split, pairs done, pairs in split) as each slice is written.
        num_proc: worker processes that tokenise side by side.
        streaming: read ``data`` as a stream (``tformer.data.streaming``) rather than load it;
            a tokenizer is then trained on the first ``tokenizer_sample`` training pairs.

    Raises:
        ConfigError: ``out`` cannot be written, or bad options.
        DataError: the data cannot be read, or no training pair fits ``max_len``.
    """
    if max_len < 2:
        raise ConfigError(f"--max-len {max_len} must be at least 2 (a token and <eos>)")
    _check_out(data, out, overwrite)
    source = TextSource(data, source_field, target_field)
    spec = TokenizerRequest(tokenizer_kind, vocab_size, shared_vocab, tokenizer_sample)
    loaded = load_tokenizer(tokenizer) if tokenizer is not None else None
    given = (loaded, loaded) if loaded is not None else None
    texts, tokenizers = _texts_and_tokenizers(source, streaming, given, spec)
    options = PrepareOptions(max_len, strict, progress=progress, num_proc=num_proc)
    with PREPARED.staging(out, overwrite=overwrite) as tmp:
        write_prepared(tmp, texts, tokenizers, source, options, None if given else spec)
    return open_prepared(out, check_hashes=False)


@dataclass(frozen=True)
class TokenizerRequest:
    """How to train a tokenizer when none is given."""

    kind: str = "bpe"
    vocab_size: int = 8000
    shared: bool = True
    sample: int = DEFAULT_TOKENIZER_SAMPLE


def _texts_and_tokenizers(
    source: TextSource,
    streaming: bool,
    given: tuple[Tokenizer, Tokenizer] | None,
    spec: TokenizerRequest,
) -> tuple[Mapping[str, Pairs], tuple[Tokenizer, Tokenizer]]:
    """The splits (loaded, or streams) and the tokenizers: ``given``, or trained as ``spec``
    says on a random sample of the training pairs (the first ones of a stream)."""
    fields = {"source_field": source.source_field, "target_field": source.target_field}
    if not streaming:
        texts: Mapping[str, Pairs] = load_text_pairs(source.data, **fields)
        train = texts["train"]
        assert isinstance(train, Sequence)
    else:
        if source.data is None:
            raise ConfigError("--streaming reads --data as a stream; give --data")
        streams = stream_splits(source.data, source.source_field, source.target_field)
        head, streams["train"] = _head(streams["train"], spec.sample if given is None else 0)
        texts, train = streams, head
    if given is not None:
        return texts, given
    made = tokenizers_for(
        train, kind=spec.kind, vocab_size=spec.vocab_size, shared=spec.shared, sample=spec.sample
    )
    return texts, made


def _head(
    stream: Iterator[list[TextPair]], n: int
) -> tuple[list[TextPair], Iterator[list[TextPair]]]:
    """The first ``n`` pairs of ``stream``, and the whole stream again (those included)."""
    read: list[list[TextPair]] = []
    count = 0
    while count < n and (chunk := next(stream, None)) is not None:
        read.append(chunk)
        count += len(chunk)
    head = [pair for chunk in read for pair in chunk][:n]
    return head, itertools.chain(read, stream)


@dataclass(frozen=True)
class TextSource:
    """Where the text came from, as ``--data``, ``--source-field`` and ``--target-field``."""

    data: str | None
    source_field: str = "source"
    target_field: str = "target"


def write_prepared(
    folder: Path,
    texts: Mapping[str, Pairs],
    tokenizers: tuple[Tokenizer, Tokenizer],
    source: TextSource,
    options: PrepareOptions,
    request: TokenizerRequest | None = None,
) -> None:
    """Write every split of ``texts``, the tokenizer(s) and the manifest into ``folder``
    (with ``request``, how the tokenizers were trained, when they were)."""
    files = tokenizer_files(tokenizers)
    tokenizers[0].save(folder / files["source"])
    if tokenizers[1] is not tokenizers[0]:
        tokenizers[1].save(folder / files["target"])
    where = f"--data {source.data or bundled_data_dir()}"
    splits, hashes = {}, {}
    for name in SPLITS:
        if name not in texts:
            continue
        named = dataclasses.replace(options, where=f"{where} ({name} split)")
        splits[name], written = write_split(folder, name, texts[name], tokenizers, named)
        hashes.update(written)
        entry = splits[name]
        if name == "train" and not entry["pairs"]:
            raise no_training_pairs(
                where, entry["dropped"], entry["dropped_empty"], options.max_len
            )
    text_hashes = {
        s: (splits[s]["text_pairs"], splits[s]["text_sha256"]) for s in FINGERPRINTED if s in splits
    }
    fields = {"source_field": source.source_field, "target_field": source.target_field}
    for name in set(files.values()):
        hashes[name] = _entry(folder / name)
    manifest = prepared_manifest(
        data=source.data,
        fingerprint=fingerprint_of(source.data, text_hashes, **fields),
        max_len=options.max_len,
        tokenizers=tokenizers,
        splits=splits,
        hashes=hashes,
        fields={"source": source.source_field, "target": source.target_field},
        tokenizer_request=None if request is None else dataclasses.asdict(request),
    )
    (folder / PREPARED.marker).write_text(
        PREPARED.marker_text(written_files(folder), **manifest), encoding="utf-8"
    )


def cached_prepared(
    cache_dir: Path,
    texts: Mapping[str, Sequence[TextPair]],
    tokenizers: tuple[Tokenizer, Tokenizer],
    source: TextSource,
    options: PrepareOptions,
    known: Mapping[str, tuple[int, str]] | None = None,
) -> Prepared:
    """``texts`` prepared once into ``cache_dir``, in a folder named by a hash of every text,
    the tokenizers and ``max_len``; a later run with the same maps it at once.

    Args:
        known: (pairs, SHA-256) of splits already hashed (the run's data fingerprint).
    """
    hashes = {name: (known or {}).get(name) or (0, pairs_sha256(pairs)) for name, pairs in
              texts.items()}  # fmt: skip
    key = _key(
        texts={name: sha for name, (_, sha) in sorted(hashes.items())},
        tokenizers=[t.sha256() for t in tokenizers],
        max_len=options.max_len,
    )
    folder = cache_dir / f"prepared-{key}"
    found = _open_cached(folder)
    if found is not None:
        return found
    return _write_cached(folder, texts, tokenizers, source, options)


def streamed_prepared(
    cache_dir: Path,
    source: TextSource,
    options: PrepareOptions,
    *,
    given: tuple[Tokenizer, Tokenizer] | None = None,
    spec: TokenizerRequest | None = None,
) -> Prepared:
    """``source`` read as a stream and prepared once into ``cache_dir`` with the ``given``
    tokenizers (those of a checkpoint continued), or with tokenizers trained as ``spec`` says
    on the first pairs. A later run with the same finds the folder without reading the stream
    (a pointer file names the folder a trained tokenizer went into)."""
    spec = spec or TokenizerRequest()
    stream = {"stream": source.data, "fields": [source.source_field, source.target_field],
              "max_len": options.max_len}  # fmt: skip

    def folder_for(tokenizers: tuple[Tokenizer, Tokenizer]) -> Path:
        return cache_dir / f"prepared-{_key(**stream, tokenizers=[t.sha256() for t in tokenizers])}"

    pointer = cache_dir / f"stream-{_key(**stream, trained=dataclasses.asdict(spec))}.json"
    if given is not None:
        found = _open_cached(folder_for(given))
    else:
        named = _read_pointer(pointer)
        found = _open_cached(cache_dir / named) if named else None
    if found is not None:
        return found
    texts, tokenizers = _texts_and_tokenizers(source, True, given, spec)
    folder = folder_for(tokenizers)
    prepared = _write_cached(folder, texts, tokenizers, source, options)
    if given is None:
        tmp = pointer.with_name(f".{pointer.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"folder": folder.name}) + "\n", encoding="utf-8")
        os.replace(tmp, pointer)
    return prepared


def _key(**fields: object) -> str:
    data = json.dumps({"format": PREPARED.version, **fields}, sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:32]


def _read_pointer(pointer: Path) -> str | None:
    """The cache folder a stream pointer names, or None (absent, damaged or not a plain name)."""
    try:
        name = json.loads(pointer.read_text(encoding="utf-8"))["folder"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    plain = isinstance(name, str) and name.startswith("prepared-") and "/" not in name
    return name if plain and ".." not in name else None


def _open_cached(folder: Path) -> Prepared | None:
    """The cached prepared folder, or None when absent or damaged (then removed)."""
    if not is_prepared(folder):
        return None
    try:
        return open_prepared(folder, check_hashes=False)
    except (DataError, CheckpointError):
        shutil.rmtree(folder, ignore_errors=True)  # damaged: made again by the caller
        return None


def _write_cached(
    folder: Path,
    texts: Mapping[str, Pairs],
    tokenizers: tuple[Tokenizer, Tokenizer],
    source: TextSource,
    options: PrepareOptions,
) -> Prepared:
    """Write ``folder`` through a temporary sibling; a run that made it meanwhile wins."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    try:
        write_prepared(tmp, texts, tokenizers, source, options)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not is_prepared(folder):  # another run made it meanwhile: use theirs
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return open_prepared(folder, check_hashes=False)


def _entry(path: Path) -> dict[str, object]:
    return {"size": path.stat().st_size, "sha256": file_sha256(path)}


def _check_out(data: str | None, out: Path, overwrite: bool) -> None:
    if is_prepared(data):
        raise DataError(f"--data {data}: is already a prepared folder; train on it directly")
    PREPARED.check_out(out)
    if (
        data is not None
        and Path(data).expanduser().is_dir()
        and (inside(Path(data).expanduser(), out) or inside(out, Path(data).expanduser()))
    ):
        raise ConfigError(
            f"--out {out}: lies inside the data folder {data} (or holds it); choose a folder "
            "outside it"
        )
    PREPARED.check_replace(out, overwrite=overwrite)


def text_splits(
    data: str | None, *, source_field: str = "source", target_field: str = "target"
) -> dict[str, Sequence[TextPair]]:
    """The text of each split of ``data``: as loaded from files or the hub, or for a prepared
    folder (checked first) the validation and test pairs it kept (its training text is not
    stored)."""
    if is_prepared(data):
        assert data is not None
        prepared = open_prepared(data)
        return {name: prepared.texts(name) for name in prepared.splits if name != "train"}
    loaded = load_text_pairs(data, source_field=source_field, target_field=target_field)
    return dict(loaded)
