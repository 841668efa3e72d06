"""Which data a checkpoint goes with: the one answer for every command that reads a split of
it when ``--data`` is not given (evaluate, score, ablate, align).

A checkpoint trained by tformer records its ``--data`` (None: the bundled data). An imported
model records none: its weights were trained elsewhere, so scoring it on the bundled data would
be a number about nothing. Such a checkpoint, and one never trained at all (step 0), is refused
without ``--data``, naming where it came from.
"""

from __future__ import annotations

from pathlib import Path

from tformer.checkpoint.run_dir import resolve
from tformer.checkpoint.store import ORIGIN, parse_configs, read_verified_config
from tformer.config import TrainConfig
from tformer.errors import DataError
from tformer.paths import excerpt


def trained_on(checkpoint: Path) -> TrainConfig:
    """The training settings of ``checkpoint`` that name its data (``data``, the fields).

    Raises:
        DataError: the checkpoint records no training data (an import, or never trained).
        CheckpointError: the checkpoint cannot be read.
    """
    folder = resolve(checkpoint)
    config = read_verified_config(folder)
    _, train, step = parse_configs(folder, config)
    origin = config.get(ORIGIN)
    if train.data is None and isinstance(origin, dict):
        raise DataError(
            f"{checkpoint}: an imported model (from {excerpt(origin.get('source'))}) records no "
            "training data; give --data with the data to read"
        )
    if train.data is None and step == 0:
        raise DataError(
            f"{checkpoint}: was never trained, so it records no training data; give --data "
            "with the data to read"
        )
    return train
