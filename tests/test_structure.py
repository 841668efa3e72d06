"""The package's shape holds: modules and functions of a readable size, and the decoding
step's maths in ``model/`` only (``fast/`` supplies kernels and caches)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tformer.fast.accelerate import KERNELS
from tformer.fast.int8 import Int8MultiHeadAttention

PACKAGE = Path(__file__).resolve().parents[1] / "tformer"
MODULE_LINES = 450
FUNCTION_LINES = 80


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_is_at_most_450_lines() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MODULE_LINES}  # fmt: skip
    assert not long, f"modules over {MODULE_LINES} lines: {long}"


def test_every_function_is_at_most_80_lines() -> None:
    long = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE)}:{node.name}"] = lines
    assert not long, f"functions over {FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize(
    "fast", [*KERNELS.values(), Int8MultiHeadAttention], ids=lambda cls: cls.__name__
)
def test_a_fast_class_replaces_kernels_not_the_step(fast: type) -> None:
    """Each fast subclass overrides methods its model class has only where they are kernels:
    the decoding step and the attention's forward stay the model's own."""
    own = set(vars(fast))
    assert not own & {"step", "new_qkv", "sublayers", "inputs"}, own
    if fast.__name__.endswith("MultiHeadAttention"):
        assert "forward" not in own
