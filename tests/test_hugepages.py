"""Importing tformer turns on torch's huge-page allocation for large CPU tensors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# Allocate and touch 256 MB; report the switch and the page faults that took.
PROBE = """
import os, resource
import tformer, torch
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
before = faults()
x = torch.ones(64 << 20)
print(os.environ["THP_MEM_ALLOC_ENABLE"], faults() - before)
"""


def probe(**env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
        check=True,
    ).stdout.split()
    return out[0], int(out[1])


def test_import_sets_the_switch_and_an_explicit_setting_wins() -> None:
    on, on_faults = probe()
    off, off_faults = probe(THP_MEM_ALLOC_ENABLE="0")
    assert (on, off) == ("1", "0")
    # 256 MB in 4 KB pages is 65,536 first-touch faults.
    assert off_faults > 60_000
    if not THP.exists() or "[never]" in THP.read_text():
        pytest.skip(f"transparent huge pages are off on this machine ({THP})")
    # In 2 MB pages it is 128; allow for the kernel not always finding a free huge page.
    assert on_faults < off_faults / 10, (on_faults, off_faults)
