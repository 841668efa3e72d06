"""Errors meant for users.

Library code raises these with a message that names the file or flag, the bad value and the fix;
the CLI's single error boundary prints that message as one red line and exits with ``exit_code``.
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
    """A checkpoint or tokenizer file is missing, partial, corrupt or foreign."""

    exit_code = 4


class DeviceError(TformerError):
    """The requested device is not available on this machine."""

    exit_code = 5
