"""Render a run directory from its results alone: report.html, results.csv, junit.xml, summary.md."""

from __future__ import annotations

import json
from pathlib import Path

from attnbench.report.exports import write_csv, write_junit, write_summary_md
from attnbench.report.html import default_baseline, render_html
from attnbench.results import read_results
from attnbench.runinfo import read_run


def _load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def render_all(run_dir: Path, baseline: str | None = None) -> None:
    """(Re-)write every rendered file of a run; `baseline` is the backend speedups are relative to."""
    run_dir = Path(run_dir)
    rows = read_results(run_dir / "results.jsonl")
    env, run = _load_json(run_dir / "env.json"), read_run(run_dir).to_dict()
    baseline = baseline or default_baseline(rows)
    write_csv(rows, run_dir / "results.csv")
    write_junit(rows, run_dir / "junit.xml")
    write_summary_md(rows, run_dir / "summary.md", env, run, baseline)
    (run_dir / "report.html").write_text(render_html(rows, env, run, baseline), encoding="utf-8")
