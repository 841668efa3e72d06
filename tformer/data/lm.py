"""Plain text for the two language-model families: documents -> token blocks -> batches.

Shape legend: B rows in a batch, L longest row.

A document is one line of a ``.txt`` file, or one row of a text column. Its ids become one
training example, stored as an id pair (so batching, bucketing and resuming are the
translation pipeline's):

- decoder-only (causal LM): ``([], x)`` with x = <bos> doc <eos>. Packed (the default), the
  documents are joined into one stream and cut into blocks of max_len + 1 tokens overlapping by
  one, so every position of the stream is predicted once; the model reads x[:-1] and predicts
  x[1:] (:class:`CausalObjective`).
- encoder-only (masked LM): ``(x, [])`` with x = doc <eos>, packed into blocks of max_len.
  :class:`MaskedObjective` chooses the tokens to predict afresh each epoch (Liu et al. 2019's
  dynamic masking), from a random stream keyed by (seed, epoch, example), so a resumed run
  masks exactly as the run it continues would have.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tformer.config import (
    BOS_ID,
    EOS_ID,
    MASK_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    TrainConfig,
    family_record,
)
from tformer.data.batching import Batch, pad
from tformer.data.dates_text import write_text_splits
from tformer.data.sources import load_text_pairs
from tformer.data.store import IdPair
from tformer.errors import DataError

TEXT_SPLITS = ("train", "validation", "test")


def bundled_text_dir() -> Path:
    """The bundled language-model demo text: ``data/text/`` of a source checkout, else made once."""
    repo_text = Path(__file__).resolve().parents[2] / "data" / "text"
    if (repo_text / "train.txt").is_file():
        return repo_text
    cache = Path.home() / ".cache" / "tformer" / "dates-text"
    if not (cache / "train.txt").is_file():
        write_text_splits(cache)
    return cache


def load_texts(spec: str | None, text_field: str = "text") -> dict[str, list[str]]:
    """Every available split of ``spec`` as a list of documents.

    ``spec``: None for the bundled demo text; a ``.txt`` file (the train split) or a folder
    with ``train.txt`` (and optional ``validation.txt``, ``test.txt``), one document a line;
    a JSONL/CSV/TSV/Parquet file or folder, or a hub data set, read from column ``text_field``.

    Raises:
        DataError: naming the file and what is wrong (missing, empty, no text at all).
    """
    path = Path(spec).expanduser() if spec is not None else bundled_text_dir()
    where = f"--data {spec}" if spec is not None else f"the bundled text ({path})"
    if path.is_file() and path.suffix.lower() == ".txt":
        splits = {"train": _read_lines(path)}
    elif path.is_dir() and (path / "train.txt").is_file():
        splits = {
            split: _read_lines(path / f"{split}.txt")
            for split in TEXT_SPLITS
            if (path / f"{split}.txt").is_file()
        }
    elif path.is_dir() and any(path.glob("*.txt")) and not any(path.glob("train.*")):
        raise DataError(
            f"{where}: no train.txt; name the files train.txt, validation.txt and test.txt"
        )
    else:
        try:
            pairs = load_text_pairs(spec, source_field=text_field, target_field=text_field)
        except DataError as error:  # the column is named by a language model's own flag
            message = re.sub(r"--(source|target)-field", "--text-field", str(error))
            raise DataError(message) from error
        splits = {name: [source for source, _ in rows] for name, rows in pairs.items()}
    for name, docs in splits.items():
        if not any(doc.strip() for doc in docs):
            raise DataError(f"{where}: the {name} split has no text (every document is blank)")
    return splits


def _read_lines(path: Path) -> list[str]:
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise DataError(f"{path}: cannot be read ({error.strerror or error})") from error
    if not raw.strip():
        raise DataError(f"{path}: the file is empty; a language model needs text to read")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise DataError(f"{path}: line {line}: invalid UTF-8 (byte {error.start})") from error
    return [line for line in text.splitlines() if line.strip()]


def causal_examples(
    docs: Sequence[Sequence[int]], max_len: int, *, pack: bool, document_bos: bool = True
) -> list[IdPair]:
    """Decoder-only examples: ``([], x)``, x at most max_len + 1 ids (see the module text).
    Packed without ``document_bos``, only the first document has <bos>: each later one
    follows the <eos> of the one before (GPT-2's <|endoftext|> between documents)."""
    rows = [[BOS_ID, *doc, EOS_ID] for doc in docs if len(doc)]
    if not pack:
        return [([], row[: max_len + 1]) for row in rows]
    if not document_bos:
        rows = rows[:1] + [row[1:] for row in rows[1:]]
    stream = [i for row in rows for i in row]
    return [
        ([], stream[start : start + max_len + 1])
        for start in range(0, max(len(stream) - 1, 0), max_len)
    ]


def masked_examples(docs: Sequence[Sequence[int]], max_len: int, *, pack: bool) -> list[IdPair]:
    """Encoder-only examples: ``(x, [])``, x = doc <eos> (packed: blocks of max_len ids)."""
    rows = [[*doc, EOS_ID] for doc in docs if len(doc)]
    if not pack:
        return [(row[:max_len], []) for row in rows]
    stream = [i for row in rows for i in row]
    return [(stream[start : start + max_len], []) for start in range(0, len(stream), max_len)]


def lm_examples(
    docs: Sequence[Sequence[int]],
    arch: str,
    max_len: int,
    *,
    pack: bool = True,
    document_bos: bool = True,
) -> list[IdPair]:
    """The training examples of ``arch`` (decoder-only or encoder-only) from tokenised docs."""
    if family_record(arch).objective == "causal":
        return causal_examples(docs, max_len, pack=pack, document_bos=document_bos)
    return masked_examples(docs, max_len, pack=pack)


class CausalObjective:
    """Next-token prediction: the model reads x[:-1] and each label is the token after."""

    def collate(self, pairs: Sequence[IdPair], keys: Sequence[int]) -> Batch:
        rows = [tgt for _, tgt in pairs]
        return Batch(
            src=torch.zeros(len(rows), 0, dtype=torch.long),
            tgt_in=pad([row[:-1] for row in rows]),
            tgt_out=pad([row[1:] for row in rows]),
        )

    def predicted(self, pair: IdPair, key: int) -> int:
        return max(len(pair[1]) - 1, 0)


FIRST_WORD = len(SPECIAL_TOKENS) + 1  # ids below are pad/bos/eos/unk and <mask>: never masked


@dataclass(frozen=True)
class MaskedObjective:
    """BERT's masked language modelling (Devlin et al. 2019, section 3.1).

    Each non-special token is chosen with probability ``probability`` (at least one per row
    that has any, so no row is without a label); a chosen token is replaced by <mask> with
    probability ``mask``, by a random non-special token with probability ``random``, and kept
    otherwise. Only chosen positions have labels: the loss counts nothing else.
    """

    vocab_size: int
    seed: int = 0
    probability: float = 0.15
    mask: float = 0.8
    random: float = 0.1

    def draw(self, ids: Sequence[int], key: int) -> tuple[list[int], list[int]]:
        """(model input, labels with PAD_ID where nothing is predicted) for one example."""
        rng = np.random.default_rng([self.seed, key])
        x = np.asarray(ids, dtype=np.int64)
        chosen = self._chosen(x, rng)
        action = rng.random(len(x))
        randoms = rng.integers(FIRST_WORD, max(self.vocab_size, FIRST_WORD + 1), size=len(x))
        inputs = x.copy()
        to_mask = chosen & (action < self.mask)
        to_random = chosen & (action >= self.mask) & (action < self.mask + self.random)
        inputs[to_mask] = MASK_ID
        inputs[to_random] = randoms[to_random]
        labels = np.where(chosen, x, PAD_ID)
        return inputs.tolist(), labels.tolist()

    def collate(self, pairs: Sequence[IdPair], keys: Sequence[int]) -> Batch:
        drawn = [self.draw(src, key) for (src, _), key in zip(pairs, keys, strict=True)]
        return Batch(
            src=pad([inputs for inputs, _ in drawn]),
            tgt_in=torch.zeros(len(drawn), 0, dtype=torch.long),
            tgt_out=pad([labels for _, labels in drawn]),
        )

    def predicted(self, pair: IdPair, key: int) -> int:
        # Only the choice, the first draw of the same stream: half the cost of draw().
        x = np.asarray(pair[0], dtype=np.int64)
        return int(self._chosen(x, np.random.default_rng([self.seed, key])).sum())

    def _chosen(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        maskable = x >= FIRST_WORD
        chosen = (rng.random(len(x)) < self.probability) & maskable
        if not chosen.any() and maskable.any():
            chosen[rng.choice(np.flatnonzero(maskable))] = True
        return chosen


Objective = CausalObjective | MaskedObjective


def objective_for(
    arch: str, vocab_size: int, train: TrainConfig | None = None, *, seed: int | None = None
) -> Objective | None:
    """How batches of ``arch`` are made: None for the encoder-decoder (teacher forcing); the
    masking settings and seed of ``train`` (defaults without one; ``seed`` overrides)."""
    objective = family_record(arch).objective
    if objective == "causal":
        return CausalObjective()
    if objective != "masked":
        return None
    settings = train or TrainConfig()
    return MaskedObjective(
        vocab_size,
        seed=settings.seed if seed is None else seed,
        probability=settings.mlm_probability,
        mask=settings.mlm_mask,
        random=settings.mlm_random,
    )
