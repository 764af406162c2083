"""Flat exports of a run: results.csv, junit.xml (one testcase per case x backend), summary.md."""

from __future__ import annotations

import csv
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from attnbench.report.common import md_text
from attnbench.store.columns import csv_columns, md_table
from attnbench.store.counts import FAILING, STATUSES, count, status_of
from attnbench.store.results import Result


def write_csv(rows: list[Result], path: Path) -> None:
    """results.csv: one line per row, the columns of the registry (attnbench.store.columns.csv_columns)."""
    cols = csv_columns(rows)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow([c.name for c in cols])
        for r in rows:
            w.writerow(["" if (v := c.get(r)) is None else v for c in cols])


def _properties(r: Result) -> list[str]:
    t, d = r.timing or {}, r.derived or {}
    props = {
        "median_us": t.get("median_us"),
        "cv": t.get("cv"),
        "mode": t.get("mode"),
        "tflops": d.get("tflops"),
        "tbps": d.get("tbps"),
        "roofline_pct": d.get("roofline_pct"),
    }
    items = [f"<property name={quoteattr(k)} value={quoteattr(str(v))}/>" for k, v in props.items() if v is not None]
    return ["<properties>", *items, "</properties>"] if items else []


def write_junit(rows: list[Result], path: Path, run: dict | None = None) -> None:
    """JUnit XML: fail and xpass are failures, errors errors, skip and xfail skipped (each with its reason);
    timings as properties; an incomplete run says so in a property and in system-err."""
    run = run or {}
    n = count(rows).junit()
    total_s = sum((r.timing or {}).get("median_us", 0) * 1e-6 for r in rows)
    counts = f'tests="{n["tests"]}" failures="{n["failures"]}" errors="{n["errors"]}" skipped="{n["skipped"]}"'
    complete = bool(run.get("complete", True))
    out = [
        '<?xml version="1.0" encoding="utf-8"?>',
        f'<testsuites name="attnbench" {counts}>',
        f'<testsuite name="attnbench" {counts} time="{total_s:.6f}">',
        f'<properties><property name="complete" value="{str(complete).lower()}"/></properties>',
    ]
    for r in rows:
        st = status_of(r)
        secs = (r.timing or {}).get("median_us", 0) * 1e-6
        name = f"{r.case_id}[{r.backend}]"
        classname = quoteattr(f"{r.op}.{r.backend}")
        out.append(f'<testcase classname={classname} name={quoteattr(name)} time="{secs:.9f}">')
        out += _properties(r)
        if st in ("fail", "xpass"):
            msg = (
                r.reason
                if st == "fail"
                else f"xpass (an expected failure passed: the expectation is stale): {r.reason}"
            )
            out.append(f"<failure message={quoteattr(msg)}>{escape(msg)}</failure>")
        elif st == "error":
            out.append(f"<error message={quoteattr(r.reason)}>{escape(r.reason)}</error>")
        elif st in ("skip", "xfail"):
            msg = r.reason if st == "skip" else f"xfail (known failure): {r.reason}"
            out.append(f"<skipped message={quoteattr(msg)}/>")
        out.append("</testcase>")
    if not complete:
        why = run.get("stopped_by") or "interrupted or crashed"
        out.append(
            f"<system-err>{escape(f'INCOMPLETE RUN ({why}): only the rows written before it stopped')}</system-err>"
        )
    out += ["</testsuite>", "</testsuites>"]
    Path(path).write_text("\n".join(out) + "\n", encoding="utf-8")


_MD = {"case_id": lambda v: f"`{v}`", "backend": md_text, "reason": md_text}  # how summary.md writes them


def write_summary_md(
    rows: list[Result], path: Path, env: dict, run: dict | None = None, baseline: str = "", comparison=None
) -> None:
    """Markdown for job summaries and pull-request comments: the report's first screen (verdict, what
    broke, who is fastest, what changed), then counts per backend, speedups, measurement, xfails, failures."""
    from attnbench.report.firstscreen import first_screen, first_screen_md
    from attnbench.report.measure import harness_cost, measurement
    from attnbench.report.ranking import BASELINE_RULE, replay_totals, speed_baseline, speedups, timing_kinds

    run = run or {}
    fs = first_screen(rows, run, comparison)
    where = env.get("gpu") or env.get("cpu") or env.get("device", "?")
    lines = [f"## attnbench: {len(rows)} rows on {where}", "", *first_screen_md(fs)]
    for kind, n in timing_kinds(rows).items():
        if kind != "gpu":
            lines += ["", f"> {n} rows were timed with a **{kind}**: not GPU timings, never ranked or compared."]
    lines += ["", "### Rows per backend", "", "| backend | " + " | ".join(STATUSES) + " |",
              "|---|" + "---:|" * len(STATUSES)]  # fmt: skip
    for name, c in fs.counts.by_backend.items():
        lines.append(f"| {md_text(name)} | " + " | ".join(str(c[s]) for s in STATUSES) + " |")
    lines += [f"\n**warning** {md_text(w)}" for w in determinism_warnings(rows)]  # (detect: determinism)
    sp = speedups(rows, baseline) if baseline else []
    if sp:
        lines += [
            "",
            f"### Speed over {md_text(baseline)} (passing GPU-timed rows only; geometric mean of median ratios)",
            "",
            "Baseline: "
            + (f"by the rule: {BASELINE_RULE}." if baseline == speed_baseline(rows) else "chosen with --baseline."),
            "",
            "| op | backend | speedup | faster on |",
            "|---|---|---:|---:|",
        ]
        lines += [
            f"| {s['op']} | {md_text(s['backend'])} | {s['speedup']:.3g}x | {s['wins']}/{s['cases']} |" for s in sp
        ]
    for t in replay_totals(rows):
        lines += ["", f"### Replayed trace `{t['suite']}`: server time, sum of count x median (passing GPU-timed rows)",
                  "", f"| backend | batches timed (of {t['batches']}) | total ms | ms on the {t['common']} batches all passed |",
                  "|---|---:|---:|---:|"]  # fmt: skip
        for b in t["backends"]:
            common = f"{b['common_ms']:.3f}" if b["common_ms"] is not None else "-"
            lines.append(f"| {md_text(b['backend'])} | {b['batches']} | {b['total_ms']:.3f} | {common} |")
    m = measurement(rows)
    if m["timed"]:
        modes = ", ".join(f"{k}: {n}" for k, n in m["modes"])
        lines += [
            "",
            f"Timing: {m['timed']} rows ({modes}); CI target missed on {m['unconverged']}; "
            f"throttled samples on {m['throttled_rows']}.",
        ]
    cost = harness_cost(rows, run)
    if cost["wall_s"]:
        parts = "; ".join(_wall_items(cost["parts"]))
        over = f" x {cost['workers']} workers" if cost["workers"] > 1 else ""
        lines += [
            "",
            f"Wall {cost['wall_s']:.1f} s{over}: {parts}; kernel time in timed windows {cost['kernel_s']:.2f} s.",
        ]
        if env.get("no_bytecode_cache"):
            lines[-1] += (" Python wrote no bytecode cache (PYTHONDONTWRITEBYTECODE is set): every process compiled"
                          " the modules it imported, a part of precompile, worker start-up and prepare (on an H100"
                          " with every backend installed, 13.7 s a process).")  # fmt: skip
        if cost["rows_left_out"]:
            lines[-1] += (f" These are the items of the {cost['rows_counted']} rows this wall time produced; the "
                          f"{cost['rows_left_out']} rows kept from earlier processes (a resumed run) spent their "
                          "time outside it.")  # fmt: skip
    if refs := cost["references"]:
        lines += [
            "",
            f"References: {refs.get('computed', 0)} computed, {refs.get('from_cache', 0)} loaded from the "
            f"reference cache ({refs.get('cache', 'off')})"
            + (f"; {refs['problems']} cache problem(s), see the sweep's warnings." if refs.get("problems") else "."),
        ]
    xf = [r for r in rows if status_of(r) == "xfail"]
    if xf:
        lines += ["", "### Known failures (xfail: not counted as failures)", ""]
        lines += md_table(xf[:100], [("case_id", "case"), "backend", "reason"], _MD)
        if len(xf) > 100:
            lines.append(f"| … and {len(xf) - 100} more in results.jsonl | | |")
    bad = [r for r in rows if status_of(r) in FAILING]
    if bad:
        lines += ["", "### Failing rows", ""]
        lines += md_table(bad[:200], [("case_id", "case"), "backend", "status", "reason"], _MD)
        if len(bad) > 200:
            lines.append(f"| ... | | | {len(bad) - 200} more in results.jsonl |")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


# ---- determinism warnings (console and summary.md; owned by the determinism check, harness/check/checks.py) ----
def determinism_warnings(rows: list[Result]) -> list[str]:
    """One line per backend with rows whose repeated calls gave different bits, or that changed with the
    batch around a request (a warning unless required or declared, when the row itself fails)."""
    out = []
    for name in sorted({r.backend for r in rows}):
        nondet = [r.case_id for r in rows if r.backend == name and r.deterministic is False]
        variant = [r.case_id for r in rows if r.backend == name and r.batch_invariant is False]
        for what, ids in (("not deterministic", nondet), ("not batch invariant", variant)):
            if ids:
                more = f" and {len(ids) - 1} more" if len(ids) > 1 else ""
                out.append(f"{name}: {len(ids)} row(s) {what}, e.g. {ids[0]}{more}")
    return out


def _wall_items(parts: list[dict]) -> list[str]:
    """summary.md's items of the wall breakdown: "what 1.2 s", the timing's phases as one item,
    "timing 24.4 s (warm-up 4.1, pilot 6.3, ...)"."""
    out, phases = [], [p for p in parts if p["what"].startswith("timing: ")]
    for p in parts:
        if p in phases:
            if p is phases[0]:
                inner = ", ".join(f"{q['what'][len('timing: ') :].split(' (')[0]} {q['s']:.1f}" for q in phases)
                out.append(f"timing {sum(q['s'] for q in phases):.1f} s ({inner})")
            continue
        out.append(f"{p['what'].split(' (')[0]} {p['s']:.1f} s")
    return out
