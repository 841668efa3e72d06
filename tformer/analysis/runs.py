"""Training runs side by side: what ``tformer compare-runs`` reads from run folders.

A run folder (what ``tformer train --out RUN`` writes) holds everything compared here:
``latest`` names the newest checkpoint, whose ``config.json`` gives the architecture and the
step and whose ``model.safetensors`` header gives the parameter count; ``metrics.jsonl`` gives
the training speed and the validation figures; the result cards of ``tformer evaluate``
(``result.json`` in an ``eval-<split>`` folder of a checkpoint of the run) give test scores.

The architecture is read as the plain dictionary ``config.json`` holds, not through
``ModelConfig``, so runs written by another version of tformer (with more or fewer
architecture fields) still compare: a field one run lacks counts as the ``ModelConfig``
default when this version knows the field, else as missing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tformer.checkpoint.files import CONFIG, WEIGHTS
from tformer.checkpoint.run_dir import (
    BEST,
    LATEST,
    is_checkpoint_dir,
    is_run_dir,
    read_metrics,
    resolve,
    step_dirs,
)
from tformer.checkpoint.store import read_config
from tformer.checkpoint.weights import read_header
from tformer.config import FAMILY_RECORDS, ModelConfig
from tformer.errors import CheckpointError
from tformer.paths import inside, json_loads, read_small_text

FP32_BYTES = 4
CARD = "result.json"
CARD_LIMIT = 1 << 22  # a result card is a few kilobytes; a bigger file is not one
MISSING = None  # a field neither the run's config.json nor ModelConfig defines


@dataclass(frozen=True)
class RunSummary:
    """What one run folder says about itself (None where it does not say).

    ``tokens_per_s`` is the median of the ``tokens_per_s`` of the training records of
    ``metrics.jsonl`` (each measured over one ``--log-every`` window); the best validation
    figures are the lowest ``val_loss`` and the highest ``val_bleu`` / ``val_chrf`` over all
    evaluations (each on its own, so they may come from different steps); ``exact_match`` is
    the last ``validation_exact_match`` record. ``results`` maps a split (``test``) to the
    figures of the newest ``tformer evaluate`` result card of that split found in the run.
    ``curves`` maps ``val_loss`` (and ``val_bleu`` / ``val_chrf`` when logged) to
    (step, value) points in step order.
    """

    name: str
    path: Path
    checkpoint: Path
    architecture: dict[str, Any]
    parameters: int
    steps: int
    tokens_per_s: float | None
    best_val_loss: float | None
    best_val_loss_step: int | None
    best_val_bleu: float | None
    best_val_chrf: float | None
    exact_match: float | None
    results: dict[str, dict[str, Any]]
    kv_cache_bytes_per_token: int | None
    curves: dict[str, list[tuple[int, float]]] = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        record["path"], record["checkpoint"] = str(self.path), str(self.checkpoint)
        record["curves"] = {k: [list(p) for p in v] for k, v in self.curves.items()}
        return record


@dataclass(frozen=True)
class Comparison:
    """Several runs and the architecture fields on which they differ (in field order)."""

    runs: list[RunSummary]
    differing: list[str]

    def differences(self, run: RunSummary) -> dict[str, Any]:
        """``run``'s value of each differing field (``MISSING`` where nothing defines it)."""
        return {name: architecture_value(run.architecture, name) for name in self.differing}

    def to_json(self) -> dict[str, Any]:
        runs = []
        for run in self.runs:
            record = {"name": run.name, "differences": self.differences(run)}
            record.update({k: v for k, v in run.to_json().items() if k != "name"})
            runs.append(record)
        return {"differing_fields": self.differing, "runs": runs}


def compare_runs(paths: Sequence[str | Path]) -> Comparison:
    """Summaries of the runs at ``paths`` (run folders or checkpoints inside them), in order.

    Raises:
        CheckpointError: a path that is not a tformer run folder nor a checkpoint inside one.
    """
    runs = [summarize_run(p) for p in paths]
    names = [r.name for r in runs]
    if len(set(names)) < len(names):  # two runs called "a" in different folders
        runs = [dataclasses.replace(r, name=str(r.path)) for r in runs]
    return Comparison(runs, differing_fields([r.architecture for r in runs]))


def summarize_run(path: str | Path) -> RunSummary:
    """The summary of one run (a run folder, or a checkpoint folder inside one).

    Raises:
        CheckpointError: ``path`` is not a tformer run folder nor a checkpoint inside one, or
            its latest checkpoint's config.json is unreadable.
    """
    run = find_run(Path(path).expanduser())
    checkpoint = resolve(run)
    config = read_config(checkpoint)
    architecture = config.get("model")
    if not isinstance(architecture, dict):
        raise CheckpointError(f"{checkpoint / CONFIG}: has no model section; not a tformer run")
    records = read_metrics(run)
    val_loss = _series(records, "val_loss")
    best = min(val_loss, key=lambda point: point[1]) if val_loss else None
    curves = {k: _series(records, k) for k in ("val_loss", "val_bleu", "val_chrf")}
    step = config.get("step")
    return RunSummary(
        name=run.name,
        path=run,
        checkpoint=checkpoint,
        architecture=dict(architecture),
        parameters=parameter_count(checkpoint),
        steps=step if isinstance(step, int) and not isinstance(step, bool) else 0,
        tokens_per_s=_median([v for _, v in _series(records, "tokens_per_s")]),
        best_val_loss=best[1] if best else None,
        best_val_loss_step=best[0] if best else None,
        best_val_bleu=max((v for _, v in curves["val_bleu"]), default=None),
        best_val_chrf=max((v for _, v in curves["val_chrf"]), default=None),
        exact_match=_last(records, "validation_exact_match"),
        results=result_cards(run),
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(architecture),
        curves={k: v for k, v in curves.items() if v},
    )


def find_run(path: Path) -> Path:
    """The run folder ``path`` names: itself, or the run a checkpoint folder (a ``step-*`` or
    ``best/``) belongs to.

    Raises:
        CheckpointError: naming ``path`` and what a run folder is.
    """
    if not path.exists():
        raise CheckpointError(f"{path}: no such run folder; give the --out folder of a run")
    if not path.is_dir():
        raise CheckpointError(f"{path}: a file, not a run folder; give the --out folder of a run")
    run = path
    if not is_run_dir(run) and is_checkpoint_dir(run) and is_run_dir(run.parent):
        run = run.parent  # a step-* checkpoint of the run (or of its best/)
    if run.name == BEST and is_run_dir(run) and is_run_dir(run.parent):
        run = run.parent  # best/ is a run folder of its own, inside the run
    if is_run_dir(run):
        return run
    if is_checkpoint_dir(path):
        raise CheckpointError(
            f"{path}: a checkpoint outside any run folder, so it has no metrics to compare; "
            "give the --out folder of a `tformer train` run"
        )
    raise CheckpointError(
        f"{path}: not a tformer run folder (no `{LATEST}` file naming a step-* checkpoint); "
        "give the --out folder of a `tformer train` run"
    )


def differing_fields(architectures: Sequence[Mapping[str, Any]]) -> list[str]:
    """The architecture fields whose values are not the same in every run.

    ``ModelConfig``'s fields come first in their order, then other keys by name.
    """
    known = [f.name for f in dataclasses.fields(ModelConfig)]
    keys = {k for arch in architectures for k in arch}
    ordered = [k for k in known if k in keys] + sorted(keys - set(known))
    return [
        k for k in ordered if len({_key(architecture_value(a, k)) for a in architectures}) > 1
    ]


def architecture_value(architecture: Mapping[str, Any], name: str) -> Any:
    """``architecture[name]``, else the ``ModelConfig`` default, else ``MISSING``."""
    if name in architecture:
        return architecture[name]
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    return defaults.get(name, MISSING)


def kv_cache_bytes_per_token(
    architecture: Mapping[str, Any], dtype_bytes: int = FP32_BYTES
) -> int | None:
    """Bytes the decoder's self-attention key/value cache grows by per generated token.

    ``2 (K and V) x n_decoder_layers x width x dtype_bytes``, where width is ``d_model`` (each
    of the n_heads heads keeps d_model / n_heads values), or ``kv_heads x d_model / n_heads``
    when the configuration has ``kv_heads`` (grouped-query attention: the heads of a group
    share one key and one value). float32, the format of the weights, is 4 bytes. The
    cross-attention keys and values are computed once per source token, not per generated
    token, and are not counted. None when the sizes are not positive whole numbers, and for an
    encoder-only model.
    """
    arch = architecture.get("arch", "encoder-decoder")
    if arch not in FAMILY_RECORDS or not FAMILY_RECORDS[arch].caches:
        return None  # no decoder, nothing cached: it reads its input in one pass
    sizes = {
        name: architecture_value(architecture, name)
        for name in ("d_model", "n_heads", "n_decoder_layers")
    }
    if not all(_is_count(v) for v in sizes.values()):
        return None
    width = sizes["d_model"]
    kv_heads = architecture.get("kv_heads", architecture.get("n_kv_heads"))
    if _is_count(kv_heads):
        width = kv_heads * (width // sizes["n_heads"])
    return 2 * sizes["n_decoder_layers"] * width * dtype_bytes


def parameter_count(checkpoint: Path) -> int:
    """The numbers in the checkpoint's weights file (a tied matrix is stored, so counted, once).

    Raises:
        CheckpointError: the weights file is missing or not safetensors.
    """
    header = read_header(checkpoint / WEIGHTS)
    return sum(math.prod(shape) for _, shape in header.tensors.values())


def result_cards(run: Path) -> dict[str, dict[str, Any]]:
    """Per split, the figures of the newest result card of ``tformer evaluate`` in the run.

    Cards are looked for where ``tformer evaluate`` writes them by default
    (``<checkpoint>/eval-<split>/result.json``, in the run's checkpoints and in ``best/``) and
    in ``RUN/eval-*/``. The newest is the card of the highest step (then the latest written).
    A card that cannot be read, or lies behind a link out of the run, is passed over.
    """
    folders = [run, *step_dirs(run), *step_dirs(run / BEST)]
    found: dict[str, tuple[tuple[int, float], dict[str, Any]]] = {}
    for folder in folders:
        for path in sorted(folder.glob(f"eval-*/{CARD}")):
            card = _read_card(run, path)
            if card is None:
                continue
            rank = (card["step"] or 0, path.stat().st_mtime)
            if card["split"] not in found or rank > found[card["split"]][0]:
                found[card["split"]] = (rank, card)
    return {split: found[split][1] for split in sorted(found)}


def _read_card(run: Path, path: Path) -> dict[str, Any] | None:
    """A result card's split, step, scores and checkpoint, or None if it is not one."""
    if not inside(run, path):
        return None
    text = read_small_text(path, limit=CARD_LIMIT)
    try:
        card = json_loads(text) if text is not None else None
    except json.JSONDecodeError:
        return None
    if not isinstance(card, dict) or not isinstance(card.get("metrics"), dict):
        return None
    split, metrics = card.get("split"), card["metrics"]
    if not isinstance(split, str):
        return None
    step = card.get("step")
    return {
        "split": split,
        "step": step if _is_number(step) else None,
        "checkpoint": str(card.get("checkpoint", "")),
        "pairs": card.get("pairs") if _is_number(card.get("pairs")) else None,
        "card": str(path),
        **{k: metrics.get(k) if _is_number(metrics.get(k)) else None
           for k in ("bleu", "chrf", "loss", "perplexity", "bits_per_char", "masked_accuracy")},
    }


def _series(records: Sequence[Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) of every record with a finite number under ``key``, in step order."""
    points = [
        (r["step"], float(r[key]))
        for r in records
        if _is_number(r.get("step")) and _is_number(r.get(key)) and math.isfinite(r[key])
    ]
    return sorted(points, key=lambda point: point[0])


def _last(records: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [v for _, v in _series(records, key)]
    return values[-1] if values else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _key(value: Any) -> str:
    """A hashable, type-exact key for comparing values (1 and 1.0 and True stay apart)."""
    return json.dumps(value, sort_keys=True, default=str)
