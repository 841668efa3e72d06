"""``--ensemble``: more checkpoints decoded together with a command's own (generate, evaluate,
compare, serve, distill), their log-probabilities averaged at each step
(``tformer.decoding.ensemble``); ``--shortlist``: decoding over a lexical shortlist."""

from __future__ import annotations

from pathlib import Path

import typer

from tformer.checkpoint.store import Checkpoint, load_checkpoint
from tformer.cli.data_options import checkpoint_family
from tformer.cli.options import apply_quantize
from tformer.decoding.ensemble import Decodable, ensemble_of
from tformer.decoding.shortlist import load_shortlist
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


SHORTLIST = typer.Option(
    None,
    "--shortlist",
    help="A lexical shortlist (written by tformer shortlist): decode over the target tokens "
    "the source's tokens translate to, faster for large batches.",
    show_default=False,
)


def refuse_with_ensemble(paths: list[Path] | None, flag: str, why: str) -> None:
    """One line refusing ``flag`` with --ensemble, saying ``why`` it needs one model."""
    if paths:
        raise ConfigError(f"{flag} {why}; it does not combine with --ensemble")


def with_members(
    loaded: Checkpoint,
    paths: list[Path] | None,
    command: str,
    *,
    device: str,
    quantize: str,
    shortlist: Path | None = None,
) -> tuple[Decodable, list[str]]:
    """``loaded``'s model, or with --ensemble the ensemble of it and the members (each on
    ``device``, int8 with --quantize int8), refused in one line when they cannot decode
    together; with --shortlist decoding over its candidates; and the checkpoint folders it
    decodes with.
    """
    chosen = None if shortlist is None else (load_shortlist(shortlist), str(shortlist))
    if not paths and chosen is None:
        return loaded.model, [str(loaded.path)]
    members = [loaded]
    for path in paths or []:
        checkpoint_family(path, command, "generates")  # before any weights are read
        member = load_checkpoint(path, resolve_device(device))
        apply_quantize(member.model, quantize)
        members.append(member)
    return ensemble_of(members, shortlist=chosen), [str(member.path) for member in members]
