"""Flat exports of a run: results.csv, junit.xml (one testcase per case x backend), summary.md."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from attnbench.results import Result, status_counts

CSV_COLUMNS = (
    "case_id",
    "op",
    "backend",
    "status",
    "reason",
    "dtype",
    "seed",
    "suite",
    "median_us",
    "ci95_lo_us",
    "ci95_hi_us",
    "p10_us",
    "p90_us",
    "min_us",
    "cv",
    "n",
    "clock",
    "mode",
    "converged",
    "n_throttled",
    "tflops",
    "tbps",
    "intensity",
    "roofline_pct",
    "limiter",
    "flops",
    "bytes",
    "o_max_abs",
    "o_bound",
    "lse_max_abs",
    "lse_bound",
    "prepare_s",
    "check_s",
    "reference_s",
    "params",
)


def _csv_row(r: Result) -> dict:
    t, d, m = r.timing or {}, r.derived or {}, r.metrics or {}
    ci = t.get("ci95_us") or [None, None]
    return {
        "case_id": r.case_id,
        "op": r.op,
        "backend": r.backend,
        "status": r.status,
        "reason": r.reason,
        "dtype": r.dtype,
        "seed": r.seed,
        "suite": r.suite,
        "median_us": t.get("median_us"),
        "ci95_lo_us": ci[0],
        "ci95_hi_us": ci[1],
        "p10_us": t.get("p10_us"),
        "p90_us": t.get("p90_us"),
        "min_us": t.get("min_us"),
        "cv": t.get("cv"),
        "n": t.get("n"),
        "clock": t.get("clock"),
        "mode": t.get("mode"),
        "converged": t.get("converged"),
        "n_throttled": t.get("n_throttled"),
        "tflops": d.get("tflops"),
        "tbps": d.get("tbps"),
        "intensity": d.get("intensity"),
        "roofline_pct": d.get("roofline_pct"),
        "limiter": d.get("limiter"),
        "flops": d.get("flops"),
        "bytes": d.get("bytes"),
        "o_max_abs": m.get("o", {}).get("max_abs"),
        "o_bound": m.get("o", {}).get("bound"),
        "lse_max_abs": m.get("lse", {}).get("max_abs"),
        "lse_bound": m.get("lse", {}).get("bound"),
        "prepare_s": r.prepare_s,
        "check_s": r.check_s,
        "reference_s": r.reference_s,
        "params": json.dumps(r.params, sort_keys=True),
    }


def write_csv(rows: list[Result], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow(_csv_row(r))


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


def write_junit(rows: list[Result], path: Path) -> None:
    """JUnit XML: failures and errors carry the reason; skips are skipped testcases; timings as properties."""
    c = Counter(r.status for r in rows)
    total_s = sum((r.timing or {}).get("median_us", 0) * 1e-6 for r in rows)
    counts = f'tests="{len(rows)}" failures="{c["fail"]}" errors="{c["error"]}" skipped="{c["skip"]}"'
    out = [
        '<?xml version="1.0" encoding="utf-8"?>',
        f'<testsuites name="attnbench" {counts}>',
        f'<testsuite name="attnbench" {counts} time="{total_s:.6f}">',
    ]
    for r in rows:
        secs = (r.timing or {}).get("median_us", 0) * 1e-6
        name = f"{r.case_id}[{r.backend}]"
        classname = quoteattr(f"{r.op}.{r.backend}")
        out.append(f'<testcase classname={classname} name={quoteattr(name)} time="{secs:.9f}">')
        out += _properties(r)
        if r.status == "fail":
            out.append(f"<failure message={quoteattr(r.reason)}>{escape(r.reason)}</failure>")
        elif r.status == "error":
            out.append(f"<error message={quoteattr(r.reason)}>{escape(r.reason)}</error>")
        elif r.status == "skip":
            out.append(f"<skipped message={quoteattr(r.reason)}/>")
        out.append("</testcase>")
    out += ["</testsuite>", "</testsuites>"]
    Path(path).write_text("\n".join(out) + "\n", encoding="utf-8")


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_summary_md(rows: list[Result], path: Path, env: dict, run: dict | None = None, baseline: str = "") -> None:
    """Markdown for GitHub step summaries: counts and speed per backend, measurement notes, failures."""
    from attnbench.report.html import harness_cost, measurement, speedups

    run = run or {}
    by = status_counts(rows)
    where = env.get("gpu") or env.get("cpu") or env.get("device", "?")
    lines = [
        f"## attnbench: {len(rows)} rows on {where}",
        "",
        "| backend | pass | fail | error | skip |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, c in sorted(by.items()):
        lines.append(f"| {name} | {c['pass']} | {c['fail']} | {c['error']} | {c['skip']} |")
    sp = speedups(rows, baseline) if baseline else []
    if sp:
        lines += [
            "",
            f"### Speed over {baseline} (geometric mean of median ratios)",
            "",
            "| op | backend | speedup | faster on |",
            "|---|---|---:|---:|",
        ]
        lines += [f"| {s['op']} | {s['backend']} | {s['speedup']}x | {s['wins']}/{s['cases']} |" for s in sp]
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
        parts = "; ".join(f"{p['what'].split(' (')[0]} {p['s']:.1f} s" for p in cost["parts"])
        lines += [
            "",
            f"Wall {cost['wall_s']:.1f} s: {parts}; kernel time in timed windows {cost['kernel_s']:.2f} s.",
        ]
    bad = [r for r in rows if r.status in ("fail", "error")]
    if bad:
        lines += [
            "",
            "### Failures and errors",
            "",
            "| case | backend | status | reason |",
            "|---|---|---|---|",
        ]
        for r in bad[:200]:
            lines.append(f"| `{r.case_id}` | {r.backend} | {r.status} | {_md(r.reason)} |")
        if len(bad) > 200:
            lines.append(f"| ... | | | {len(bad) - 200} more in results.jsonl |")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
