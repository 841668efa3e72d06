"""Frozen configuration: one ``ModelConfig`` for the architecture, one ``TrainConfig`` for training.

Both are built once (by the CLI or by user code), validated in ``__post_init__`` with messages
that name the CLI flag, and written into every checkpoint's ``config.json``. The model only ever
sees ``ModelConfig``; values derived at run time (vocabulary sizes from the tokenizer) go in with
``dataclasses.replace``.

One module a kind of thing: ``checks`` (the type and bound checks every value goes through),
``model`` (``ModelConfig``), ``train`` (``TrainConfig``), ``presets`` (named architectures and
the recipes), ``tokens`` (the special tokens). Everything is importable from here.
"""

from tformer.config.checks import (
    INT_LIMIT,
    MAX_LEN_LIMIT,
    SEED_LIMIT,
    article,
    check_int,
    check_numbers,
    check_text,
    check_types,
    flag,
    kind_of,
    one_of,
    strict_from_dict,
)
from tformer.config.families import FAMILY_RECORDS, Family, family_record
from tformer.config.model import (
    ADDED_MODEL_KEYS,
    GATED_ACTIVATIONS,
    Activation,
    Arch,
    ModelConfig,
    Norm,
    Normalization,
    Positions,
)
from tformer.config.presets import (
    DEFAULT_PRESET,
    PRESETS,
    RECIPE_SECTIONS,
    RECIPES,
    preset,
)
from tformer.config.tokens import (
    BOS,
    BOS_ID,
    EOS,
    EOS_ID,
    MASK,
    MASK_ID,
    PAD,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK,
    UNK_ID,
)
from tformer.config.train import (
    BestMetric,
    FinalEval,
    PrecisionName,
    Schedule,
    TrainConfig,
    parse_duration,
)

__all__ = [
    "ADDED_MODEL_KEYS",
    "BOS",
    "BOS_ID",
    "DEFAULT_PRESET",
    "EOS",
    "EOS_ID",
    "FAMILY_RECORDS",
    "GATED_ACTIVATIONS",
    "INT_LIMIT",
    "MASK",
    "MASK_ID",
    "MAX_LEN_LIMIT",
    "PAD",
    "PAD_ID",
    "PRESETS",
    "RECIPES",
    "RECIPE_SECTIONS",
    "SEED_LIMIT",
    "SPECIAL_TOKENS",
    "UNK",
    "UNK_ID",
    "Activation",
    "Arch",
    "BestMetric",
    "Family",
    "FinalEval",
    "ModelConfig",
    "Norm",
    "Normalization",
    "Positions",
    "PrecisionName",
    "Schedule",
    "TrainConfig",
    "article",
    "check_int",
    "check_numbers",
    "check_text",
    "check_types",
    "family_record",
    "flag",
    "kind_of",
    "one_of",
    "parse_duration",
    "preset",
    "strict_from_dict",
]
