"""report.html: one self-contained page (inline CSS, JS, SVG plots and the rows as JSON; no network).

First screen: the verdict, what broke (grouped by cause, with repros), the fastest passing backend per
shape class, and what changed against a baseline run. Below: the winners view (cases × backends), the
filterable results table and per-case view (drawn by the page's script from the rows' JSON), plots per
op, the compact capability matrix, measurement, speedups over a baseline backend, environment, conventions.
"""

from __future__ import annotations

from attnbench.check.tolerance import DEFAULT_FACTOR, DEFAULT_FLOOR
from attnbench.report import capmatrix, changes, plots, ranking, rowdata, winners
from attnbench.report.common import asset, fmt, template
from attnbench.report.firstscreen import FASTEST_NOTE, fastest_cells, first_screen
from attnbench.report.measure import determinism, harness_cost, measurement, peaks_view
from attnbench.store.counts import STATUSES

MAX_HEATMAPS = 4  # per op: error heatmaps of failing outputs that carry information


def _heatmaps(op_rows) -> tuple[list[dict], int]:
    heat, more = [], 0
    for r in op_rows:
        for out, mm in (r.metrics or {}).items():
            if not mm.get("heat") or str(getattr(r.status, "value", r.status)) == "pass":
                continue
            if len(heat) >= MAX_HEATMAPS:
                more += 1
                continue
            worst = " ".join(f"{k} {v}" for k, v in (mm.get("worst") or {}).items())
            uri = plots.error_heatmap(mm["heat"], f"{r.backend}: |{out} − ref| per head and row", "row bin", "head",
                                     bound=mm.get("bound"))  # fmt: skip
            if uri:
                heat.append({"case": r.case_id, "uri": uri,
                             "title": f"{r.case_id} [{r.backend}] {out}: max abs {fmt(mm.get('max_abs'))} "
                                      f"(bound {fmt(mm.get('bound'))}), worst at {worst}"})  # fmt: skip
    return heat, more


def _op_sections(rows, env: dict) -> list[dict]:
    out, names = [], sorted({r.backend for r in rows})
    for op in dict.fromkeys(r.op for r in rows):
        op_rows = [r for r in rows if r.op == op]
        lat, lat_note = plots.latency_panels(op_rows, op, names=names)
        figs = [plots.fast_p(op_rows, op, names), plots.roofline(op_rows, op, env.get("peaks"), names),
                plots.error_vs_length(op_rows, op, names)]  # fmt: skip
        figs = [f for f in figs if f]
        heat, more = _heatmaps(op_rows)
        excluded = sum(1 for r in op_rows if r.timing and not ranking.rankable(r))
        out.append({"op": op, "lat": lat, "lat_note": lat_note, "figs": figs, "heat": heat, "heat_more": more,
                    "excluded": excluded})  # fmt: skip
    return out


def default_baseline(rows) -> str:
    """The speedup baseline when none is asked for: ranking.BASELINE_RULE."""
    return ranking.speed_baseline(rows)


def render_html(rows, env: dict, run: dict, baseline: str | None = None, comparison=None) -> str:
    baseline = baseline or default_baseline(rows)
    rule = ranking.BASELINE_RULE if baseline == default_baseline(rows) else ""
    fs = first_screen(rows, run, comparison)
    return template("template.html.j2").render(
        rows=rows,
        env=env,
        run=run,
        fs=fs,
        fastest=[fastest_cells(f) for f in fs.fastest],
        statuses=STATUSES,
        cases=len({r.case_id for r in rows}),
        win=winners.view(rows),
        cap=capmatrix.build(rows),
        determinism=determinism(rows),
        sections=_op_sections(rows, env),
        speedups=ranking.speedups(rows, baseline),
        baseline=baseline,
        baseline_rule=rule,
        fastest_note=FASTEST_NOTE,
        change_size=changes.size,
        change_plan=changes.plan_line(fs.changes["plan"]) if fs.changes else "",
        backends=sorted({r.backend for r in rows}),
        ops=list(dict.fromkeys(r.op for r in rows)),
        features=sorted({f for r in rows for f in r.features}),
        meas=measurement(rows),
        cost=harness_cost(rows, run),
        peaks=peaks_view(env),
        factor=DEFAULT_FACTOR,
        floor=DEFAULT_FLOOR,
        data=rowdata.payload_json(rows, run),
        css=asset("style.css"),
        js=asset("tables.js"),
        results_js=asset("results.js"),
    )
