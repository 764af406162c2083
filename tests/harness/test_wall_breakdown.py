"""The run's wall breakdown accounts for its time: on a small CPU sweep "other" (the wall time no item
of harness_cost attributes) stays under 5% of the wall, in run.json, summary.md and the report."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.report.measure import harness_cost
from attnbench.results import read_results


def test_a_small_cpu_sweep_leaves_little_unattributed(tmp_path):
    out = tmp_path / "run"
    args = ["sweep", "smoke", "--op", "merge_state", "--op", "gdn_decode", "-b", "torch", "--device", "cpu"]
    res = CliRunner().invoke(app, [*args, "--out", str(out), "--ref-cache", str(tmp_path / "refs")])
    assert res.exit_code == 0, res.output
    run = json.loads((out / "run.json").read_text())
    cost = harness_cost(read_results(out / "results.jsonl"), run)
    parts = {p["what"].split(" (")[0]: p["s"] for p in cost["parts"]}
    assert sum(parts.values()) == pytest.approx(run["wall_s"])
    for item in ("worker start-up", "input building", "float64 references", "checked calls", "writing rows",
                 "checks: outputs against the reference", "checks: determinism repeats", "worker shutdown"):  # fmt: skip
        assert parts.get(item, 0) > 0, (item, parts)
    other = parts["other"]
    assert other < 0.05 * run["wall_s"], parts
    assert run["costs"]["workers_started"] == 1 and run["costs"]["report_s"] > 0
    summary = (out / "summary.md").read_text()
    assert f"other {other:.1f} s" in summary and "worker start-up" in summary
    assert "worker start-up (import, load backends)" in (out / "report.html").read_text()


def test_rows_are_fsynced_once_per_case_not_once_per_row(tmp_path, monkeypatch):
    """Each fsync costs milliseconds: one per row was a fifth of a small CPU sweep's wall time."""
    from attnbench import results
    from attnbench.executor import Execution
    from attnbench.runner import RunOptions
    from attnbench.sweep import execute, plan

    p = plan(["smoke"], "cpu", ["torch", "flashinfer", "vllm"], ["merge_state"])
    p = dataclasses.replace(p, cases=p.cases[:3])
    assert len(p.backends) > 1
    synced = []
    real = results.os.fsync
    monkeypatch.setattr(results.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    rows = execute(p, tmp_path / "run", RunOptions(timing=False), how=Execution(isolate=False), argv=[])
    assert len(rows) == 3 * len(p.backends) and len(synced) == 3
    assert len(read_results(tmp_path / "run" / "results.jsonl")) == len(rows)
