"""Render a Comparison (attnbench.report.compare) as compare.md and a self-contained compare.html."""

from __future__ import annotations

import json
from pathlib import Path

from attnbench.report import changes, plots
from attnbench.report.common import asset, fmt, md_text, template
from attnbench.report.compare import ORDER, Comparison

_SECTIONS = (
    ("Regressions", ("broke", "slower", "xpass")),
    ("Needs a look", ("noisy", "not comparable", "missing", "now skipped", "expected")),
    ("Improvements", ("faster", "fixed", "new")),
)


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:+.1f}%"


def _view(c) -> dict:
    return {
        "case": c.case_id,
        "op": c.op,
        "backend": c.backend,
        "verdict": c.verdict,
        "vclass": "v-" + c.verdict.replace(" ", "-"),
        "base_status": c.base_status or "",
        "new_status": c.new_status or "",
        "size": changes.size(c),
        "base_us": fmt(c.base_us),
        "new_us": fmt(c.new_us),
        "change": _pct(c.change),
        "change_v": c.change,
        "threshold": "" if c.threshold is None else f"±{100 * c.threshold:.1f}%",
        "ci": "" if c.ci_separate is None else ("apart" if c.ci_separate else "overlap"),
        "note": c.note,
    }


def _headline(cmp: Comparison, g: dict) -> str:
    """'REGRESSION: 11 rows (+ 175 rows absent because the plans differ)', or 'no regression'."""
    planned = sum(c.regression for c in g["plan"])
    if not cmp.regressions:
        return "no regression"
    real = len(g["regressions"])
    plan = f" (+ {planned} rows absent because the plans differ)" if planned else ""
    return f"REGRESSION: {real} row{'s' * (real != 1)}{plan}"


def render_compare_md(cmp: Comparison) -> str:
    counts = cmp.counts()
    g = changes.groups(cmp)
    lines = [
        f"## attnbench compare: {_headline(cmp, g)}",
        "",
        f"`{cmp.base}` -> `{cmp.new}`",
        "",
        f"Rule: {cmp.rule.describe()}.",
        "",
        ", ".join(f"{v}: {counts[v]}" for v in ORDER if counts[v]),
    ]
    if g["same"]:
        lines += ["", md_text(g["same"])]
    for w in cmp.env_warnings():
        lines.append(f"\n> warning: {md_text(w)}")
    plan = {(c.case_id, c.backend) for c in g["plan"]}
    sections = [(title, [c for c in cmp.changes if c.verdict in verdicts and (c.case_id, c.backend) not in plan])
                for title, verdicts in _SECTIONS]  # fmt: skip
    sections.append(("Absent because the plans differ", g["plan"]))
    for title, sel in sections:
        if not sel:
            continue
        lines += [
            "",
            f"### {title} ({len(sel)})",
            "",
            "| case | backend | verdict | base → new µs (Δ) | threshold | CIs | note |",
            "|---|---|---|---:|---:|---|---|",
        ]
        for c in sel[:300]:
            v = _view(c)
            note = md_text(v["note"])
            lines.append(
                f"| `{v['case']}` | {md_text(v['backend'])} | {v['verdict']} | {v['size']} | "
                f"{v['threshold']} | {v['ci']} | {note} |"
            )
        if len(sel) > 300:
            lines.append(f"| … and {len(sel) - 300} more in compare.json | | | | | | |")
    return "\n".join(lines) + "\n"


def render_compare_html(cmp: Comparison) -> str:
    counts = cmp.counts()
    g = changes.groups(cmp)
    return template("compare.html.j2").render(
        cmp=cmp,
        headline=_headline(cmp, g),
        same=g["same"],
        plan_line=changes.plan_line(g["plan"]),
        plan_rows=[_view(c) for c in g["plan"]],
        counts=[(v, counts[v]) for v in ORDER if counts[v]],
        verdicts=[v for v in ORDER if counts[v]],
        rows=[_view(c) for c in cmp.changes],
        regressions=[_view(c) for c in g["regressions"]],
        warnings=cmp.env_warnings(),
        plot=plots.change_plot(cmp.changes),
        css=asset("style.css"),
        js=asset("tables.js"),
    )


def write_comparison(cmp: Comparison, out: Path) -> list[Path]:
    """compare.md, compare.html and compare.json in `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "compare.md", out / "compare.html", out / "compare.json"]
    files[0].write_text(render_compare_md(cmp), encoding="utf-8")
    files[1].write_text(render_compare_html(cmp), encoding="utf-8")
    files[2].write_text(json.dumps(cmp.to_dict(), indent=1), encoding="utf-8")
    return files
