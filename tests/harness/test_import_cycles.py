"""No import cycle among attnbench's modules, the hidden ones included: every import in every module,
at module level or inside a function (where a cycle hides until some call order trips it), is an edge.
And the layering of docs/architecture.md: no module imports one of a later stage."""

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


# ---- the layering -------------------------------------------------------------------------------
# The stages of docs/architecture.md, lowest first. A module may import its own stage and any of a lower
# rank, never a higher one, nor a sibling of the same rank (plan and store: neither reads the other).
# references/ import nothing of attnbench but themselves (they must stand alone); kernels/ (the backends)
# build on the core and the references only.
RANKS = {"references": 0, "core": 1, "kernels": 2, "check": 3, "plan": 4, "store": 4, "run": 5, "report": 6,
         "cli": 7}  # fmt: skip
STAGES = ("check", "plan", "store", "run", "report", "cli")  # the subpackages of harness/
# harness/'s top level: the model every stage and every backend shares (kernels/ and plugins import these
# by name). A new module at the top is a test failure until it is put in a stage or named here.
CORE = {"attnbench", "attnbench.errors", "attnbench.dtypes", "attnbench.buffers", "attnbench.case",
        "attnbench.backend", "attnbench.cacheroot", "attnbench.graph_capture", "attnbench.launch_hiding"}  # fmt: skip
FACADE = "attnbench"  # the package: its public names (Case, register_check) re-exported lazily, from any stage
# Imports that cross the layers on purpose, each with its reason; any other is a failure.
ALLOWED = {
    ("attnbench.kernels.flashinfer.prebuild", "attnbench.plan.suite"):
        "a command-line tool beside the FlashInfer adapter: it reads suites to know which kernels to compile",
}  # fmt: skip


def stage_of(module: str) -> str | None:
    """The stage a module belongs to, or None for a top-level module that is in no stage."""
    parts = module.split(".")
    if module == "attnbench.__main__":
        return "cli"
    if len(parts) > 1 and parts[1] in ("references", "kernels"):
        return parts[1]
    if len(parts) > 1 and parts[1] in STAGES:
        return parts[1]
    if module in CORE or (len(parts) > 1 and parts[1] in ("ops", "suites")):
        return "core"
    return None


def layering_violations(root: Path = ROOT) -> list[str]:
    """Every import (module level or inside a function) that goes up the stages or sideways, and every
    module at harness/'s top level that is in no stage."""
    mods = modules(root)
    out = []
    for name, path in sorted(mods.items()):
        own = stage_of(name)
        if own is None:
            out.append(f"{name}: a module at harness/'s top level in no stage (move it into one, or add it to CORE)")
            continue
        if name == FACADE:
            continue
        for dep in sorted(imports(name, path, set(mods))):
            theirs = stage_of(dep)
            if theirs is None or theirs == own or (name, dep) in ALLOWED:
                continue
            if RANKS[theirs] >= RANKS[own]:
                out.append(f"{name} ({own}) imports {dep} ({theirs})")
    return out


def test_no_module_imports_a_later_stage():
    assert layering_violations() == []


def test_the_layering_sees_an_import_up_the_stages_inside_a_function(tmp_path):
    pkg = tmp_path / "harness"
    for sub in ("plan", "store", "report"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("def __getattr__(name):\n    from attnbench.report import x\n")  # facade
    (pkg / "errors.py").write_text("")
    (pkg / "plan" / "suite.py").write_text("from attnbench import errors\nfrom ..store import rows\n")
    (pkg / "store" / "rows.py").write_text("from attnbench.errors import E\n")
    (pkg / "report" / "x.py").write_text("from attnbench.store import rows\n")
    assert layering_violations(tmp_path) == ["attnbench.plan.suite (plan) imports attnbench.store.rows (store)"]
    (pkg / "plan" / "suite.py").write_text("def f():\n    from attnbench.report.x import y\n")
    (pkg / "loose.py").write_text("")
    assert layering_violations(tmp_path) == [
        "attnbench.loose: a module at harness/'s top level in no stage (move it into one, or add it to CORE)",
        "attnbench.plan.suite (plan) imports attnbench.report.x (report)",
    ]
    (pkg / "plan" / "suite.py").write_text("from attnbench.errors import E\n")
    (pkg / "loose.py").unlink()
    assert layering_violations(tmp_path) == []
