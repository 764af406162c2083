"""YAML loading that remembers where every value came from, for `file:line: message` errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from attnbench.errors import SuiteError

Path_ = tuple[Any, ...]


def load(path: Path) -> tuple[Any, dict[Path_, int]]:
    """Parse a YAML file -> (data, {key path: 1-based line}). Syntax errors and duplicate keys raise SuiteError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise SuiteError(path, None, f"cannot read: {e.strerror or e}") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise SuiteError(path, 1, "the file is empty")
        lines: dict[Path_, int] = {}
        _walk(node, (), lines, path)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        msg = " ".join(str(x) for x in (e.context, e.problem) if x)
        raise SuiteError(path, mark.line + 1 if mark else None, f"YAML syntax: {msg}") from None
    except yaml.YAMLError as e:
        raise SuiteError(path, None, f"YAML: {e}") from None
    finally:
        loader.dispose()
    return data, lines


def _walk(node: yaml.Node, at: Path_, lines: dict[Path_, int], path: Path) -> None:
    lines.setdefault(at, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else str(k.value)
            line = k.start_mark.line + 1
            if key in seen:
                raise SuiteError(path, line, f"duplicate key {key!r} (first on line {seen[key]})")
            seen[key] = line
            lines[at + (key,)] = line
            _walk(v, at + (key,), lines, path)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _walk(v, at + (i,), lines, path)


def line_of(lines: dict[Path_, int], at: Path_) -> int | None:
    """The line of the longest prefix of `at` that has one."""
    at = tuple(at)
    while at not in lines and at:
        at = at[:-1]
    return lines.get(at)
