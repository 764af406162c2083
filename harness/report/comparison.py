"""Render a Comparison (attnbench.compare) as compare.md and a self-contained compare.html."""

from __future__ import annotations

from attnbench.compare import ORDER, Comparison
from attnbench.report import plots
from attnbench.report.common import asset, fmt, md_text, template

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
        "base_us": fmt(c.base_us),
        "new_us": fmt(c.new_us),
        "change": _pct(c.change),
        "change_v": c.change,
        "threshold": "" if c.threshold is None else f"±{100 * c.threshold:.1f}%",
        "ci": "" if c.ci_separate is None else ("apart" if c.ci_separate else "overlap"),
        "note": c.note,
    }


def render_compare_md(cmp: Comparison) -> str:
    counts = cmp.counts()
    head = "REGRESSION" if cmp.regressions else "no regression"
    lines = [
        f"## attnbench compare: {head}",
        "",
        f"`{cmp.base}` -> `{cmp.new}`",
        "",
        f"Rule: {cmp.rule.describe()}.",
        "",
        ", ".join(f"{v}: {counts[v]}" for v in ORDER if counts[v]),
    ]
    for w in cmp.env_warnings():
        lines.append(f"\n> warning: {md_text(w)}")
    for title, verdicts in _SECTIONS:
        sel = [c for c in cmp.changes if c.verdict in verdicts]
        if not sel:
            continue
        lines += [
            "",
            f"### {title} ({len(sel)})",
            "",
            "| case | backend | verdict | base µs | new µs | change | threshold | CIs | note |",
            "|---|---|---|---:|---:|---:|---:|---|---|",
        ]
        for c in sel[:300]:
            v = _view(c)
            note = md_text(v["note"])
            lines.append(
                f"| `{v['case']}` | {md_text(v['backend'])} | {v['verdict']} | {v['base_us']} | {v['new_us']} | "
                f"{v['change']} | {v['threshold']} | {v['ci']} | {note} |"
            )
        if len(sel) > 300:
            lines.append(f"| ... | | | | | | | | {len(sel) - 300} more in compare.json |")
    return "\n".join(lines) + "\n"


def render_compare_html(cmp: Comparison) -> str:
    counts = cmp.counts()
    return template("compare.html.j2").render(
        cmp=cmp,
        counts=[(v, counts[v]) for v in ORDER if counts[v]],
        verdicts=[v for v in ORDER if counts[v]],
        rows=[_view(c) for c in cmp.changes],
        regressions=[_view(c) for c in cmp.regressions],
        warnings=cmp.env_warnings(),
        plot=plots.change_plot(cmp.changes),
        css=asset("style.css"),
        js=asset("tables.js"),
    )
