"""Which files of a data folder make which split: ``train.jsonl`` / ``validation.csv`` ...,
or paired text files (``train.en`` + ``train.de``); two files for one split are refused."""

from __future__ import annotations

from pathlib import Path

from tformer.errors import DataError

# Names people give the held-out splits; the first of each list that exists is used.
SPLIT_NAMES = {
    "train": ("train",),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test",),
}
LOADERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}


def split_files(
    folder_or_file: Path, source_field: str, target_field: str
) -> dict[str, list[Path]]:
    """The files each split is read from, as ``load_text_pairs`` picks them (a single file is
    the train split). Call it after loading, which names bad data."""
    if folder_or_file.is_file():
        return {"train": [folder_or_file]}
    if not folder_or_file.is_dir():
        return {}
    paired = paired_text_files(folder_or_file, source_field, target_field)
    if "train" in paired:
        return {split: list(files) for split, files in paired.items()}
    return {split: [file] for split, file in split_files_of(folder_or_file).items()}


def split_files_of(folder: Path) -> dict[str, Path]:
    """Split -> its file; two files for one split (val.jsonl and validation.csv) are refused."""
    found: dict[str, Path] = {}
    for split, names in SPLIT_NAMES.items():
        candidates = [
            folder / f"{name}{suffix}"
            for name in names
            for suffix in LOADERS
            if (folder / f"{name}{suffix}").is_file()
        ]
        _one_file(split, candidates)
        if candidates:
            found[split] = candidates[0]
    return found


def _one_file(split: str, candidates: list[Path]) -> None:
    if len(candidates) > 1:
        names = " and ".join(str(c) for c in candidates)
        raise DataError(
            f"two files for the {split} split: {names}; keep one (rename or move the other)"
        )


def paired_text_files(folder: Path, src: str, tgt: str) -> dict[str, tuple[Path, Path]]:
    """Split -> (source file, target file) for a folder like ``train.en`` + ``train.de``.

    ``val`` / ``valid`` / ``dev`` name the validation split; any ``test*`` prefix the test
    split (``test2016.en`` as in Multi30k; the first in name order when there are several).
    """
    found: dict[str, tuple[Path, Path]] = {}
    named: dict[str, list[Path]] = {split: [] for split in SPLIT_NAMES}
    prefixes = sorted({p.name[: -len(src) - 1] for p in folder.glob(f"*.{src}")})
    for prefix in prefixes:
        pair = (folder / f"{prefix}.{src}", folder / f"{prefix}.{tgt}")
        if not pair[1].is_file():
            continue
        for split, names in SPLIT_NAMES.items():
            if prefix in names:
                named[split].append(pair[0])
            matches = prefix in names or (split == "test" and prefix.startswith("test"))
            if matches and split not in found:
                found[split] = pair
    for split, paths in named.items():
        _one_file(split, paths)
    return found
