"""report.html: one self-contained page (inline CSS, JS and PNG plots; no network)."""

from __future__ import annotations

import html
from collections import Counter
from importlib import resources

import jinja2

from attnbench.capability import matrix_from_rows
from attnbench.report import plots
from attnbench.tolerance import DEFAULT_FACTOR, DEFAULT_FLOOR

_AXES = ("kv_len", "q_len", "prefix_len", "batch", "tokens")


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        if x == 0:
            return "0"
        if abs(x) >= 1e4 or abs(x) < 1e-2:
            return f"{x:.{digits - 1}e}"
        return f"{x:.{digits}g}"
    return str(x)


def _repro(r, run: dict) -> str:
    device = run.get("device", "cpu")
    return f"attnbench sweep --case {r.case_id} --backend {r.backend} --device {device}"


def _row_view(r, run: dict) -> dict:
    t, d, m = r.timing or {}, r.derived or {}, r.metrics or {}
    errs = []
    for name, mm in m.items():
        if mm.get("exact"):
            errs.append(f"{name}: {'exact' if not mm['wrong'] else str(mm['wrong']) + ' wrong'}")
        elif "max_abs" in mm:
            errs.append(f"{name}: {_fmt(mm['max_abs'])} / {_fmt(mm['bound'])}")
    return {
        "case": r.case_id,
        "backend": r.backend,
        "status": r.status,
        "reason": r.reason,
        "errors": "; ".join(errs),
        "cos": _fmt(m.get("o", {}).get("cos"), 6) if "o" in m else "",
        "median": t.get("median_us"),
        "median_s": _fmt(t.get("median_us")),
        "spread": f"{_fmt(t.get('p10_us'))}–{_fmt(t.get('p90_us'))}" if t else "",
        "cv": f"{100 * t['cv']:.1f}%" if t else "",
        "n": t.get("n", ""),
        "converged": t.get("converged", True),
        "tflops": _fmt(d.get("tflops")) if t else "",
        "tbps": _fmt(d.get("tbps")) if t else "",
        "prepare": _fmt(r.prepare_s),
        "repro": _repro(r, run),
        "why": r.tolerance_why,
    }


def _speedups(rows, baseline: str) -> list[dict]:
    """Per op and backend: geometric-mean speedup over `baseline` on cases both timed."""
    import math

    base = {(r.case_id): r.timing["median_us"] for r in rows if r.backend == baseline and r.timing}
    acc: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.backend != baseline and r.timing and r.case_id in base and r.timing["median_us"] > 0:
            acc.setdefault((r.op, r.backend), []).append(base[r.case_id] / r.timing["median_us"])
    return [
        {"op": op, "backend": b, "speedup": _fmt(math.exp(sum(map(math.log, v)) / len(v))), "cases": len(v)}
        for (op, b), v in sorted(acc.items())
    ]


def render_html(rows, env: dict, run: dict) -> str:
    by_backend: dict[str, Counter] = {}
    for r in rows:
        by_backend.setdefault(r.backend, Counter())[r.status] += 1
    names, cap = matrix_from_rows(rows)
    ops = list(dict.fromkeys(r.op for r in rows))
    sections = []
    for op in ops:
        op_rows = [r for r in rows if r.op == op]
        figs = [plots.latency_by_case(op_rows, op)]
        figs += [plots.latency_vs_axis(op_rows, op, a) for a in _AXES]
        heat = []
        for r in op_rows:
            for out, mm in (r.metrics or {}).items():
                if r.status == "fail" and mm.get("heat"):
                    heat.append(
                        {
                            "title": f"{r.case_id} [{r.backend}] {out}",
                            "png": plots.error_heatmap(mm["heat"], f"{r.backend}: {out} error", "row (binned)", "head"),
                        }
                    )
        sections.append(
            {
                "op": op,
                "rows": [_row_view(r, run) for r in op_rows],
                "figs": [f for f in figs if f],
                "heat": heat[:12],
                "heat_more": max(0, len(heat) - 12),
            }
        )
    baseline = "torch" if any(r.backend == "torch" for r in rows) else (names[0] if names else "")
    template = jinja2.Environment(autoescape=True, undefined=jinja2.ChainableUndefined).from_string(
        resources.files("attnbench.report").joinpath("template.html.j2").read_text(encoding="utf-8")
    )
    return template.render(
        rows=rows,
        env=env,
        run=run,
        counts=by_backend,
        total=Counter(r.status for r in rows),
        cases=len({r.case_id for r in rows}),
        cap_names=names,
        cap=cap,
        sections=sections,
        speedups=_speedups(rows, baseline),
        baseline=baseline,
        factor=DEFAULT_FACTOR,
        floor=DEFAULT_FLOOR,
        esc=html.escape,
    )
