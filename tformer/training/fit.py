"""A run's regularisation fitted to its length (``--fit-budget``).

A time budget is a number of epochs that depends on the machine: the same hour of Multi30k is
12 epochs on a slow CPU and 42 on a fast one. Overfitting follows the epochs, so a recipe
chosen for one length fits the others badly: dropout tuned for 29 epochs lets a 42-epoch run
overfit after its 18th, and averaging the last 1,600 steps averages most of a 1,000-step run.
Under ``--fit-budget`` the training loop estimates the run's length from the pace of its first
steps (as it does for the warm-up) and fits dropout, attention dropout and the checkpoints kept
for averaging to it, once; values given as flags or in ``--config`` are kept as given. The runs
that chose the rule are in docs/training.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from torch import nn

from tformer.config import ModelConfig, TrainConfig, flag
from tformer.model import TransformerBase
from tformer.model.attention import MultiHeadAttention

# The fields of the narrower model (tformer.training.sizing); all must be free to change any.
SIZE_FIELDS = ("d_model", "d_ff", "n_encoder_layers", "n_decoder_layers")
# Its step's settings, changed with it where free: a narrower model takes a larger step, and
# a longer warm-up keeps the larger rate stable.
STEP_FIELDS = ("lr", "warmup_steps")
# The settings the rule may choose (those not given as flags or in --config).
FIT_FIELDS = ("dropout", "attention_dropout", "keep_last", *SIZE_FIELDS, *STEP_FIELDS)
# From this many epochs a run gets LONG_RUN's regularisation (where its own is lighter):
# dropout 0.25 did best over 26 and 29 epochs (by validation BLEU) and overfitted after the
# 18th of 42, where 0.3 with attention dropout 0.1 still improved at the 35th (docs/training.md).
LONG_RUN_EPOCHS = 32.0
LONG_RUN = {"dropout": 0.3, "attention_dropout": 0.1}
# The most of a run the kept checkpoints may span: the average of the last 1,600 steps of
# 2,500 matched the last checkpoint, and of 1,063 steps (all of them) lost to it.
AVERAGED_SHARE = 2 / 3


@dataclasses.dataclass(frozen=True)
class Fitted:
    """The configs fitted to a run of about ``steps`` steps (``epochs`` epochs)."""

    model: ModelConfig
    train: TrainConfig
    steps: int
    epochs: float

    def changes(self, model: ModelConfig, train: TrainConfig) -> list[str]:
        """What fitting changed, as '--flag old -> new' for the run's report."""
        return changed_fields(FIT_FIELDS, (model, train), (self.model, self.train))


def changed_fields(
    names: Sequence[str],
    before: tuple[ModelConfig, TrainConfig],
    after: tuple[ModelConfig, TrainConfig],
) -> list[str]:
    """The ``names`` whose values differ between two pairs of configs, as '--flag old -> new'
    (the run's report of what --fit-budget chose)."""
    old = {**before[0].to_dict(), **before[1].to_dict()}
    new = {**after[0].to_dict(), **after[1].to_dict()}
    return [f"{flag(k)} {old[k]} -> {new[k]}" for k in names if old[k] != new[k]]


def fit(
    model: ModelConfig, train: TrainConfig, steps: float, epochs: float, free: Collection[str]
) -> Fitted:
    """The rule: configs for a run of about ``steps`` steps and ``epochs`` epochs, changing
    only the FIT_FIELDS in ``free`` (never lowering a dropout the configs already have)."""
    regularise = {
        name: max(value, getattr(model, name))
        for name, value in LONG_RUN.items()
        if epochs >= LONG_RUN_EPOCHS and name in free
    }
    keep = train.keep_last
    if "keep_last" in free:
        keep = min(keep, max(1, int(AVERAGED_SHARE * steps / train.save_every)))
    return Fitted(
        dataclasses.replace(model, **regularise),
        dataclasses.replace(train, keep_last=keep),
        int(steps),
        epochs,
    )


def set_dropout(model: TransformerBase, config: ModelConfig) -> None:
    """Give a built model ``config``'s dropout and attention dropout, as if built with them
    (dropout draws no parameters, so the weights and the optimizer stay as they are)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = config.dropout
        elif isinstance(module, MultiHeadAttention):
            module.dropout = config.attention_dropout
    model.config = config
