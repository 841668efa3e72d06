"""Checkpoints: atomic files and manifest, save / load, verify, run folders, averaging.

The public API is re-exported here, so callers write ``from tformer import checkpoint as ckpt``
or ``from tformer.checkpoint import load_checkpoint`` without knowing which module holds what.
"""

from tformer.checkpoint.averaging import average_checkpoints
from tformer.checkpoint.files import CONFIG, MANIFEST, WEIGHTS, write_text_atomic
from tformer.checkpoint.run_dir import (
    BEST,
    CHOICES,
    LATEST,
    METRICS,
    append_metrics,
    checkpoint_name,
    is_checkpoint_dir,
    is_run_dir,
    read_metrics,
    resolve,
    step_dirs,
    step_of,
)
from tformer.checkpoint.store import (
    Checkpoint,
    Tokenizers,
    load_checkpoint,
    parse_configs,
    read_config,
    read_origin,
    read_verified_config,
    save_checkpoint,
)
from tformer.checkpoint.training_state import load_training_state
from tformer.checkpoint.verify import Check, verify_checkpoint

__all__ = [
    "BEST",
    "CHOICES",
    "CONFIG",
    "LATEST",
    "MANIFEST",
    "METRICS",
    "WEIGHTS",
    "Check",
    "Checkpoint",
    "Tokenizers",
    "append_metrics",
    "average_checkpoints",
    "checkpoint_name",
    "is_checkpoint_dir",
    "is_run_dir",
    "load_checkpoint",
    "load_training_state",
    "parse_configs",
    "read_config",
    "read_metrics",
    "read_origin",
    "read_verified_config",
    "resolve",
    "save_checkpoint",
    "step_dirs",
    "step_of",
    "verify_checkpoint",
    "write_text_atomic",
]
