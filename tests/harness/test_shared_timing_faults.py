"""A failure in the timing shared by a case's backends ends with each backend's own verdict: the
culprit's row is the error, the others are timed (in process: alone after the shared timing failed;
isolated: after a lost context or a crash, each backend in a job of its own, never split again)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnbench.backend import get_backend, load_plugin
from attnbench.case import Case
from attnbench.run.executor import ALONE_HINT, InProcess
from attnbench.run.pool import Pool
from attnbench.run.runner import ContextLost, RunOptions, _after_shared, run_case
from attnbench.run.timing import TimingConfig

PLUGIN = str(Path(__file__).resolve().parents[1] / "support" / "timed_faults.py")
CASES = ("merge_state/t8-h2-d16-bf16", "merge_state/t9-h2-d16-fp32")
QUICK = TimingConfig(warmup_s=0.0, warmup_calls=1, min_samples=3, max_samples=6, max_s=0.1, target_ci=0.5,
                     graph_below_us=0)  # fmt: skip
OPTS = RunOptions(timing=True, timing_config=QUICK, determinism_repeats=1)


@pytest.fixture(scope="module", autouse=True)
def _plugin():
    load_plugin(PLUGIN)


def _pool(tmp_path, jobs):
    """Rows by (case id, backend), each asserted to come once, and the problems said; more than a few
    problems (a job split again and again) stops the run instead of looping."""
    rows, problems = {}, []

    def on_rows(case, got):
        for r in got:
            assert (r.case_id, r.backend) not in rows, f"a second row for {r.case_id} {r.backend}"
            rows[r.case_id, r.backend] = r

    def on_problem(msg):
        problems.append(msg)
        assert len(problems) <= 4, problems

    pool = Pool(["cpu"], OPTS, on_rows, plugins=[PLUGIN], timeout_s=60, log_dir=tmp_path / "logs",
                on_problem=on_problem)  # fmt: skip
    pool.run([(Case.from_id(c, "cpu"), names) for c, names in jobs])
    return rows, problems


def _timed_fine(row) -> bool:
    return row.status == "pass" and row.timing is not None and row.timing["n"] >= 3


def test_a_plain_failure_under_the_timer_is_the_culprits_alone_in_process():
    case = Case.from_id(CASES[0], "cpu")
    bad, good = run_case(case, [get_backend("raises-timed"), get_backend("torch")], OPTS)
    assert bad.status == "error" and bad.reason.startswith("timing failed: ValueError: planted"), bad.reason
    assert bad.timing is None
    assert _timed_fine(good), (good.status, good.reason)
    assert good.timing["note"].startswith("timed alone: timed together with raises-timed it failed (ValueError")


def test_a_plain_failure_under_the_timer_is_the_culprits_alone_isolated(tmp_path):
    rows, problems = _pool(tmp_path, [(CASES[0], ["raises-timed", "torch"])])
    assert set(rows) == {(CASES[0], "raises-timed"), (CASES[0], "torch")}
    assert rows[CASES[0], "raises-timed"].status == "error"
    assert "planted: fails under the timer" in rows[CASES[0], "raises-timed"].reason
    assert _timed_fine(rows[CASES[0], "torch"]) and "timed alone" in rows[CASES[0], "torch"].timing["note"]
    assert problems == []  # the worker kept its context: nothing restarted


def test_a_context_lost_in_the_shared_timing_runs_each_backend_alone_in_a_fresh_worker(tmp_path):
    jobs = [(c, ["loses-context-timed", "torch"]) for c in CASES]
    rows, problems = _pool(tmp_path, jobs)
    assert len(rows) == 4  # one row per (case, backend): none lost, none twice
    for c in CASES:
        culprit, other = rows[c, "loses-context-timed"], rows[c, "torch"]
        assert culprit.status == "error" and culprit.reason.startswith(
            "timing failed: RuntimeError: CUDA error: an illegal memory access"
        )
        assert "together" not in culprit.reason  # timed alone, it is its own
        assert _timed_fine(other) and "timed alone" not in other.timing["note"], other.reason
    # per case: the shared timing lost the context (split), then the culprit alone lost it again (attributed)
    assert len(problems) == 4, problems
    split = [p for p in problems if "each alone" in p]
    assert [p.split("running ")[1] for p in split] == [
        f"loses-context-timed and torch of {c} each alone" for c in CASES
    ]


def test_a_context_lost_in_the_shared_timing_in_process_says_it_is_unattributed():
    got = []
    backends = {n: get_backend(n) for n in ("loses-context-timed", "torch")}
    jobs = [(Case.from_id(c, "cpu"), list(backends)) for c in CASES]
    InProcess(backends, OPTS, {}).run(jobs, lambda case, rows: got.extend(rows))
    first = {r.backend: r for r in got if r.case_id == CASES[0]}
    for name, other in (("loses-context-timed", "torch"), ("torch", "loses-context-timed")):
        r = first[name]
        assert r.status == "error" and r.reason.startswith(f"timing failed while timed together with {other} (")
        assert "which backend broke it is unknown" in r.reason and r.reason.endswith(ALONE_HINT)
    later = [r for r in got if r.case_id == CASES[1]]
    assert len(later) == 2 and all("context was lost earlier" in r.reason for r in later)


def test_a_worker_crash_in_the_shared_timing_runs_each_backend_alone(tmp_path):
    rows, problems = _pool(tmp_path, [(CASES[0], ["exits-timed", "torch"])])
    assert set(rows) == {(CASES[0], "exits-timed"), (CASES[0], "torch")}
    culprit = rows[CASES[0], "exits-timed"]
    assert culprit.status == "error" and "worker crashed (exit code 9) while timing" in culprit.reason
    assert _timed_fine(rows[CASES[0], "torch"])
    assert len(problems) == 1 and "timing exits-timed and torch together: worker crashed (exit code 9)" in problems[0]
    assert problems[0].endswith("running each alone")


class _Stats:
    note = ""


def test_a_backend_that_loses_the_context_timed_alone_is_the_culprit_and_the_untimed_rest_goes_alone():
    """Timed together, a plain error; alone, `b` loses the context: `a` keeps its timing, `b` its error,
    and `c`, never timed, is left for a fresh process (`alone`)."""
    from attnbench.store.results import Result

    def timer(names):
        if len(names) > 1:
            raise ValueError("together")
        if names == ["b"]:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return {names[0]: _Stats()}

    rows = {n: Result(case_id="x", op="o", backend=n, status="pass") for n in "abc"}
    recorded, stages = {}, []
    with pytest.raises(ContextLost) as lost:
        _after_shared(list("abc"), timer, recorded.__setitem__, rows, ValueError("together"), stages.append)
    assert lost.value.alone == ("c",) and [r.backend for r in lost.value.rows] == list("abc")
    assert list(recorded) == ["a"] and recorded["a"].note.startswith("timed alone: timed together with b, c it failed")
    assert stages == ["a", "b"]
    assert (rows["a"].status, rows["b"].status, rows["c"].status) == ("pass", "error", "error")
    assert rows["b"].reason.startswith("timing failed: RuntimeError: CUDA error") and "b alone" in rows["c"].reason


def test_a_worker_crash_while_building_a_case_blames_no_backend_and_the_next_case_runs(tmp_path):
    """Every backend of the case gets an error row (it could not run), whose reason says the worker died
    in the case's inputs and references, where no backend code runs; a fresh worker takes the next case."""
    crash = str(Path(__file__).resolve().parents[1] / "support" / "reference_crash.py")
    rows = {}
    pool = Pool(["cpu"], OPTS, lambda case, got: rows.update({(r.case_id, r.backend): r for r in got}),
                plugins=[PLUGIN, crash], timeout_s=60, log_dir=tmp_path / "logs")  # fmt: skip
    pool.run([(Case.from_id(c, "cpu"), ["raises-timed", "torch"]) for c in (CASES[1], CASES[0])])
    assert len(rows) == 4
    for name in ("raises-timed", "torch"):
        r = rows[CASES[1], name]
        assert (
            r.status == "error"
            and "worker crashed (exit code 9) while building the case's inputs and references" in r.reason
        )
        assert "no backend code runs there" in r.reason
    assert _timed_fine(rows[CASES[0], "torch"])
