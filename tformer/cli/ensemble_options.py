"""``--ensemble``: more checkpoints decoded together with a command's own (generate, evaluate,
compare, serve), their log-probabilities averaged at each step (``tformer.decoding.ensemble``)."""

from __future__ import annotations

from pathlib import Path

import typer

from tformer.checkpoint.store import Checkpoint, load_checkpoint
from tformer.cli.data_options import checkpoint_family
from tformer.cli.options import apply_quantize
from tformer.decoding.ensemble import Decodable, ensemble_of
from tformer.device import resolve_device
from tformer.errors import ConfigError

ENSEMBLE = typer.Option(
    None,
    "--ensemble",
    help="Another checkpoint (a run folder: its latest) to decode with, averaging the models' "
    "log-probabilities at each step; repeat for more. Every member shares the target "
    "vocabulary.",
    show_default=False,
)


def refuse_with_ensemble(paths: list[Path] | None, flag: str, why: str) -> None:
    """One line refusing ``flag`` with --ensemble, saying ``why`` it needs one model."""
    if paths:
        raise ConfigError(f"{flag} {why}; it does not combine with --ensemble")


def with_members(
    loaded: Checkpoint, paths: list[Path] | None, command: str, *, device: str, quantize: str
) -> tuple[Decodable, list[str]]:
    """``loaded``'s model, or with --ensemble the ensemble of it and the members (each on
    ``device``, int8 with --quantize int8), refused in one line when they cannot decode
    together; and the checkpoint folders it decodes with.
    """
    if not paths:
        return loaded.model, [str(loaded.path)]
    members = [loaded]
    for path in paths:
        checkpoint_family(path, command, "generates")  # before any weights are read
        member = load_checkpoint(path, resolve_device(device))
        apply_quantize(member.model, quantize)
        members.append(member)
    return ensemble_of(members), [str(member.path) for member in members]
