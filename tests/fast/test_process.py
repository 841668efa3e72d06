"""Importing tformer changes nothing in the process; configure_process applies the settings.

Also the layering the package promises: the model imports nothing from the speed-ups.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tformer

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
PACKAGE = Path(tformer.__file__).parent

# Import tformer (and optionally apply the settings) before torch, then allocate and touch
# 256 MB; report the environment's changes, the switch and the page faults that took.
PROBE = """
import json, os, resource, sys
before = dict(os.environ)
import tformer
import tformer.cli
after_import = {k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}
settings = None
if sys.argv[1] == "configure":
    settings = tformer.configure_process()
import torch
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
start = faults()
x = torch.ones(64 << 20)
print(json.dumps({"changed": sorted(after_import), "switch": os.environ.get("THP_MEM_ALLOC_ENABLE"),
                  "faults": faults() - start, "settings": settings and settings.__dict__}))
"""


def probe(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.mark.slow
def test_import_tformer_changes_nothing_and_configure_process_turns_huge_pages_on() -> None:
    untouched = probe("import")
    assert untouched["changed"] == [] and untouched["switch"] is None
    on = probe("configure")
    assert on["changed"] == [] and on["switch"] == "1" and on["settings"]["huge_pages"]
    off = probe("configure", THP_MEM_ALLOC_ENABLE="0")  # an explicit setting wins
    assert off["switch"] == "0" and not off["settings"]["huge_pages"]
    # 256 MB in 4 KB pages is 65,536 first-touch faults.
    assert untouched["faults"] > 60_000 and off["faults"] > 60_000
    if not THP.exists() or "[never]" in THP.read_text():
        pytest.skip(f"transparent huge pages are off on this machine ({THP})")
    # In 2 MB pages it is 128; allow for the kernel not always finding a free huge page.
    assert on["faults"] < untouched["faults"] / 10, (on, untouched)


def test_import_tformer_loads_neither_torch_nor_the_allocator_setting() -> None:
    code = (
        "import sys, tformer, tformer.cli; from tformer.fast import malloc; "
        "print('torch' in sys.modules, malloc._applied)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_command_line_skips_the_last_collection_and_still_runs_exit_handlers() -> None:
    """At exit the command line freezes the heap, so the interpreter's final garbage collection
    does not walk all of torch; importing does not, and earlier exit handlers still run after."""
    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('at exit', gc.get_freeze_count() > 0))\n"
        "import tformer.cli\n"
        "print('imported', gc.get_freeze_count() > 0)\n"
        "sys.argv = ['tformer', '--version']\n"
        "tformer.cli.main()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[0] == "imported False" and lines[1].startswith("tformer ")
    assert lines[2:] == ["at exit True"]


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` statement in ``path`` names, at any depth."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_model_imports_nothing_from_the_speed_ups_or_above_it() -> None:
    allowed = ("tformer.model", "tformer.config", "tformer.errors", "tformer.version")
    for path in sorted((PACKAGE / "model").glob("*.py")):
        for name in imported_modules(path):
            if name.startswith("tformer"):
                assert name.startswith(allowed), f"{path.name} imports {name}"


def test_every_public_name_resolves() -> None:
    for name in tformer.__all__:
        assert getattr(tformer, name) is not None, name
    with pytest.raises(AttributeError, match="no_such_name"):
        tformer.no_such_name  # noqa: B018


def test_dir_lists_the_public_api_only() -> None:
    import importlib

    fresh = importlib.reload(tformer)
    names = dir(fresh)
    assert names == sorted(fresh.__all__)
    assert {"Any", "importlib", "annotations", "TYPE_CHECKING"}.isdisjoint(names)
    assert {"generate", "inspect_attention", "load_checkpoint", "__version__"} <= set(names)
