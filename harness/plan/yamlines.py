"""YAML loading that remembers where every value came from, for `file:line: message` errors.

A suite cannot exhaust the machine: anchors and aliases are allowed, but the values they repeat may
add at most `ALIAS_BUDGET` nodes to the document (an alias "bomb" of nested aliases would otherwise
expand into billions), an alias may not refer to its own anchor, and nesting is bounded by Python's
recursion limit. Each refusal is a SuiteError naming the line.

Size is bounded before anything is expanded: a file over `MAX_BYTES` is refused before it is parsed,
and a document of more than `MAX_NODES` values before it is validated (a 13 MB list of 1.6 M values
once took minutes and gigabytes to reach --max-cases). The built-in smoke suite, the largest, is
67 KB and about 10,000 values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from attnbench.errors import SuiteError

Path_ = tuple[Any, ...]
ALIAS_BUDGET = 10_000  # nodes that aliases may add to a document, once expanded
MAX_BYTES = 1 << 20  # a suite or expectations file larger than this is refused unread
MAX_NODES = 200_000  # values (mappings, lists, scalars) a document may hold


def load(path: Path) -> tuple[Any, dict[Path_, int]]:
    """Parse a YAML file -> (data, {key path: 1-based line}). Syntax errors and duplicate keys raise SuiteError."""
    try:
        size = Path(path).stat().st_size
        if size > MAX_BYTES:
            raise SuiteError(
                path, None, f"the file is {size / (1 << 20):.1f} MiB; a suite or expectations file may be at most "
                f"{MAX_BYTES >> 20} MiB (describe large sweeps with sweep/zip ranges, or split the file)",
            )  # fmt: skip
        raw = Path(path).read_bytes()
    except OSError as e:
        raise SuiteError(path, None, f"cannot read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise SuiteError(path, line, f"not UTF-8 text (byte 0x{raw[e.start]:02x}); save the suite as UTF-8") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise SuiteError(path, 1, "the file is empty")
        lines: dict[Path_, int] = {}
        _walk(node, (), lines, path, _Budget())
        data = loader.construct_document(node)
    except RecursionError:
        raise SuiteError(path, None, "the YAML is nested too deeply") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        msg = " ".join(str(x) for x in (e.context, e.problem) if x)
        raise SuiteError(path, mark.line + 1 if mark else None, f"YAML syntax: {msg}") from None
    except yaml.YAMLError as e:
        raise SuiteError(path, None, f"YAML: {e}") from None
    finally:
        loader.dispose()
    return data, lines


class _Budget:
    """Nodes seen so far (a node met again was reached through an alias) and the nodes being walked."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.open: set[int] = set()
        self.repeated = 0


def _walk(node: yaml.Node, at: Path_, lines: dict[Path_, int], path: Path, budget: _Budget) -> None:
    """Record the line of every key path; refuse recursive aliases and aliases that expand too far."""
    line = node.start_mark.line + 1
    if id(node) in budget.open:
        raise SuiteError(path, line, "an alias refers to its own anchor (a recursive document)")
    if id(node) in budget.seen:
        budget.repeated += 1
        if budget.repeated > ALIAS_BUDGET:
            raise SuiteError(
                path,
                line,
                f"YAML aliases expand to more than {ALIAS_BUDGET} values (the anchor here is repeated too often); "
                "write the values out or use fewer nested aliases",
            )
    budget.seen.add(id(node))
    if len(budget.seen) > MAX_NODES:
        raise SuiteError(
            path, line, f"the document holds more than {MAX_NODES} values; describe large sweeps with sweep/zip "
            "ranges, or split the file",
        )  # fmt: skip
    lines.setdefault(at, line)
    if not isinstance(node, yaml.MappingNode | yaml.SequenceNode):
        return
    budget.open.add(id(node))
    _walk_children(node, at, lines, path, budget)
    budget.open.discard(id(node))


def _walk_children(node: yaml.Node, at: Path_, lines: dict[Path_, int], path: Path, budget: _Budget) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else str(k.value)
            line = k.start_mark.line + 1
            if key in seen:
                raise SuiteError(path, line, f"duplicate key {key!r} (first on line {seen[key]})")
            seen[key] = line
            lines[at + (key,)] = line
            _walk(v, at + (key,), lines, path, budget)
    else:
        for i, v in enumerate(node.value):
            _walk(v, at + (i,), lines, path, budget)


def line_of(lines: dict[Path_, int], at: Path_) -> int | None:
    """The line of the longest prefix of `at` that has one."""
    at = tuple(at)
    while at not in lines and at:
        at = at[:-1]
    return lines.get(at)
