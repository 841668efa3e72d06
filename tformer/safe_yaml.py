"""YAML read with bounds: what `tformer train --config` and the recipes are read with.

``yaml.safe_load`` builds no objects, but it still expands aliases (nested ones, "billion
laughs", grow a few lines into gigabytes), keeps the last of two equal keys, nests as deep as
the file does and reads as much as it is given. ``BoundedLoader`` refuses each of these with a
line and column: a configuration has no use for any of them.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode

from tformer.errors import ConfigError

MAX_FILE_BYTES = 1 << 20  # a configuration is a few hundred bytes
MAX_DEPTH = 8  # sections hold values: two levels are used
MAX_SCALAR_CHARS = 4096  # the longest path Linux accepts


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without aliases, duplicate keys, deep nesting or huge scalars."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ConstructorError(
                None,
                None,
                "aliases (*name) are not accepted: write the value out",
                event.start_mark,
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ConstructorError(
                    None,
                    None,
                    f"nested deeper than {MAX_DEPTH} levels",
                    self.peek_event().start_mark,
                )
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, ScalarNode) and len(node.value) > MAX_SCALAR_CHARS:
            raise ConstructorError(
                None,
                None,
                f"a value of {len(node.value):,} characters, over {MAX_SCALAR_CHARS:,}",
                node.start_mark,
            )
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)  # merge keys (<<) first: they are not duplicates
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable: the constructor below names it
                continue
            if duplicate:
                raise ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep)


# YAML 1.1 reads 3e-4 (no dot) as a string; YAML 1.2, and whoever writes a learning rate,
# reads it as a number.
BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def problem(error: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong and where (line, column)."""
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        what = " ".join(str(error.problem or error.context or "invalid YAML").split())
        return what if mark is None else f"{what} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(error).split())[:200] or type(error).__name__


def load(text: str, where: str) -> Any:
    """The data of YAML ``text``, refused in one line naming ``where`` when unsafe or invalid.

    Raises:
        ConfigError: invalid YAML, an alias, a duplicate key, deep nesting or a huge value.
    """
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as error:
        raise ConfigError(f"{where}: not a usable YAML file: {problem(error)}") from error
    except (ValueError, RecursionError) as error:  # int() of too many digits, say
        raise ConfigError(f"{where}: not a usable YAML file: {error}"[:300]) from error


def read_file(path: Path, where: str) -> Any:
    """The data of YAML file ``path`` (a regular file of at most ``MAX_FILE_BYTES``, UTF-8).

    Raises:
        ConfigError: naming ``where`` (e.g. "--config run.yaml") and what is wrong.
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ConfigError(f"{where}: not a regular file")  # a FIFO or /dev/zero never ends
        with open(path, "rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"{where}: cannot read it ({error.strerror})") from error
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{where}: over {MAX_FILE_BYTES:,} bytes, too large for a configuration")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise ConfigError(f"{where}: line {line}: not UTF-8 text (byte {error.start})") from None
    return load(text, where)
