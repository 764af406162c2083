"""Shared by the rendered files: number format, the repro command of a row, templates and assets."""

from __future__ import annotations

import html
import shlex
from importlib import resources

import jinja2

from attnbench.store.columns import fmt


def asset(name: str) -> str:
    return resources.files("attnbench.report").joinpath(name).read_text(encoding="utf-8")


def template(name: str) -> jinja2.Template:
    """A template of this package; it may `{% include %}` other templates of the package."""
    env = jinja2.Environment(autoescape=True, undefined=jinja2.ChainableUndefined, loader=jinja2.FunctionLoader(asset))
    env.filters["fmt"] = fmt
    return env.get_template(name)


def _plugins(run: dict) -> list[str]:
    argv, out = list(run.get("argv") or []), []
    for i, a in enumerate(argv):
        if a == "--plugin" and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif a.startswith("--plugin="):
            out.append(a.split("=", 1)[1])
    return out


def interpreted(r) -> bool:
    """Whether a row ran its Triton kernels in the CPU interpreter (TRITON_INTERPRET=1), as its env or
    timing records it: its repro must set the variable, or the row skips instead of failing."""
    env, t = r.env or {}, r.timing or {}
    return bool(
        env.get("triton_interpret")
        or str(env.get("TRITON_INTERPRET", "")) == "1"
        or t.get("interpreter")
        or "interpret" in str(t.get("clock", ""))
    )


def repro(r, run: dict) -> str:
    """The command that re-runs one row alone, with the environment it needs (TRITON_INTERPRET=1)."""
    cmd = shlex.join(["attnbench", "sweep", "--case", r.case_id, "--backend", r.backend, *repro_tail(run)])
    return f"TRITON_INTERPRET=1 {cmd}" if interpreted(r) else cmd


def repro_tail(run: dict) -> list[str]:
    """What every repro command of a run ends with: its device (a run from before run.json named it:
    env.json's), its plugins and its traces (with --case, a trace only resolves ids: nothing else runs)."""
    parts = ["--device", run["device"]] if run.get("device") else []
    for p in run.get("plugins") or _plugins(run):
        parts += ["--plugin", p]
    for t in run.get("traces") or ():  # ids of replayed batches name their lengths by digest: the trace has them
        parts += ["--trace", t]
    return parts


def md_text(text) -> str:
    """Text for a markdown line or table cell (summary.md, gate.md): one line, `|` escaped, and `<`, `>`,
    `&` as HTML entities, so a plugin's name or an exception message shows as written (markdown
    renderers pass raw HTML through)."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")
