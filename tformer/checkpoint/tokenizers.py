"""A checkpoint's tokenizers: the source and target pair, what config.json records of them,
and reading them back (checked against that record and the manifest)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tformer.checkpoint.files import CONFIG, SHARED_TOKENIZER, SOURCE_TOKENIZER, TARGET_TOKENIZER
from tformer.config import MASK, SPECIAL_TOKENS
from tformer.data.tokenizer import Tokenizer
from tformer.errors import CheckpointError
from tformer.paths import excerpt

SPECIAL_NAMES = "special_names"  # config.json's tokenizer key: the imported tokenizer's names
_NAMED = (*SPECIAL_TOKENS, MASK)  # the special tokens that may have another name, by id
MAX_NAME = 64  # characters of such a name


@dataclass
class Tokenizers:
    """The source and target tokenizers; the same object when the vocabulary is shared.

    ``requested``: how they were trained (``kind``, ``vocab_size``, ``shared``, as asked for),
    recorded so that ``--resume`` can tell whether tokenizer flags given again agree; None for a
    tokenizer given as a file.
    """

    source: Tokenizer
    target: Tokenizer
    requested: dict[str, Any] | None = None

    @property
    def shared(self) -> bool:
        return self.source is self.target

    def files(self) -> dict[str, str]:
        if self.shared:
            return {"source": SHARED_TOKENIZER, "target": SHARED_TOKENIZER}
        return {"source": SOURCE_TOKENIZER, "target": TARGET_TOKENIZER}

    def identity(self) -> dict[str, Any]:
        """What config.json records so a mismatched tokenizer is caught on load."""
        return {
            "files": self.files(),
            "sha256": {"source": self.source.sha256(), "target": self.target.sha256()},
            "vocab_size": {"source": self.source.vocab_size, "target": self.target.vocab_size},
            "special_tokens": list(SPECIAL_TOKENS),
            "special_token_ids": {token: i for i, token in enumerate(SPECIAL_TOKENS)},
            **({"requested": self.requested} if self.requested else {}),
            **self._special_names(),
        }

    def _special_names(self) -> dict[str, Any]:
        """The imported tokenizers' own names of tformer's special tokens, by side, where
        there are any (shown for them: "<bos>": "[CLS]")."""
        sides = {"source": self.source, "target": self.target}
        names = {
            side: {_NAMED[i]: name for i, name in sorted(tok.special_names.items())}
            for side, tok in sides.items()
        }
        return {SPECIAL_NAMES: names} if any(names.values()) else {}

    def save(self, folder: Path) -> None:
        files = self.files()
        self.source.save(folder / files["source"])
        if not self.shared:
            self.target.save(folder / files["target"])


def tokenizer_files_of(folder: Path, config: dict[str, Any]) -> dict[str, str]:
    """The tokenizer file of each side that config.json names (the shared one when it names
    none, as older checkpoints did)."""
    identity = config.get("tokenizer")
    files = identity.get("files") if isinstance(identity, dict) else None
    if files is None:
        return {"source": SHARED_TOKENIZER, "target": SHARED_TOKENIZER}
    allowed = {SHARED_TOKENIZER, SOURCE_TOKENIZER, TARGET_TOKENIZER}
    if not isinstance(files, dict) or not {files.get("source"), files.get("target")} <= allowed:
        raise CheckpointError(f"{folder / CONFIG}: invalid tokenizer file names {excerpt(files)}")
    return files


def load_tokenizers(folder: Path, config: dict[str, Any]) -> Tokenizers:
    """Load the checkpoint's tokenizer(s) and check them against what config.json recorded.

    Raises:
        CheckpointError: naming the tokenizer file and config.json when they disagree.
    """
    files = tokenizer_files_of(folder, config)
    recorded = config.get("tokenizer")
    identity: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    source = Tokenizer.load(folder / files["source"])
    target = (
        source if files["target"] == files["source"] else Tokenizer.load(folder / files["target"])
    )
    ids = identity.get("special_token_ids")
    if ids is not None and ids != {token: i for i, token in enumerate(SPECIAL_TOKENS)}:
        raise CheckpointError(
            f"{folder / CONFIG}: records special token ids {ids}, but tformer uses "
            f"{', '.join(f'{t}={i}' for i, t in enumerate(SPECIAL_TOKENS))}"
        )
    for side, tok in (("source", source), ("target", target)):
        expected = (identity.get("sha256") or {}).get(side)
        if expected and tok.sha256() != expected:
            raise CheckpointError(
                f"{folder / files[side]}: does not match the tokenizer recorded in "
                f"{folder / CONFIG} (sha256 differs); the model was trained with another one"
            )
        size = (identity.get("vocab_size") or {}).get(side)
        if size is not None and size != tok.vocab_size:
            raise CheckpointError(
                f"{folder / files[side]}: has {tok.vocab_size} tokens but {folder / CONFIG} "
                f"records {size} for the {side} vocabulary"
            )
    for side, tok in (("source", source), ("target", target)):
        tok.special_names = _special_names(folder, identity, side)
    requested = identity.get("requested")
    return Tokenizers(source, target, requested if isinstance(requested, dict) else None)


def _special_names(folder: Path, identity: dict[str, Any], side: str) -> dict[int, str]:
    """tformer id -> the imported tokenizer's name for it, as config.json records them.

    Raises:
        CheckpointError: a record that is not tformer's special tokens with short printable
            names.
    """
    recorded = identity.get(SPECIAL_NAMES)
    if recorded is None:
        return {}
    names = recorded.get(side) if isinstance(recorded, dict) else None
    fits = isinstance(names, dict) and all(
        token in _NAMED and isinstance(name, str) and 0 < len(name) <= MAX_NAME
        and name.isprintable()
        for token, name in names.items()
    )  # fmt: skip
    if not fits:
        raise CheckpointError(
            f"{folder / CONFIG}: tokenizer.{SPECIAL_NAMES} {excerpt(recorded)} must give, for "
            f"the source and the target, names (1 to {MAX_NAME} printable characters) of "
            f"{', '.join(_NAMED)}"
        )
    assert isinstance(names, dict)
    return {_NAMED.index(token): name for token, name in names.items()}
