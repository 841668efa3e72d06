"""Named architectures (presets) and recipes: an architecture plus training settings, one
YAML file each in ``tformer/recipes/``."""

from __future__ import annotations

from importlib import resources
from typing import Any

from tformer import safe_yaml
from tformer.config.model import ModelConfig
from tformer.errors import ConfigError

# Named architectures. "base" is the paper's base model; the smaller ones keep its proportions
# (d_ff = 4 * d_model) and are sized for a CPU.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=256),
    "small": dict(d_model=256, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, d_ff=1024),
    "base": dict(d_model=512, n_heads=8, n_encoder_layers=6, n_decoder_layers=6, d_ff=2048),
    # A distillation student (Kasai et al. 2021): the layers only, so the recipe's (or the
    # default's) width is kept; a deep encoder runs once a sentence, one decoder layer a token.
    "student": dict(n_encoder_layers=6, n_decoder_layers=1),
}
DEFAULT_PRESET = "small"


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A ``ModelConfig`` from a named preset, with ``None`` overrides ignored."""
    if name not in PRESETS:
        raise ConfigError(f"--preset {name!r} is unknown; choose one of {', '.join(PRESETS)}")
    # A preset of layers only (student) takes the default preset's width, as `train` gives it.
    values = {**PRESETS[DEFAULT_PRESET], **PRESETS[name]}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return ModelConfig(**values)


# Recipes: an architecture plus training settings that work well together for one data set,
# one YAML file each in tformer/recipes/ (with the reasons for their values). `tformer train`
# applies a recipe's values in place of the defaults; a --config file and flags given still win.
RECIPE_SECTIONS = ("model", "train")


def _load_recipes() -> dict[str, dict[str, dict[str, Any]]]:
    recipes = {}
    for entry in sorted(resources.files("tformer.recipes").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            text = entry.read_text(encoding="utf-8")
            data = safe_yaml.load(text, f"recipe {entry.name}") or {}
            recipes[entry.name.removesuffix(".yaml")] = {
                k: dict(data.get(k) or {}) for k in RECIPE_SECTIONS
            }
    return recipes


RECIPES: dict[str, dict[str, dict[str, Any]]] = _load_recipes()
