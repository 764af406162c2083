"""The regression gate: synthetic results (planted slowdowns, noise, breakages) and an end-to-end CPU run."""

from __future__ import annotations

import json
import re
import time

import pytest
from typer.testing import CliRunner

import attnbench
import synthetic
from attnbench.backend import _INSTANCES, _REGISTRY
from attnbench.cli.app import app
from attnbench.report.compare import GateRule, compare_pair, compare_rows, compare_runs
from attnbench.report.comparison import write_comparison

CASES = [f"decode/b{b}-l{l}-h32x8-d128-bf16" for b in (1, 8, 64) for l in (1024, 4096)]


def _rows(scale: dict[str, float] | float = 1.0, noise: float = 0.01, seed: int = 0, **kw):
    out = []
    for i, cid in enumerate(CASES):
        s = scale.get(cid, 1.0) if isinstance(scale, dict) else scale
        t = synthetic.timing(20.0 * (i + 1) * s, rel_noise=noise, seed=seed * 100 + i)
        out.append(synthetic.row(cid, "triton", timing=t, **kw))
    return out


def test_planted_ten_percent_slowdown_is_flagged():
    changes = compare_rows(_rows(seed=1), _rows({CASES[2]: 1.10}, seed=2))
    slow = [c for c in changes if c.verdict == "slower"]
    assert [c.case_id for c in slow] == [CASES[2]]
    assert slow[0].change == pytest.approx(0.10, abs=0.01) and slow[0].ci_separate
    assert all(c.verdict == "same" for c in changes if c.case_id != CASES[2])


def test_one_percent_shift_is_not_flagged():
    changes = compare_rows(_rows(seed=1), _rows(1.01, seed=2))
    assert {c.verdict for c in changes} == {"same"}  # CIs may separate, but 1% < max(3%, 3 CV)


def test_threshold_grows_with_noise():
    # 8% slower with 5% noise: 3 CV = 15% > 8%, so not a regression ("noisy" or "same")
    changes = compare_rows(_rows(noise=0.05, seed=1), _rows(1.08, noise=0.05, seed=2))
    assert not [c for c in changes if c.regression]
    assert all(c.threshold == pytest.approx(0.15, rel=0.25) for c in changes)


def test_outliers_do_not_blind_the_gate():
    """A few hiccups inflate std/mean; the gate's robust CV still catches a 10% slowdown."""
    base, new = _rows(seed=1), _rows(1.10, seed=2)
    for r in new:
        t = r.timing
        t["cv"] = 0.5  # as if a few samples were 20x slower
    assert all(c.verdict == "slower" for c in compare_rows(base, new))


def test_faster_is_reported_not_failed():
    changes = compare_rows(_rows(seed=1), _rows(0.85, seed=2))
    assert {c.verdict for c in changes} == {"faster"} and not any(c.regression for c in changes)


def test_correctness_regressions_always_count():
    base = [
        synthetic.row(CASES[0], "triton"),
        synthetic.row(CASES[1], "triton"),
        synthetic.row(CASES[2], "triton"),
        synthetic.row(CASES[3], "triton", status="fail"),
        synthetic.row(CASES[4], "triton"),
    ]
    new = [
        synthetic.row(CASES[0], "triton", status="fail"),
        synthetic.row(CASES[1], "triton", status="error"),
        synthetic.row(CASES[2], "triton", status="skip"),
        synthetic.row(CASES[3], "triton"),
        synthetic.row(CASES[5], "triton"),
    ]
    verdicts = {c.case_id: c.verdict for c in compare_rows(base, new)}
    assert verdicts == {
        CASES[0]: "broke",
        CASES[1]: "broke",
        CASES[2]: "now skipped",
        CASES[3]: "fixed",
        CASES[4]: "missing",
        CASES[5]: "new",
    }
    broke = compare_pair(base[0], new[0], GateRule())
    assert broke.regression and "max abs error" in broke.note


def test_different_timing_modes_are_not_compared():
    b = synthetic.row(CASES[0], "triton", timing=synthetic.timing(10.0))
    n = synthetic.row(CASES[0], "triton", timing=synthetic.timing(20.0, mode="cuda-graph", calls_per_sample=20))
    c = compare_pair(b, n, GateRule())
    assert c.verdict == "not comparable" and not c.regression and "cuda-graph" in c.note


def test_cli_gate_exit_codes_and_files(tmp_path):
    base = synthetic.write_run(tmp_path / "base", _rows(seed=1))
    same = synthetic.write_run(tmp_path / "same", _rows(1.005, seed=3))
    slow = synthetic.write_run(tmp_path / "slow", _rows({CASES[4]: 1.10}, seed=4))
    runner = CliRunner()
    ok = runner.invoke(app, ["compare", str(base), str(same)])
    assert ok.exit_code == 0, ok.output
    assert (same / "compare" / "compare.html").is_file() and (same / "compare" / "compare.md").is_file()
    bad = runner.invoke(app, ["compare", str(base), str(slow), "--out", str(tmp_path / "gate")])
    assert bad.exit_code == 1, bad.output
    md = (tmp_path / "gate" / "compare.md").read_text()
    assert "REGRESSION" in md and CASES[4] in md and "slower" in md
    data = json.loads((tmp_path / "gate" / "compare.json").read_text())
    assert data["regressions"] == 1 and data["counts"]["slower"] == 1
    html = (tmp_path / "gate" / "compare.html").read_text()
    assert not re.search(r"(src|href)=[\"']?https?:|url\(https?:|@import", html)  # self-contained: nothing loaded
    missing = runner.invoke(app, ["compare", str(tmp_path / "nope"), str(slow)])
    assert missing.exit_code == 2


def test_env_differences_are_warned(tmp_path):
    base = synthetic.write_run(tmp_path / "a", _rows(seed=1))
    new = synthetic.write_run(tmp_path / "b", _rows(seed=2), env=synthetic.ENV | {"driver": "580.1"})
    cmp = compare_runs(base, new)
    assert cmp.env_warnings() == ["driver differs: 570.86 -> 580.1"]
    write_comparison(cmp, tmp_path / "out")
    assert "driver differs" in (tmp_path / "out" / "compare.md").read_text()


# ---- end to end on the CPU: a plugin backend that sleeps -------------------------------------------


SLEEP = {"s": 0.004}


@pytest.fixture
def sleepy():
    """A backend registered here: the torch kernel, then a wait until SLEEP['s'] have passed since the call.

    The wait sleeps until 0.5 ms before the deadline (a sleeping process keeps its place in the scheduler on a
    loaded machine, a spinning one is preempted for whole time slices), then spins to the deadline (time.sleep
    alone overshoots by a varying 50-100 us), so a 10% longer wait is a 10% slower kernel.
    """
    from attnbench.kernels.torch import TorchBackend

    @attnbench.register_backend("sleepy")
    class Sleepy(TorchBackend):
        description = "torch, then a timed wait (tests of the regression gate)"

        def prepare(self, case, inputs):
            inner = super().prepare(case, inputs)

            def run():
                deadline = time.perf_counter() + SLEEP["s"]
                out = inner()
                time.sleep(max(0.0, deadline - time.perf_counter() - 5e-4))
                while time.perf_counter() < deadline:
                    pass
                return out

            return run

    yield Sleepy
    _REGISTRY.pop("sleepy", None)
    _INSTANCES.pop("sleepy", None)


def _sweep(out, sleep_s):
    from attnbench.report import render_all
    from attnbench.run.runner import RunOptions
    from attnbench.run.sweep import Execution, Selection, execute, plan
    from attnbench.run.timing import TimingConfig

    SLEEP["s"] = sleep_s
    cfg = TimingConfig(
        warmup_s=0.0,
        warmup_calls=2,
        min_samples=15,
        max_samples=80,
        max_s=0.6,
        target_ci=0.01,
        graph_below_us=0,
    )
    p = plan(Selection(("smoke",), "cpu", ("sleepy",), ("merge_state",)))
    execute(p, out, RunOptions(timing=True, timing_config=cfg), how=Execution(isolate=False))  # registered in-process
    render_all(out)
    return out


def _converged(run) -> bool:
    return all(json.loads(line)["timing"]["converged"] for line in open(run / "results.jsonl"))


def _gate(base, new) -> int:
    return CliRunner().invoke(app, ["compare", str(base), str(new)]).exit_code


def test_end_to_end_gate_on_cpu(sleepy, tmp_path):
    """Two runs of a kernel compare clean; a 10% slower one fails the gate (plugin -> sweep -> compare).

    Host-clock timings are correctness-only, so the 10% slower CPU run passes as it is; its samples,
    relabelled as GPU-clock ones, then reach the speed rule. The runs are retaken once when a verdict
    or a measured slowdown is off (a loaded host: one of 12 slowdowns measured outside 5-15% in a CI run
    sharing two cores with three other jobs); on a host so loaded that even the retaken timings do not converge (most samples
    preempted), the test skips: no timing can be judged there.
    """
    for attempt in range(2):
        d = tmp_path / f"try{attempt}"
        base, again, slower = (
            _sweep(d / name, s) for name, s in (("base", 0.004), ("again", 0.004), ("slower", 0.0044))
        )
        assert _gate(base, slower) == 0 and {c.verdict for c in compare_runs(base, slower).changes} == {"same"}
        for run in (base, again, slower):
            synthetic.relabel_as_gpu_clock(run)
        clean, gate = _gate(base, again), _gate(base, slower)
        cmp = compare_runs(base, slower)
        slow = [c for c in cmp.changes if c.verdict == "slower"]
        if clean == 0 and gate == 1 and len(slow) >= 3 and all(0.05 < c.change < 0.15 for c in slow):
            break  # every verdict right, and every slowdown measured near its planted 10%
    else:
        if not all(_converged(r) for r in (base, again, slower)):
            pytest.skip("host too loaded: timings did not converge, twice")
    assert clean == 0, (again / "compare" / "compare.md").read_text()
    assert gate == 1, (slower / "compare" / "compare.md").read_text()
    assert len(slow) >= 3 and all(0.05 < c.change < 0.15 for c in slow), cmp.to_dict()
    assert {c.verdict for c in compare_runs(base, again).changes} == {"same"}


def test_pooled_baselines_carry_the_noise_between_runs():
    """Two baseline runs 5% apart on one row: a third run at the slower one's speed is not a
    regression against both (it is against the faster one alone); a real 10% slowdown still is."""
    from attnbench.report.compare import pool_runs

    fast, slow = _rows(seed=1), _rows({CASES[0]: 1.05}, seed=2)
    again = _rows({CASES[0]: 1.05}, seed=3)
    alone = {c.case_id: c.verdict for c in compare_rows(fast, again)}
    assert alone[CASES[0]] == "slower"
    pooled = pool_runs([fast, slow])
    t = pooled[0].timing
    assert (
        t["runs"] == 2
        and t["ci95_us"][0] <= fast[0].timing["ci95_us"][0]
        and t["ci95_us"][1] >= slow[0].timing["ci95_us"][1]
    )
    assert t["rcv"] == pytest.approx(0.05 / 2**0.5, rel=0.2)  # stdev/mean of the two medians
    verdicts = {c.case_id: c.verdict for c in compare_rows(pooled, again)}
    assert verdicts[CASES[0]] != "slower" and set(verdicts.values()) <= {"same", "noisy"}
    planted = {c.case_id: c.verdict for c in compare_rows(pooled, _rows({CASES[3]: 1.10}, seed=4))}
    assert planted[CASES[3]] == "slower"


def test_cli_compare_pools_baselines_with_also(tmp_path):
    from attnbench.store.results import ResultWriter

    for name, rows in (
        ("b1", _rows(seed=1)),
        ("b2", _rows({CASES[0]: 1.05}, seed=2)),
        ("new", _rows({CASES[0]: 1.05}, seed=3)),
    ):
        (tmp_path / name).mkdir()
        with ResultWriter(tmp_path / name / "results.jsonl") as w:
            for r in rows:
                w.append(r)
    one = CliRunner().invoke(app, ["compare", str(tmp_path / "b1"), str(tmp_path / "new")])
    both = CliRunner().invoke(
        app, ["compare", str(tmp_path / "b1"), str(tmp_path / "new"), "--also", str(tmp_path / "b2")]
    )
    assert one.exit_code == 1 and both.exit_code == 0, both.output
    assert json.loads((tmp_path / "new" / "compare" / "compare.json").read_text())["base"].count(" + ") == 1
