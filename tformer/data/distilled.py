"""A distilled corpus folder, written chunk by chunk so an interrupted run resumes.

While sources are translated, the teacher's pairs go to ``.OUT.distill-partial/train.jsonl``
beside ``OUT``, appended a chunk at a time; after each chunk the file is flushed to disk and
``progress.json`` (the settings, sources done, and the length of the file they fill) is
replaced atomically. A run killed at any point leaves a progress record that names only whole
chunks on disk: ``--resume`` cuts the file back to that length and goes on from the next
source, so no pair is written twice and none is lost. When every source is done, ``OUT`` is
written whole through the shared folder writer (``MarkedFolder.staging``): train.jsonl, the
corpus's other splits pair for pair, and the marker ``tformer-distill.json``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tformer.checkpoint.files import write_text_atomic
from tformer.checkpoint.lock import writer_lock
from tformer.data.dates import write_jsonl
from tformer.errors import CheckpointError, ConfigError
from tformer.folders import MarkedFolder
from tformer.paths import json_loads, read_small_text

DISTILLED = MarkedFolder(
    marker="tformer-distill.json",
    format="tformer-distill",
    version=1,
    noun="distillation",
    command="`tformer distill`",
    option="--out",
)
PROGRESS = "progress.json"
TRAIN = "train.jsonl"
_PROGRESS_FORMAT = "tformer-distill-progress"


def check_out(out: Path, *, overwrite: bool) -> None:
    """Refuse an ``out`` that cannot take a distillation, before any work (checks only)."""
    DISTILLED.check_out(out)
    DISTILLED.check_replace(out, overwrite=overwrite)


def partial_folder(out: Path) -> Path:
    """Where the pairs of an unfinished distillation into ``out`` wait: beside it, hidden."""
    out = out.absolute()
    return out.parent / f".{out.name}.distill-partial"


@dataclass
class Progress:
    """What a partial folder holds: its settings, and how far the finished chunks reach."""

    settings: dict[str, Any]
    total: int  # sources to translate
    done: int = 0  # sources translated, in input order
    lines: int = 0  # pairs written (n-best: several a source)
    size: int = 0  # bytes of train.jsonl that the finished chunks fill


def _read_progress(folder: Path) -> Progress | None:
    text = read_small_text(folder / PROGRESS, limit=1 << 20)
    try:
        record = json_loads(text) if text is not None else None
        if not isinstance(record, dict) or record.pop("format", None) != _PROGRESS_FORMAT:
            return None
        return Progress(**record)
    except (json.JSONDecodeError, TypeError):
        return None


def _changed(saved: Mapping[str, Any], settings: Mapping[str, Any]) -> str | None:
    """The first setting that differs from the saved ones, as a message; None when equal."""
    for name in dict.fromkeys([*settings, *saved]):
        if saved.get(name) != settings.get(name):
            label = "--" + name.replace("_", "-") if name in _FLAGGED else name
            return f"{label} {saved.get(name)!r}, not {settings.get(name)!r}"
    return None


# Settings that are options of `tformer distill`; the others (teacher, sources) are named as is.
_FLAGGED = {
    "data", "split", "source_field", "target_field", "limit", "beam_size", "n_best",
    "length_penalty", "max_new_tokens", "min_new_tokens", "repetition_penalty",
    "no_repeat_ngram_size",
}  # fmt: skip


class PartialCorpus:
    """The training pairs of one distillation into ``out``, appended a chunk at a time while
    holding ``out``'s writer lock (``start`` takes it, ``close`` gives it back)."""

    def __init__(self, out: Path, progress: Progress) -> None:
        self.out = out
        self.folder = partial_folder(out)
        self.progress = progress
        self.lock = writer_lock(out, "--out")

    @classmethod
    def start(
        cls, out: Path, settings: dict[str, Any], total: int, *, resume: bool, overwrite: bool
    ) -> PartialCorpus:
        """A new partial folder, or (``resume``) the one an interrupted run left.

        Raises:
            ConfigError: another process writes ``out``; ``out`` may not be replaced; a
                partial folder is there without ``resume`` (and without ``overwrite``); or
                with ``resume``, none is there or it was made with other settings.
        """
        check_out(out, overwrite=overwrite)
        corpus = cls(out, Progress(settings, total))
        corpus.lock.acquire()
        try:
            if resume:
                corpus._resume(settings)
            else:
                corpus._fresh(overwrite)
        except BaseException:
            corpus.close()
            raise
        return corpus

    def _resume(self, settings: dict[str, Any]) -> None:
        if not self.folder.is_dir():
            raise ConfigError(
                f"--resume: no interrupted distillation into {self.out} ({self.folder} is not "
                "there); run without --resume"
            )
        saved = _read_progress(self.folder)
        if saved is None:
            raise ConfigError(
                f"--resume: {self.folder / PROGRESS} is missing or not valid; give --overwrite "
                "without --resume to start again"
            )
        changed = _changed(saved.settings, settings)
        if changed is not None:
            raise ConfigError(
                f"--resume: {self.folder} was made with {changed}; give the same settings, or "
                "--overwrite without --resume to start again"
            )
        with open(self.folder / TRAIN, "r+b") as handle:
            handle.truncate(saved.size)  # pairs past the record: a chunk cut short
        self.progress = saved

    def _fresh(self, overwrite: bool) -> None:
        if self.folder.exists():
            saved = _read_progress(self.folder)
            if not overwrite:
                where = "" if saved is None else f" ({saved.done:,} of {saved.total:,} sources)"
                raise ConfigError(
                    f"--out {self.out}: an interrupted distillation{where} is in {self.folder}; "
                    "give --resume to continue it, or --overwrite to start again"
                )
            self._remove_partial()
        self.folder.mkdir()
        (self.folder / TRAIN).write_bytes(b"")
        self._save()

    def _remove_partial(self) -> None:
        """Delete the partial folder, only when it holds nothing but what a run writes there."""
        ours = {PROGRESS, TRAIN}
        foreign = [
            p.name for p in self.folder.iterdir()
            if p.name not in ours and not p.name.startswith(f".{PROGRESS}.")
        ]  # fmt: skip
        if foreign or self.folder.is_symlink():
            raise ConfigError(
                f"--out {self.out}: {self.folder} holds {foreign[0] if foreign else 'a link'}, "
                "which no distillation wrote; move it away (nothing was deleted)"
            )
        shutil.rmtree(self.folder)

    def _save(self) -> None:
        record = {"format": _PROGRESS_FORMAT, **asdict(self.progress)}
        write_text_atomic(self.folder / PROGRESS, json.dumps(record, indent=2) + "\n")

    def append(self, pairs: Sequence[tuple[str, str]], sources: int) -> None:
        """Add the pairs of the next ``sources`` sources; on disk before the record says so."""
        text = "".join(
            json.dumps({"source": s, "target": t}, ensure_ascii=False) + "\n" for s, t in pairs
        )
        with open(self.folder / TRAIN, "ab") as handle:
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
            size = handle.tell()
        self.progress.done += sources
        self.progress.lines += len(pairs)
        self.progress.size = size
        self._save()

    def close(self) -> None:
        self.lock.release()

    def finish(
        self, splits: Mapping[str, Sequence[tuple[str, str]]], *, overwrite: bool, **fields: Any
    ) -> dict[str, int]:
        """Write ``out`` whole: train.jsonl, the ``splits`` given (validation, test) pair for
        pair, and the marker with ``fields``; then delete the partial folder.

        Returns:
            Pairs per split written.
        """
        self.close()  # staging takes the same lock for the rename
        counts = {"train": self.progress.lines, **{k: len(v) for k, v in splits.items()}}
        try:
            with DISTILLED.staging(self.out, overwrite=overwrite) as tmp:
                _link_or_copy(self.folder / TRAIN, tmp / TRAIN)
                for name, pairs in splits.items():
                    rows = [{"source": s, "target": t} for s, t in pairs]
                    write_jsonl(tmp / f"{name}.jsonl", rows)
                files = [TRAIN, *(f"{name}.jsonl" for name in splits)]
                marker = DISTILLED.marker_text(
                    [*files, DISTILLED.marker], counts=counts, sources=self.progress.total,
                    **fields,
                )  # fmt: skip
                (tmp / DISTILLED.marker).write_text(marker, encoding="utf-8")
        except OSError as error:
            raise CheckpointError(f"--out {self.out}: cannot be written ({error})") from error
        shutil.rmtree(self.folder, ignore_errors=True)
        return counts


def _link_or_copy(source: Path, target: Path) -> None:
    """A second name for ``source`` (no copy), or a copy where links are not allowed; the
    partial file stays until the finished folder is in place."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
