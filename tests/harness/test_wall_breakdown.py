"""The run's wall breakdown accounts for its time: on a small CPU sweep "other" (the wall time no item
of harness_cost attributes) stays under 5% of the wall, in run.json, summary.md and the report."""

from __future__ import annotations

import dataclasses
import json
import re
import time

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.report.measure import harness_cost
from attnbench.store.results import read_results


def test_a_small_cpu_sweep_leaves_little_unattributed(tmp_path):
    out = tmp_path / "run"
    args = ["sweep", "smoke", "--op", "merge_state", "--op", "gdn_decode", "-b", "torch", "--device", "cpu"]
    res = CliRunner().invoke(app, [*args, "--out", str(out), "--ref-cache", str(tmp_path / "refs")])
    assert res.exit_code == 0, res.output
    run = json.loads((out / "run.json").read_text())
    cost = harness_cost(read_results(out / "results.jsonl"), run)
    parts = {p["what"].split(" (")[0]: p["s"] for p in cost["parts"]}
    assert sum(parts.values()) == pytest.approx(run["wall_s"])
    assert all(v >= 0 for v in parts.values()), parts
    for item in ("run set-up", "worker start-up", "input building", "float64 references", "checked calls", "writing rows",
                 "checks: outputs against the reference", "checks: determinism repeats", "worker shutdown"):  # fmt: skip
        assert parts.get(item, 0) > 0, (item, parts)
    other = parts["other"]
    assert other < 0.05 * run["wall_s"] + 0.2, parts  # + 0.2 s: a loaded CI machine deschedules us that long
    assert run["costs"]["workers_started"] == 1 and run["costs"]["report_s"] > 0
    summary = (out / "summary.md").read_text()
    assert f"other {other:.1f} s" in summary and "worker start-up" in summary
    assert "worker start-up (import, load backends)" in (out / "report.html").read_text()


def test_rows_are_fsynced_once_per_case_not_once_per_row(tmp_path, monkeypatch):
    """Each fsync costs milliseconds: one per row was a fifth of a small CPU sweep's wall time."""
    from attnbench.run.executor import Execution
    from attnbench.run.runner import RunOptions
    from attnbench.run.sweep import Selection, execute, plan
    from attnbench.store import results

    p = plan(Selection(("smoke",), "cpu", ("torch", "flashinfer", "vllm"), ("merge_state",)))
    p = dataclasses.replace(p, cases=p.cases[:3])
    assert len(p.backends) > 1
    synced = []
    real = results.os.fsync
    monkeypatch.setattr(results.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    rows = execute(p, tmp_path / "run", RunOptions(timing=False), how=Execution(isolate=False), argv=[])
    assert len(rows) == 3 * len(p.backends) and len(synced) == 3
    assert len(read_results(tmp_path / "run" / "results.jsonl")) == len(rows)


TINY = "cases:\n  - op: merge_state\n    sweep: {tokens: [3, 5, 7, 9]}\n    dtypes: [fp32]\n"


def _check_breakdown(cost: dict, wall: float) -> dict:
    """No part negative, "other" included; the named parts attribute at least 95% of the wall (plus 0.2 s:
    these walls are a second or two, and a loaded 2-core CI machine deschedules the process that long)."""
    parts = {p["what"].split(" (")[0]: p["s"] for p in cost["parts"]}
    assert all(v >= 0 for v in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(wall)
    assert parts["other"] <= 0.05 * wall + 0.2, parts
    return parts


def test_a_resumed_run_counts_only_the_rows_its_own_process_produced(tmp_path):
    """A resumed sweep's wall is its own process's: rows kept from the earlier process (here made to carry
    a minute of earlier work each, as a long first process would) are left out of its breakdown, which
    then went negative ("other" -4 minutes)."""
    suite = tmp_path / "tiny.yaml"
    suite.write_text(TINY)
    out = tmp_path / "run"
    args = ["sweep", str(suite), "-b", "torch", "--device", "cpu", "--out", str(out), "--ref-cache", "off"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    lines = (out / "results.jsonl").read_text().splitlines()
    earlier = []
    for line in lines[:2]:  # the first process stopped after two cases, which took it a minute each
        d = json.loads(line)
        d |= {"inputs_s": 20.0, "reference_s": 20.0, "case_s": 60.0, "check_s": 15.0, "call_s": 5.0}
        earlier.append(json.dumps(d))
    (out / "results.jsonl").write_text("\n".join(earlier) + "\n")
    res = CliRunner().invoke(app, [*args, "--resume"])
    assert res.exit_code == 0, res.output
    run = json.loads((out / "run.json").read_text())
    assert run["resumed"][-1]["rows_kept"] == 2 and run["rows"] == 4
    rows = read_results(out / "results.jsonl")
    cost = harness_cost(rows, run)
    assert (cost["rows_counted"], cost["rows_left_out"]) == (2, 2)
    parts = _check_breakdown(cost, run["wall_s"])
    assert "2 computed" in next(p["what"] for p in cost["parts"] if p["what"].startswith("float64"))
    assert parts["input building"] < 20 and parts["per-case bookkeeping"] < 20
    summary = (out / "summary.md").read_text()
    assert "the 2 rows kept from earlier processes" in summary and "other -" not in summary
    assert "2 rows kept from earlier processes" in (out / "report.html").read_text()

    # a merge of it sums the walls of its runs and leaves the same rows out
    res = CliRunner().invoke(app, ["merge", str(out), "--out", str(tmp_path / "merged")])
    assert res.exit_code == 0, res.output
    merged = json.loads((tmp_path / "merged" / "run.json").read_text())
    assert merged["merged_from"][0]["kept"] == 2 and merged["costs"]["worker_start_s"] > 0
    mcost = harness_cost(read_results(tmp_path / "merged" / "results.jsonl"), merged)
    assert mcost["rows_left_out"] == 2
    _check_breakdown(mcost, merged["wall_s"])


def test_precompile_counts_the_time_spent_finding_what_to_build(tmp_path, monkeypatch):
    """Precompile asks every backend available() (a library's import, in the supervisor), supports() and
    precompile_keys() over the cases before any build: all of it is the precompile part, not "other"."""
    from attnbench.run import sweep
    from attnbench.run.executor import Execution
    from attnbench.run.runner import RunOptions

    real = sweep.precompile

    def slow(*args, **kw):  # a library import of half a second among the available() calls
        time.sleep(0.5)
        return real(*args, **kw)

    monkeypatch.setattr(sweep, "precompile", slow)
    p = sweep.plan(sweep.Selection(("smoke",), "cpu", ("torch",), ("merge_state",)))
    p = dataclasses.replace(p, cases=p.cases[:3])
    rows = sweep.execute(p, tmp_path / "run", RunOptions(timing=False), how=Execution(isolate=False), argv=[])
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    parts = _check_breakdown(harness_cost(rows, run), run["wall_s"])
    assert parts["precompile"] >= 0.5, parts


def test_a_run_stopped_mid_way_still_accounts_for_its_workers(tmp_path, monkeypatch):
    """Stopped while a worker was mid-case (Ctrl-C, a time limit), run.json still holds the workers'
    start-up, shutdown and the cut-off case's seconds (they used to be lost with the executor's return
    value, leaving a fifth of an interrupted GPU run's wall as "other")."""
    from pathlib import Path

    from attnbench.backend import load_plugin
    from attnbench.run.executor import Execution
    from attnbench.run.runner import RunOptions
    from attnbench.run.sweep import Selection, execute, plan

    plugin = str(Path(__file__).resolve().parents[1] / "support" / "planted_backend.py")
    monkeypatch.setenv("ATTNBENCH_PLANTED_SLEEP_S", "0.15")  # each call: a case takes a second or two
    load_plugin(plugin)
    suite = tmp_path / "tiny.yaml"
    suite.write_text(TINY)
    p = plan(Selection((str(suite),), "cpu", ("planted",)))
    seen = []

    def stop(case, rows):  # the first case done: the other worker is still running its own
        seen.append(case.id)
        raise KeyboardInterrupt

    out = tmp_path / "run"
    how = Execution(isolate=True, devices=("cpu", "cpu"), plugins=(plugin,))
    with pytest.raises(KeyboardInterrupt):
        execute(p, out, RunOptions(timing=False), on_rows=stop, argv=[], how=how)  # no reference cache
    run = json.loads((out / "run.json").read_text())
    assert run["complete"] is False and run["stopped_by"] == "KeyboardInterrupt" and len(seen) == 1
    costs = run["costs"]
    assert costs["workers_started"] == 2 and costs["worker_start_s"] > 0 and costs["worker_stop_s"] >= 0
    assert costs["unfinished_s"] > 0.1, costs  # the second worker's case, cut off
    cost = harness_cost(read_results(out / "results.jsonl"), run)
    assert cost["workers"] == 2  # two workers: their machine time against twice the wall
    parts = _check_breakdown(cost, run["wall_s"] * 2)
    assert parts["cases cut off when the run stopped"] == pytest.approx(costs["unfinished_s"], abs=1e-3)


def test_a_run_without_a_bytecode_cache_says_so(tmp_path):
    """PYTHONDONTWRITEBYTECODE makes every process compile what it imports (13.7 s a process on an H100 with
    every backend): env.json records it and summary.md names it beside the wall breakdown."""
    import subprocess
    import sys

    args = ["sweep", "smoke", "--op", "merge_state", "-k", "t33", "-b", "torch", "--device", "cpu", "--no-isolate"]
    for flag, said in (("1", True), ("", False)):
        out = tmp_path / f"run{flag}"
        env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        if flag:
            env["PYTHONDONTWRITEBYTECODE"] = flag
        cmd = [sys.executable, "-m", "attnbench", *args, "--out", str(out), "--ref-cache", "off"]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert json.loads((out / "env.json").read_text()).get("no_bytecode_cache", False) is said
        assert ("Python wrote no bytecode cache" in (out / "summary.md").read_text()) is said


def test_every_check_a_row_timed_is_an_item_not_other():
    """The wall breakdown follows the rows' check_parts, not a fixed list: the CUDA-graph replay check
    (on an H100, 13.5 s of a ci sweep that the breakdown had called "other") and a plugin's own check
    are items of their own."""
    import synthetic

    parts = {"outputs": 1.0, "replay": 3.0, "mine": 2.0}
    row = synthetic.row("decode/b4-l64", "triton", timing=None, median_us=None).model_copy(update=dict(
        inputs_s=0.5, reference_s=0.5, prepare_s=0.0, call_s=1.0, check_s=sum(parts.values()), check_parts=parts,
        case_s=8.0,
    ))  # fmt: skip
    run = {"wall_s": 8.0, "costs": {}, "executor": "in-process"}
    items = {p["what"]: p["s"] for p in harness_cost([row], run)["parts"]}
    assert items["checks: CUDA-graph replay"] == 3.0 and items["checks: mine"] == 2.0
    assert items["other (not attributed)"] == pytest.approx(0.0)


def test_the_timing_is_split_by_phase_and_older_rows_stay_one_item():
    """#32: the timing's seconds by phase (sampling, L2 flushes, input copies, graph capture, settle, ...),
    each case counted once; a case whose rows kept no phases (an older run) is one item of its own."""
    import synthetic

    def timed(case, backend, phases):
        row = synthetic.row(case, backend)
        spent = dict(wall_s=sum(phases.values()), phases=phases) if phases else dict(wall_s=2.0)  # None: an older row
        return row.model_copy(update=dict(timing={**row.timing, **spent}, case_s=10.0))

    a = {"warm-up": 0.5, "pilot": 0.25, "input copies": 1.0, "graph capture": 0.5, "settle": 0.25, "sampling": 2.0,
         "L2 flushes": 0.5, "statistics": 0.0}  # fmt: skip
    b = {"warm-up": 0.5, "pilot": 0.5, "sampling": 1.0, "statistics": 0.25}
    rows = [timed("decode/b1-l64", "triton", a), timed("decode/b1-l64", "torch", a), timed("decode/b2-l64", "triton", b),
            timed("decode/b3-l64", "triton", None)]  # fmt: skip
    items = {p["what"]: p["s"] for p in harness_cost(rows, {"wall_s": 40.0, "costs": {}})["parts"]}
    assert items["timing: sampling"] == 3.0 and items["timing: L2 flushes"] == 0.5
    assert items["timing: input copies"] == 1.0 and items["timing: settle"] == 0.25
    assert items["timing: warm-up"] == 1.0 and items["timing: statistics"] == 0.25
    assert items["timing: (phases not recorded)"] == 2.0
    assert "timing: graph capture" in items and not any(k.startswith("timing (") for k in items)


def test_a_cpu_sweep_timed_on_the_host_records_its_phases(tmp_path):
    out = tmp_path / "run"
    args = ["sweep", "smoke", "--op", "merge_state", "-b", "torch", "--device", "cpu", "--timing"]
    res = CliRunner().invoke(app, [*args, "--out", str(out), "--ref-cache", "off"])
    assert res.exit_code == 0, res.output
    rows = [r for r in read_results(out / "results.jsonl") if r.timing]
    assert rows
    for r in rows:
        ph = r.timing["phases"]
        assert set(ph) == {"warm-up", "sampling", "statistics"} and all(v >= 0 for v in ph.values())
        assert sum(ph.values()) == pytest.approx(r.timing["wall_s"], rel=1e-6)
    assert re.search(
        r"timing \d+\.\d s \(warm-up \d+\.\d, sampling \d+\.\d, statistics", (out / "summary.md").read_text()
    )
