"""Errors meant for users.

Library code raises these with a message that names the file or flag, the bad value and the fix;
the CLI's single error boundary prints that message as one red line and exits with ``exit_code``.

Exit codes: 2 bad option, 3 bad data, 4 bad or unwritable checkpoint, 5 missing device or out of
memory, 6 training diverged (NaN / inf), 130 / 143 stopped by SIGINT / SIGTERM.
"""

from __future__ import annotations


class TformerError(Exception):
    """Base class of every error tformer reports to a user."""

    exit_code: int = 1


class ConfigError(TformerError):
    """A flag or configuration value is invalid (``--n-heads 6 must divide --d-model 512``)."""

    exit_code = 2


class DataError(TformerError):
    """A data file or data set is missing, malformed or unusable."""

    exit_code = 3


class CheckpointError(TformerError):
    """A checkpoint or tokenizer file is missing, partial, corrupt, foreign or cannot be written."""

    exit_code = 4


class DeviceError(TformerError):
    """The requested device is not available on this machine."""

    exit_code = 5


class OutOfMemoryError(DeviceError):
    """The device ran out of memory; the message names the batch size and the flag to lower."""


class DivergedError(TformerError):
    """Training produced a NaN or infinite loss or gradient; the last good checkpoint is kept."""

    exit_code = 6


class TrainingInterrupted(TformerError):
    """Training stopped on SIGINT / SIGTERM after finishing its step and saving a checkpoint."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Aborted(KeyboardInterrupt):
    """A second SIGINT / SIGTERM: stop at once (atomic saves leave nothing half-written)."""

    def __init__(self, exit_code: int) -> None:
        super().__init__()
        self.exit_code = exit_code
