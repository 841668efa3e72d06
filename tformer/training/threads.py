"""The CPU threads a run trains with: the same for the whole run, and again after a resume.

The thread count changes the order of floating-point sums, so a run's weights depend on it. A
run keeps the count it starts with (one per physical core, or ``--threads``) whatever other
tformer processes do beside it (:func:`tformer.fast.sharing.hold`), records it in each
checkpoint, and a resume takes it back. The one case where a resumed run can differ from an
uninterrupted one is a different count chosen on purpose (``--threads``, ``OMP_NUM_THREADS``)
or a machine with fewer cores than the count; the run says so.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from tformer.errors import CheckpointError
from tformer.fast import sharing

MAX_THREADS = 4096  # a trainer state recording more was not written by a real run


def saved_threads(state: dict[str, Any], folder: Path | None) -> int | None:
    """The thread count recorded in a trainer state (None in checkpoints older than it).

    Raises:
        CheckpointError: the recorded value is not a count.
    """
    value = state.get("threads")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
        raise CheckpointError(
            f"{folder}: trainer_state.json records threads {value!r}, which is not a thread "
            f"count (1 to {MAX_THREADS}); the file was not written by tformer"
        )
    return value


def keep_threads(state: dict[str, Any], device: torch.device, folder: Path | None) -> list[str]:
    """Fix this process's CPU threads for the run: its own count, or the resumed run's.

    Returns the lines to print (another training beside this one; a resume whose count differs).
    """
    notes = [note] if (note := sharing.hold()) else []
    saved = saved_threads(state, folder)
    current = torch.get_num_threads()
    if device.type != "cpu" or saved is None or saved == current:
        return notes
    cores = os.cpu_count() or 1
    if "OMP_NUM_THREADS" not in os.environ and saved <= cores:
        torch.set_num_threads(saved)
        return [*notes, f"resuming with the {saved} CPU threads the run trained with"]
    why = "--threads / OMP_NUM_THREADS" if saved <= cores else f"this machine has {cores} cores"
    notes.append(
        f"resuming with {current} CPU threads where the run trained with {saved} ({why}): "
        "the weights will differ in the last bits from an uninterrupted run's"
    )
    return notes


def threads_state(device: torch.device) -> dict[str, int]:
    """What a checkpoint records of the threads (CPU runs only: a GPU's sums do not depend on
    the host's threads)."""
    return {"threads": torch.get_num_threads()} if device.type == "cpu" else {}
