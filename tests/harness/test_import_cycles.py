"""No import cycle among attnbench's modules, the hidden ones included: every import in every module,
at module level or inside a function (where a cycle hides until some call order trips it), is an edge."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the package layout of pyproject.toml's package-dir
PACKAGES = {"attnbench": "harness", "attnbench.kernels": "kernels", "attnbench.references": "references",
            "attnbench.suites": "suites"}  # fmt: skip


def modules(root: Path = ROOT) -> dict[str, Path]:
    """attnbench module name -> source file."""
    found: dict[str, Path] = {}
    for pkg, folder in PACKAGES.items():
        base = root / folder
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([pkg, *parts])] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The attnbench modules `name` imports anywhere in its source (`from attnbench import x` names the
    submodule x where there is one, else the package)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import attnbench.ops.base.x`: the longest known module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def cycles(root: Path = ROOT) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    mods = modules(root)
    graph = {m: imports(m, p, set(mods)) for m, p in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert cycles() == []


def test_the_finder_sees_a_cycle_held_open_by_an_import_inside_a_function(tmp_path):
    pkg = tmp_path / "harness"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from attnbench import b\n")
    (pkg / "b.py").write_text("def f():\n    from attnbench.sub.c import g\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from .. import a\n")  # relative, back to the top
    (pkg / "d.py").write_text("import attnbench.a\n")  # imports into the cycle, not part of it
    assert cycles(tmp_path) == [["attnbench.a", "attnbench.b", "attnbench.sub.c"]]
    (pkg / "b.py").write_text("def f():\n    pass\n")
    assert cycles(tmp_path) == []
