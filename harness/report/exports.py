"""Flat exports of a run: results.csv, junit.xml (one testcase per case x backend), summary.md."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from attnbench.results import Result

CSV_COLUMNS = (
    "case_id", "op", "backend", "status", "reason", "dtype", "seed", "suite",
    "median_us", "p10_us", "p90_us", "cv", "n", "clock", "tflops", "tbps",
    "o_max_abs", "o_bound", "lse_max_abs", "lse_bound", "prepare_s", "params",
)  # fmt: skip


def _csv_row(r: Result) -> dict:
    t, d, m = r.timing or {}, r.derived or {}, r.metrics or {}
    return {
        "case_id": r.case_id, "op": r.op, "backend": r.backend, "status": r.status, "reason": r.reason,
        "dtype": r.dtype, "seed": r.seed, "suite": r.suite,
        "median_us": t.get("median_us"), "p10_us": t.get("p10_us"), "p90_us": t.get("p90_us"),
        "cv": t.get("cv"), "n": t.get("n"), "clock": t.get("clock"),
        "tflops": d.get("tflops"), "tbps": d.get("tbps"),
        "o_max_abs": m.get("o", {}).get("max_abs"), "o_bound": m.get("o", {}).get("bound"),
        "lse_max_abs": m.get("lse", {}).get("max_abs"), "lse_bound": m.get("lse", {}).get("bound"),
        "prepare_s": r.prepare_s, "params": json.dumps(r.params, sort_keys=True),
    }  # fmt: skip


def write_csv(rows: list[Result], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow(_csv_row(r))


def write_junit(rows: list[Result], path: Path) -> None:
    """JUnit XML: failures and errors carry the reason; skips are skipped testcases."""
    c = Counter(r.status for r in rows)
    total_s = sum((r.timing or {}).get("median_us", 0) * 1e-6 for r in rows)
    out = [
        '<?xml version="1.0" encoding="utf-8"?>',
        f'<testsuites name="attnbench" tests="{len(rows)}" failures="{c["fail"]}" errors="{c["error"]}" skipped="{c["skip"]}">',
        f'<testsuite name="attnbench" tests="{len(rows)}" failures="{c["fail"]}" errors="{c["error"]}" '
        f'skipped="{c["skip"]}" time="{total_s:.6f}">',
    ]
    for r in rows:
        secs = (r.timing or {}).get("median_us", 0) * 1e-6
        out.append(f"<testcase classname={quoteattr(r.op + '.' + r.backend)} name={quoteattr(r.case_id)} time=\"{secs:.9f}\">")
        if r.status == "fail":
            out.append(f"<failure message={quoteattr(r.reason)}>{escape(r.reason)}</failure>")
        elif r.status == "error":
            out.append(f"<error message={quoteattr(r.reason)}>{escape(r.reason)}</error>")
        elif r.status == "skip":
            out.append(f"<skipped message={quoteattr(r.reason)}/>")
        out.append("</testcase>")
    out += ["</testsuite>", "</testsuites>"]
    Path(path).write_text("\n".join(out) + "\n", encoding="utf-8")


def write_summary_md(rows: list[Result], path: Path, env: dict) -> None:
    """A Markdown summary for GitHub step summaries: per-backend counts, then every failure/error."""
    by: dict[str, Counter] = {}
    for r in rows:
        by.setdefault(r.backend, Counter())[r.status] += 1
    where = env.get("gpu") or env.get("cpu") or env.get("device", "?")
    lines = [f"## attnbench: {len(rows)} rows on {where}", "", "| backend | pass | fail | error | skip |", "|---|---:|---:|---:|---:|"]
    for name, c in sorted(by.items()):
        lines.append(f"| {name} | {c['pass']} | {c['fail']} | {c['error']} | {c['skip']} |")
    bad = [r for r in rows if r.status in ("fail", "error")]
    if bad:
        lines += ["", "### Failures and errors", "", "| case | backend | status | reason |", "|---|---|---|---|"]
        for r in bad[:200]:
            reason = r.reason.replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{r.case_id}` | {r.backend} | {r.status} | {reason} |")
        if len(bad) > 200:
            lines.append(f"| ... | | | {len(bad) - 200} more in results.jsonl |")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
