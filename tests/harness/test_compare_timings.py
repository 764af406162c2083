"""Comparisons compare what they say: timings that are not finite positive numbers are never "same",
and host-clock (CPU, Triton interpreter) timings are correctness-only in compare and gate."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import synthetic
from attnbench.cli.app import app
from attnbench.report.compare import GateRule, compare_pair

CASES = [f"decode/b{b}-l1024-h32x8-d128-bf16" for b in (1, 8)]
CPU_ENV = {"device": "cpu", "cpu": "x86_64", "libraries": {"torch": "2.13.0"}}


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def _timed(cid, us=20.0, **fields):
    t = synthetic.timing(us, seed=hash(cid) % 97)
    r = synthetic.row(cid, "triton", timing=dict(t))
    r.timing = t | fields  # as a broken timer or an edited results file leaves it
    return r


@pytest.mark.parametrize("bad", [float("nan"), 0.0, float("inf"), -5.0])
@pytest.mark.parametrize("side", ["base", "new"])
def test_a_timing_that_is_not_finite_and_positive_is_not_comparable(bad, side):
    good, odd = _timed(CASES[0]), _timed(CASES[0], median_us=bad)
    base, new = (odd, good) if side == "base" else (good, odd)
    c = compare_pair(base, new, GateRule())
    assert c.verdict == "not comparable", c
    assert "not a finite positive timing" in c.note and f"{side} median" in c.note


def test_a_nan_confidence_interval_is_not_comparable():
    c = compare_pair(_timed(CASES[0]), _timed(CASES[0], ci95_us=[float("nan"), float("nan")]), GateRule())
    assert c.verdict == "not comparable" and "new CI" in c.note


@pytest.mark.parametrize("bad", [float("nan"), 0.0])
def test_compare_of_runs_whose_timings_are_all_unusable_fails(tmp_path, bad):
    """Both directions: NaN (or zero) against a real timing never passes as "same"."""
    good = synthetic.write_run(tmp_path / "good", [_timed(c) for c in CASES])
    odd = synthetic.write_run(tmp_path / "odd", [_timed(c, median_us=bad) for c in CASES])
    for a, b in ((good, odd), (odd, good), (odd, odd)):
        res = invoke("compare", a, b, "--out", tmp_path / "cmp")
        assert res.exit_code == 1, res.output
        assert "none of the 2 common rows can be compared" in res.output, res.output
        assert "not a finite positive timing" in res.output


def _host(cid, us, status="pass"):
    t = synthetic.timing(us, seed=3)
    t["clock"] = "host"
    return synthetic.row(cid, "torch", status=status, timing=t, env=CPU_ENV)


def test_host_clock_rows_are_never_judged_on_speed(tmp_path):
    """Two CPU runs, the second 200x slower: compare shows the times and passes (correctness only)."""
    base = synthetic.write_run(tmp_path / "a", [_host(c, 20.0) for c in CASES], env=CPU_ENV)
    new = synthetic.write_run(tmp_path / "b", [_host(c, 4000.0) for c in CASES], env=CPU_ENV)
    res = invoke("compare", base, new, "--out", tmp_path / "cmp")
    assert res.exit_code == 0, res.output
    assert "slower" not in res.output and "faster" not in res.output
    import json

    changes = json.loads((tmp_path / "cmp" / "compare.json").read_text())["changes"]
    assert {c["verdict"] for c in changes} == {"same"}
    assert all(c["change"] is None and c["new_us"] > 1000 for c in changes)
    assert all("correctness only" in c["note"] for c in changes)
    res = invoke("gate", new, "--baseline", base)
    assert res.exit_code == 0 and "gate: pass" in res.output, res.output


def test_host_clock_rows_still_break_on_correctness(tmp_path):
    base = synthetic.write_run(tmp_path / "a", [_host(c, 20.0) for c in CASES], env=CPU_ENV)
    new = synthetic.write_run(tmp_path / "b", [_host(CASES[0], 20.0), _host(CASES[1], 20.0, "fail")], env=CPU_ENV)
    res = invoke("compare", base, new, "--out", tmp_path / "cmp")
    assert res.exit_code == 1 and "broke" in res.output, res.output


def test_host_timed_against_untimed_is_correctness_only():
    """A CPU run with --timing against one without: nothing about speed to compare, correctness same."""
    untimed = synthetic.row(CASES[0], "torch", median_us=None, env=CPU_ENV)
    c = compare_pair(_host(CASES[0], 20.0), untimed, GateRule())
    assert c.verdict == "same" and "correctness only" in c.note
