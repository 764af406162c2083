"""Verdicts a user can trust (issue #17): the gate has no holes, nothing is lost, bad input is one line."""

from __future__ import annotations

from typer.testing import CliRunner

import synthetic
from attnbench.cli import app
from attnbench.compare import GateRule, compare_pair, compare_runs

runner = CliRunner()
CASES = [f"decode/b{b}-l1024-h32x8-d128-bf16" for b in (1, 8, 64)]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _run(path, rows):
    return synthetic.write_run(path, rows)


def _timed(cid, backend="triton", us=20.0, **kw):
    return synthetic.row(cid, backend, timing=synthetic.timing(us, seed=hash(cid) % 97, **kw))


# ---- the regression gate has no holes -------------------------------------------------------------


def test_compare_with_no_rows_in_common_fails_the_gate(tmp_path):
    base = _run(tmp_path / "a", [_timed(CASES[0], "triton")])
    new = _run(tmp_path / "b", [_timed(CASES[0], "flashinfer")])
    res = invoke("compare", base, new, "--allow-missing")
    assert res.exit_code == 1, res.output
    assert "no rows in common" in res.output and "Traceback" not in res.output


def test_compare_where_every_common_row_is_not_comparable_fails_the_gate(tmp_path):
    base = _run(tmp_path / "a", [_timed(c) for c in CASES])
    graph = [synthetic.row(c, "triton", timing=synthetic.timing(20.0, mode="cuda-graph")) for c in CASES]
    new = _run(tmp_path / "b", graph)
    res = invoke("compare", base, new)
    assert res.exit_code == 1, res.output
    assert "none of the 3 common rows can be compared" in res.output and "cuda-graph" in res.output


def test_timed_against_untimed_is_not_comparable():
    c = compare_pair(_timed(CASES[0]), synthetic.row(CASES[0], "triton", median_us=None), GateRule())
    assert c.verdict == "not comparable" and "timed in base only" in c.note


def test_rows_timed_on_different_gpus_are_not_comparable():
    b = _timed(CASES[0])
    n = _timed(CASES[0])
    n.env = {"device": "cuda", "gpu": "NVIDIA H200"}
    b.env = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3"}
    n.timing = synthetic.timing(40.0)  # twice as slow, but on another GPU: no verdict on speed
    c = compare_pair(b, n, GateRule())
    assert c.verdict == "not comparable" and "H200" in c.note and not c.regression


def test_missing_and_newly_skipped_rows_fail_the_gate_unless_allowed(tmp_path):
    base = _run(tmp_path / "a", [_timed(c) for c in CASES])
    new_rows = [_timed(CASES[0]), synthetic.row(CASES[1], "triton", status="skip", median_us=None)]
    new = _run(tmp_path / "b", new_rows)
    cmp = compare_runs(base, new)
    assert sorted(c.verdict for c in cmp.regressions) == ["missing", "now skipped"]
    assert invoke("compare", base, new).exit_code == 1
    res = invoke("compare", base, new, "--allow-missing")
    assert res.exit_code == 0, res.output
    assert not compare_runs(base, new, GateRule(allow_missing=True)).regressions


def test_identical_runs_still_pass_the_gate(tmp_path):
    rows = [_timed(c) for c in CASES]
    base, new = _run(tmp_path / "a", rows), _run(tmp_path / "b", rows)
    res = invoke("compare", base, new)
    assert res.exit_code == 0, res.output
