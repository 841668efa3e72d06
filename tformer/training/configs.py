"""From what a user asks for to the configs of a run, as `tformer train` and ``train()`` share.

A new run: dataclass defaults < recipe < ``--config`` file < values given (flags). A resumed
run: the checkpoint's configs < ``--config`` file < values given, where architecture values
must match the checkpoint's. A fine-tuned run (``--init-from``): training settings as for a new
run, the checkpoint's architecture (values given must match it, as on resume). ``dump_config``
writes the resolved configs as YAML that ``--config`` reads back, so a printed config
reproduces its run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tformer import checkpoint as ckpt
from tformer import safe_yaml
from tformer.config import (
    DEFAULT_PRESET,
    FAMILY_RECORDS,
    PRESETS,
    RECIPES,
    ModelConfig,
    TrainConfig,
    check_numbers,
    check_types,
    family_record,
    flag,
    kind_of,
    parse_duration,
)
from tformer.data.tokenizer import DEFAULT_TOKENIZER_SAMPLE
from tformer.errors import CheckpointError, ConfigError
from tformer.paths import excerpt
from tformer.training.fit import FIT_FIELDS
from tformer.training.resume_flags import (
    DERIVED,
    ROLES,
    check_resume_settings,
    model_conflicts,
)

MODEL_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelConfig))
TRAIN_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainConfig))
# A stopping rule given later (file, flag) replaces an earlier one (the recipe's) as a whole.
STOPS = ("max_steps", "epochs", "time_budget")


@dataclass(frozen=True, kw_only=True)
class TokenizerSpec:
    """How an automatic tokenizer is trained (a given ``tokenizer.json`` is used as it is)."""

    kind: str = "bpe"
    vocab_size: int = 8000
    shared: bool = True
    sample: int = DEFAULT_TOKENIZER_SAMPLE  # trained on at most this many pairs, drawn at random

    def __post_init__(self) -> None:
        check_numbers(self)


TOKENIZER_FIELDS = frozenset(f.name for f in dataclasses.fields(TokenizerSpec))
SECTIONS = {"model": MODEL_FIELDS, "train": TRAIN_FIELDS, "tokenizer": TOKENIZER_FIELDS}
CLASSES: dict[str, type] = {"model": ModelConfig, "train": TrainConfig, "tokenizer": TokenizerSpec}


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What `tformer train` was asked for, before resolution.

    Attributes:
        recipe: a name in ``RECIPES``, "none", or None ('dates' for the bundled data).
        preset: an architecture preset given explicitly (beats the recipe's architecture).
        config_file: a YAML file with ``model`` / ``train`` / ``tokenizer`` sections.
        values: values given explicitly, by ``ModelConfig`` / ``TrainConfig`` field name
            (and ``n_layers`` for both depths); they win over everything else.
        tokenizer: ``TokenizerSpec`` fields given explicitly.
    """

    recipe: str | None = None
    preset: str | None = None
    config_file: Path | None = None
    values: Mapping[str, Any] = field(default_factory=dict)
    tokenizer: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Resolved:
    model: ModelConfig
    train: TrainConfig
    tokenizer: TokenizerSpec
    defaults: tuple[str, ...] = ()  # the IMPORTED_DEFAULTS applied (nothing given overrode)
    free: tuple[str, ...] = ()  # the settings --fit-budget may choose (given neither way)


def read_config_file(path: Path) -> dict[str, dict[str, Any]]:
    """The sections of a ``--config`` YAML file, every value checked against its field's type;
    unknown sections or keys, and YAML a configuration has no use for, are refused."""
    where = f"--config {path}"
    data = safe_yaml.read_file(Path(path), where)
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where}: expected sections {', '.join(SECTIONS)}, found {kind_of(data)}"
        )
    sections: dict[str, dict[str, Any]] = {}
    for name, values in data.items():
        if name not in SECTIONS:
            raise ConfigError(
                f"{where}: unknown key {excerpt(name)}; the sections are {', '.join(SECTIONS)}"
            )
        values = {} if values is None else values
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: {name} is {kind_of(values)}, not keys with values")
        unknown = sorted(map(str, set(values) - SECTIONS[name]))
        if unknown:
            key = excerpt(f"{name}.{unknown[0]}")
            raise ConfigError(
                f"{where}: unknown key {key}; see `tformer train --print-config` for every key"
            )
        if name == "train" and isinstance(values.get("time_budget"), str):
            values = {
                **values,
                "time_budget": parse_duration(
                    values["time_budget"], option=f"{where}: train.time_budget"
                ),
            }
        sections[name] = check_types(CLASSES[name], values, _naming(f"{where}: {name}."))
    return sections


def _naming(prefix: str) -> Callable[[str], str]:
    """How a message names a key of a section: ``--config run.yaml: model.n_heads``."""
    return lambda key: prefix + key


def dump_config(model: ModelConfig | None, train: TrainConfig, tokenizer: TokenizerSpec) -> str:
    """Configs as YAML that ``tformer train --config`` reads back (no model: resuming, so the
    checkpoint's architecture and tokenizer, and no tokenizer section either)."""
    data: dict[str, Any] = {} if model is None else {"model": model.to_dict()}
    data["train"] = train.to_dict()
    if model is not None:
        data["tokenizer"] = dataclasses.asdict(tokenizer)
    header = "# tformer train --config FILE (vocabulary sizes are set by the tokenizer)\n"
    return header + yaml.safe_dump(data, sort_keys=False)


# Fine-tuning an imported (published, already trained) model: a small learning rate after a
# short warm-up, as Hugging Face's translation fine-tuning examples use (2e-5 to 5e-5), and
# the best checkpoint by validation BLEU with early stopping. The warm-up is at most a tenth
# of the run (``warmup_share``; tformer.training.optim.capped_warmup says how), so a short run
# reaches its learning rate. Any flag, recipe or --config value given wins over these; a
# --warmup-steps given drops the cap too (the steps asked for are the steps taken).
IMPORTED_DEFAULTS: dict[str, Any] = {
    "lr": 5e-5,
    "warmup_steps": 200,
    "warmup_share": 0.1,
    "schedule": "constant",
    "val_bleu": 200,
    "best_metric": "bleu",
    "patience": 5,
}
# A language model (an imported GPT-2 or BERT) has no pairs to translate: the best by loss.
TRANSLATION_ONLY = ("val_bleu", "best_metric")


def resolve(
    settings: Settings, resume: Path | None = None, *, init_from: Path | None = None
) -> Resolved:
    """The configs of the run ``settings`` ask for (of the run in ``resume`` when resuming;
    with the architecture of checkpoint ``init_from`` when fine-tuning from it)."""
    sections = read_config_file(settings.config_file) if settings.config_file else {}
    try:
        return _resolve(settings, sections, resume, init_from)
    except ConfigError as error:
        raise _in_file(error, settings, sections) from error


def _in_file(
    error: ConfigError, settings: Settings, sections: dict[str, dict[str, Any]]
) -> ConfigError:
    """``error`` naming the ``--config`` file and key when the value it refuses came from
    there (the message starts with the value's flag), else ``error`` itself."""
    words = str(error).split()
    name = words[0].removeprefix("--").replace("-", "_").rstrip(":") if words else ""
    for section, values in sections.items():
        if name in values and name not in settings.values and name not in settings.tokenizer:
            return ConfigError(f"--config {settings.config_file}: {section}.{name}: {error}")
    return error


def _resolve(
    settings: Settings,
    sections: dict[str, dict[str, Any]],
    resume: Path | None,
    init_from: Path | None,
) -> Resolved:
    values = dict(settings.values)
    n_layers = values.pop("n_layers", None)
    if n_layers is not None:
        for name in ("n_encoder_layers", "n_decoder_layers"):
            values.setdefault(name, n_layers)
    given_model = {k: v for k, v in values.items() if k in MODEL_FIELDS}
    given_train = {k: v for k, v in values.items() if k in TRAIN_FIELDS}
    unknown = sorted(set(values) - MODEL_FIELDS - TRAIN_FIELDS)
    if unknown:
        raise ConfigError(f"unknown setting {unknown[0]!r}: not a ModelConfig or TrainConfig field")
    tokenizer = TokenizerSpec(**{**sections.get("tokenizer", {}), **settings.tokenizer})
    base = PRESETS[_preset_name(settings.preset)] if settings.preset else None
    # A preset names a size: --fit-budget keeps it as if given.
    given = {*values, *sections.get("model", {}), *sections.get("train", {}), *(base or {})}
    free = tuple(name for name in FIT_FIELDS if name not in given)
    if resume is not None:
        model, train = _resume(resume, settings, sections, given_train)
        return Resolved(model, train, tokenizer, free=free)
    file_train = sections.get("train", {})
    arch = {**sections.get("model", {}), **given_model}.get("arch", "encoder-decoder")
    recipe = _recipe(settings.recipe, {**file_train, **given_train}.get("data"), arch)
    if init_from is not None:
        saved, _ = _checked_against(init_from, settings, sections, "--init-from")
        defaults: dict[str, Any] = {}
        if ckpt.read_origin(ckpt.resolve(init_from)) is not None:  # an imported model
            defaults = imported_defaults(saved, recipe["train"], file_train, given_train)
        family = _family_training(saved.arch)
        train_values = _layered(family, defaults, recipe["train"], file_train, given_train)
        return Resolved(saved, TrainConfig(**train_values), tokenizer, tuple(defaults), free)
    family = _family_training(arch)
    train_values = _layered(family, recipe["train"], file_train, given_train)
    model_values = {
        **(recipe["model"] or PRESETS[DEFAULT_PRESET]),
        **sections.get("model", {}),
        **(base or {}),
        **given_model,
    }
    return Resolved(
        ModelConfig(**model_values), TrainConfig(**train_values), tokenizer, free=free
    )


def imported_defaults(model: ModelConfig, *given: Mapping[str, Any]) -> dict[str, Any]:
    """The IMPORTED_DEFAULTS a fine-tuned run of an imported ``model`` takes: those no layer
    of ``given`` (recipe, --config file, flags) sets, and for a language model none of the
    translation-only ones; a warm-up given in steps is not capped by the default share."""
    taken = {k for layer in given for k in layer}
    if "warmup_steps" in taken:
        taken.add("warmup_share")
    return {
        k: v
        for k, v in IMPORTED_DEFAULTS.items()
        if k not in taken and (model.is_seq2seq or k not in TRANSLATION_ONLY)
    }


def _family_training(arch: str) -> Mapping[str, Any]:
    """The family's own training defaults (none for a name ModelConfig will refuse)."""
    return family_record(arch).train_defaults if arch in FAMILY_RECORDS else {}


def _preset_name(name: str) -> str:
    if name not in PRESETS:
        raise ConfigError(f"--preset {name!r} is unknown; choose one of {', '.join(PRESETS)}")
    return name


def _recipe(
    name: str | None, data: str | None, arch: str = "encoder-decoder"
) -> dict[str, dict[str, Any]]:
    """The recipe's values; with no recipe named, 'dates' for the bundled data ('dates-text'
    for a language model's bundled text)."""
    if name is None and data is None:
        name = family_record(arch).default_recipe
    if name is None or name == "none":
        return {"model": {}, "train": {}}
    if name not in RECIPES:
        raise ConfigError(
            f"--recipe {name!r} is unknown; choose one of {', '.join(RECIPES)} or none"
        )
    return RECIPES[name]


def _layered(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Later layers win; one that sets any stopping rule drops the earlier layers' stops."""
    merged: dict[str, Any] = {}
    for layer in layers:
        if any(k in layer for k in STOPS):
            merged = {k: v for k, v in merged.items() if k not in STOPS}
        merged.update(layer)
    return merged


def _resume(
    run: Path,
    settings: Settings,
    sections: dict[str, dict[str, Any]],
    given_train: dict[str, Any],
) -> tuple[ModelConfig, TrainConfig]:
    """The saved configs, with the file's and the given training values on top; settings
    that contradict the saved architecture or tokenizer are refused, all named at once."""
    saved_model, saved_train = _checked_against(run, settings, sections, "--resume")
    # No stopping rule is dropped here: a resumed run keeps the limits it was not given anew.
    merged = {**saved_train.to_dict(), **sections.get("train", {}), **given_train}
    return saved_model, TrainConfig.from_dict(merged, source=str(run))


def _checked_against(
    path: Path, settings: Settings, sections: dict[str, dict[str, Any]], option: str
) -> tuple[ModelConfig, TrainConfig]:
    """The configs saved in checkpoint ``path`` (named by ``option``), once every setting
    that contradicts its architecture or tokenizer has been refused."""
    folder = ckpt.resolve(path)
    try:
        config = ckpt.read_verified_config(folder)
    except CheckpointError as error:
        if option != "--resume" or not ckpt.is_run_dir(folder.parent):
            raise
        raise with_older_checkpoint(error, folder.parent, folder) from error
    saved_model, saved_train, _ = ckpt.parse_configs(folder, config)
    check_resume_settings(
        folder,
        config,
        saved_model,
        given={k: v for k, v in settings.values.items() if k in {*MODEL_FIELDS, "n_layers"}},
        preset=settings.preset,
        recipe=settings.recipe,
        sections=sections,
        config_file=settings.config_file,
        tokenizer=settings.tokenizer,
        option=option,
    )
    return saved_model, saved_train


def with_older_checkpoint(error: CheckpointError, run: Path, folder: Path) -> CheckpointError:
    """``error`` about a damaged checkpoint, naming the newest older one to resume instead."""
    step = ckpt.step_of(folder)
    older = [p for p in ckpt.step_dirs(run) if step is not None and (ckpt.step_of(p) or 0) < step]
    if not older:
        return error
    return CheckpointError(
        f"{error}; resume from an earlier checkpoint instead: --resume {older[-1]}"
    )


def architecture(config: ModelConfig) -> dict[str, Any]:
    """The values of ``config`` a user chooses (not those set from the tokenizer)."""
    return {k: v for k, v in config.to_dict().items() if k not in DERIVED}


def check_architecture(
    saved: ModelConfig, requested: Mapping[str, Any], option: str = "--resume"
) -> None:
    """On resume (and with ``--init-from``) the saved architecture wins; requested values that
    contradict it are refused (every one named)."""
    conflicts = model_conflicts(saved, requested)
    if conflicts:
        raise ConfigError(
            f"{'; '.join(conflicts)}: conflicts with the architecture of the checkpoint "
            f"{ROLES[option]} ({option}); leave these values out to keep the saved architecture"
        )


def changed_settings(saved: TrainConfig, current: TrainConfig) -> list[str]:
    """Training flags that differ from the checkpoint, as ``--flag old -> new``."""
    before, after = saved.to_dict(), current.to_dict()
    return [
        f"{flag(key)} {before[key]} -> {after[key]}"
        for key in after
        if before.get(key) != after[key]
    ]
