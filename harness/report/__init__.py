"""Stage report: everything that reads a run directory's rows, never a live run. Render a run directory from
its results alone (report.html, results.csv, junit.xml, summary.md); compare two runs (compare.py, the
regression gate), the CI verdict (gate.py), why a backend skipped (skips.py). Imports every stage but run/
and cli/ (docs/architecture.md)."""

from __future__ import annotations

import json
from pathlib import Path

from attnbench.report.exports import write_csv, write_junit, write_summary_md
from attnbench.report.html import default_baseline, render_html
from attnbench.store.results import read_run_results
from attnbench.store.runinfo import read_run


def _load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def render_all(run_dir: Path, baseline: str | None = None, against: Path | None = None) -> None:
    """(Re-)write every rendered file of a run; `baseline` is the backend speedups are relative to;
    `against` a baseline run whose comparison ("what changed") joins the first screen."""
    run_dir = Path(run_dir)
    rows = read_run_results(run_dir)
    env, run = _load_json(run_dir / "env.json"), read_run(run_dir).to_dict()
    baseline = baseline or default_baseline(rows)
    comparison = None
    if against is not None:
        from attnbench.report.compare import compare_runs

        comparison = compare_runs(Path(against), run_dir)
    write_csv(rows, run_dir / "results.csv")
    write_junit(rows, run_dir / "junit.xml", run)
    write_summary_md(rows, run_dir / "summary.md", env, run, baseline, comparison)
    html = render_html(rows, env, run, baseline, comparison)
    (run_dir / "report.html").write_text(html, encoding="utf-8")
