"""``--resume`` (or ``--init-from``) with settings that would change the saved architecture:
refused, all at once.

A resumed run keeps the architecture and the tokenizer it was saved with, and so does a run
fine-tuned from a checkpoint (``--init-from``). A setting given again that agrees with them is
accepted; one that contradicts them is refused, and every such setting is named in one line:
architecture flags (``--d-model``, ``--n-heads``, ``--max-len`` ..., ``--n-layers``),
``--preset``, a ``--recipe``'s architecture (on resume; a fine-tuned run takes only a recipe's
training settings), a ``--config`` file's ``model`` and ``tokenizer`` sections, and the
tokenizer flags (``--tokenizer-kind``, ``--vocab-size``, ``--separate-vocab``), which are
compared with how the saved tokenizer was trained.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tformer.checkpoint.files import SHARED_TOKENIZER
from tformer.config import PRESETS, RECIPES, ModelConfig, flag
from tformer.data.tokenizer import Tokenizer
from tformer.errors import CheckpointError, ConfigError
from tformer.paths import excerpt

# Architecture values set from the tokenizer at run time, not chosen by the user.
DERIVED = ("src_vocab_size", "tgt_vocab_size", "share_embeddings")
# What a --config file's tokenizer section and the flags call each tokenizer setting.
TOKENIZER_FLAGS = {
    "kind": "--tokenizer-kind",
    "vocab_size": "--vocab-size",
    "shared": "--separate-vocab",
}
# What the checkpoint is to the run, by the option that names it.
ROLES = {"--resume": "being resumed", "--init-from": "fine-tuned from"}


def model_conflicts(saved: ModelConfig, values: Mapping[str, Any]) -> list[str]:
    """``field value (saved)`` for each value of ``values`` that contradicts ``saved``."""
    out = []
    for name, want in values.items():
        if name in DERIVED or want is None:
            continue
        have = getattr(saved, name, None)
        if name == "kv_heads":  # unset means one key/value head per head: the same model
            have = saved.n_kv_heads
        if want != have:
            out.append(f"{name} {excerpt(want)} (saved: {excerpt(have)})")
    return out


def check_resume_settings(
    folder: Path,
    config: Mapping[str, Any],
    saved: ModelConfig,
    *,
    given: Mapping[str, Any],
    preset: str | None,
    recipe: str | None,
    sections: Mapping[str, Mapping[str, Any]],
    config_file: Path | None,
    tokenizer: Mapping[str, Any],
    option: str = "--resume",
) -> None:
    """Refuse every setting that contradicts the checkpoint ``folder`` being resumed (or, with
    ``option`` "--init-from", fine-tuned from).

    Args:
        given: values given as flags, by field name (``n_layers`` for both depths).
        tokenizer: tokenizer settings given as flags (``kind``, ``vocab_size``, ``shared``).
        option: the option that named ``folder``, as the message names it.

    Raises:
        ConfigError: naming each contradicting flag or file key with both values.
    """
    found: list[str] = []
    # Later layers win in a new run (recipe < --config < --preset < flags): a layer is compared
    # only where no later one sets the value, so the command line that made the run resumes it.
    overridden: set[str] = set()
    for name, want in given.items():
        names = ("n_encoder_layers", "n_decoder_layers") if name == "n_layers" else (name,)
        overridden.update(names)
        if any(model_conflicts(saved, {n: want}) for n in names):
            have = " / ".join(str(getattr(saved, n)) for n in names)
            found.append(f"{flag(name)} {excerpt(want)} (saved: {have})")
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(
                f"--preset {preset!r} is unknown; choose one of {', '.join(PRESETS)}"
            )
        found += _grouped(f"--preset {preset}", saved, PRESETS[preset], overridden)
    where = f"--config {config_file}"
    file_model = sections.get("model", {})
    found += [f"{where}: model.{c}" for c in _unset(saved, file_model, overridden)]
    if recipe is not None and recipe != "none":
        if recipe not in RECIPES:
            raise ConfigError(
                f"--recipe {recipe!r} is unknown; choose one of {', '.join(RECIPES)} or none"
            )
        if option != "--init-from":  # fine-tuning takes a recipe's training settings only
            found += _grouped(f"--recipe {recipe}", saved, RECIPES[recipe]["model"], overridden)
    found += _tokenizer_settings(folder, config, sections.get("tokenizer", {}), tokenizer, where)
    if found:
        them = "it" if len(found) == 1 else "them"
        raise ConfigError(
            f"{option} {folder}: {'; '.join(found)} conflict{'s' * (len(found) == 1)} with the "
            f"architecture of the checkpoint {ROLES[option]}; drop {them} to keep the saved "
            "architecture (settings that agree with it are accepted)"
        )


def _tokenizer_settings(
    folder: Path,
    config: Mapping[str, Any],
    in_file: Mapping[str, Any],
    given: Mapping[str, Any],
    where: str,
) -> list[str]:
    """The tokenizer settings of the file and the flags (which win) that contradict how the
    saved tokenizer was trained."""
    trained = _trained_with(folder, config)
    in_file = {k: v for k, v in in_file.items() if k not in given}
    found = [f"{where}: tokenizer.{n} {text}" for n, text in _conflicts(trained, in_file)]
    for name, text in _conflicts(trained, given):
        if name == "shared":
            found.append("--separate-vocab (saved: one shared vocabulary)")
        else:
            found.append(f"{TOKENIZER_FLAGS[name]} {text}")
    return found


def _unset(saved: ModelConfig, values: Mapping[str, Any], overridden: set[str]) -> list[str]:
    """Conflicts of ``values`` not overridden by a later layer, which then override the rest."""
    conflicts = model_conflicts(saved, {k: v for k, v in values.items() if k not in overridden})
    overridden.update(values)
    return conflicts


def _grouped(
    what: str, saved: ModelConfig, values: Mapping[str, Any], overridden: set[str]
) -> list[str]:
    conflicts = _unset(saved, values, overridden)
    return [f"{what} ({', '.join(conflicts)})"] if conflicts else []


def _trained_with(folder: Path, config: Mapping[str, Any]) -> dict[str, Any]:
    """How the saved tokenizer was made: as recorded, or (a run saved before the record, or a
    tokenizer given as a file) as far as its files tell: then ``vocab_size`` is the size it
    has, and a request for fewer tokens is the only one that certainly contradicts it."""
    found = config.get("tokenizer")
    identity: Mapping[str, Any] = found if isinstance(found, dict) else {}
    requested = identity.get("requested")
    if isinstance(requested, dict) and set(requested) == set(TOKENIZER_FLAGS):
        return {**requested, "recorded": True}
    files = identity.get("files")
    files = files if isinstance(files, dict) else {}
    sizes = identity.get("vocab_size")
    sizes = [v for v in sizes.values() if isinstance(v, int)] if isinstance(sizes, dict) else []
    return {
        "kind": _kind(folder / str(files.get("source", SHARED_TOKENIZER))),
        "vocab_size": max(sizes, default=None),
        "shared": files.get("source", SHARED_TOKENIZER) == files.get("target", SHARED_TOKENIZER),
        "recorded": False,
    }


def _kind(path: Path) -> str | None:
    try:
        return Tokenizer.load(path).kind
    except (CheckpointError, ConfigError, OSError, ValueError):
        return None  # loading the checkpoint next names what is wrong with the file


def _conflicts(trained: Mapping[str, Any], asked: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(setting, "value (saved: ...)") for each tokenizer setting ``asked`` that contradicts
    how the saved tokenizer was trained."""
    out = []
    for name, want in asked.items():
        have = trained.get(name)
        if want is None or have is None:
            continue
        if name == "vocab_size" and not trained["recorded"]:
            if want < have:  # a tokenizer trained for `want` tokens cannot have more
                out.append((name, f"{excerpt(want)} (saved: {have} tokens)"))
        elif want != have:
            out.append((name, f"{excerpt(want)} (saved: {excerpt(have)})"))
    return out
