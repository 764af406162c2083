"""The next case's inputs built ahead (harness/run/inputs_ahead.py): on the background thread while this case
runs, bitwise what `make_inputs` gives, built once, never while a case is timed, and only where the op
builds its inputs the usual way and they are small enough to wait in host memory."""

from __future__ import annotations

import threading
import time

import pytest

from attnbench.backend import get_backend
from attnbench.buffers import bitwise_equal, tensor_fields
from attnbench.case import Case
from attnbench.run import inputs_ahead, runner
from attnbench.run.runner import RunOptions, run_case
from attnbench.run.timing import CPU_CONFIG

A, B = "merge_state/t33-h4-d64-fp32", "decode/b3-l37-mixed-h8x2-d128-p16-bf16"


def _opts(timing=False):
    return RunOptions(timing=timing, timing_config=CPU_CONFIG, determinism_repeats=1)


def _builds(monkeypatch, case: Case, delay: float = 0.0) -> list[str]:
    """Each `build_inputs` of `case`'s op: the thread it ran on."""
    threads: list[str] = []
    cls = type(case.op)
    real = cls.build_inputs

    def build(self, *a, **k):
        threads.append(threading.current_thread().name)
        if delay:
            time.sleep(delay)
        return real(self, *a, **k)

    monkeypatch.setattr(cls, "build_inputs", build)
    return threads


def _same(x, y) -> None:
    fx, fy = tensor_fields(x), tensor_fields(y)
    assert fx.keys() == fy.keys()
    for n in fx:
        assert fx[n].dtype == fy[n].dtype and fx[n].shape == fy[n].shape, n
        assert bool(bitwise_equal(fx[n], fy[n]).all()), n


@pytest.fixture(autouse=True)
def _nothing_left():
    inputs_ahead.schedule([])
    yield
    inputs_ahead.schedule([])


def test_the_next_case_is_built_while_this_one_runs_and_takes_it(monkeypatch):
    a, b = Case.from_id(A), Case.from_id(B)
    plain = run_case(b, [get_backend("torch")], _opts())
    threads = _builds(monkeypatch, b)
    run_case(a, [get_backend("torch")], _opts(), ahead=b)
    assert inputs_ahead.pending() == [inputs_ahead._key(b)]
    rows = run_case(b, [get_backend("torch")], _opts())
    assert threads == ["attnbench-inputs_0"]  # once, on the background thread
    assert [(r.status, r.metrics) for r in rows] == [(r.status, r.metrics) for r in plain]
    assert inputs_ahead.pending() == []


def test_inputs_built_ahead_are_the_bits_make_inputs_gives():
    for cid in (
        A,
        B,
        "gdn_decode/b5-h2x4-d16x16-pad2-packed-bf16",
        "extend/b2-q6-pre10-h4x2-d32-p16-custom-emptyrows-bf16",
    ):
        case = Case.from_id(cid)
        assert inputs_ahead.schedule([case]) == 1
        x, extras = inputs_ahead.take(case)
        _same(x, case.make_inputs())
        assert extras == {}


def test_no_build_runs_while_a_case_is_timed(monkeypatch):
    a, b = Case.from_id(A), Case.from_id(B)
    _builds(monkeypatch, b, delay=0.5)  # outlasts a's checks
    seen = []
    real = runner.time_closures

    def timed(*args, **kw):
        seen.append(inputs_ahead.running())
        return real(*args, **kw)

    monkeypatch.setattr(runner, "time_closures", timed)
    rows = run_case(a, [get_backend("torch")], _opts(timing=True), ahead=b)
    assert seen == [[]] and all(r.timing for r in rows)
    assert rows[0].inputs_s >= 0.3  # the wait counts as building inputs


def test_builds_not_wanted_any_more_are_forgotten():
    a, b = Case.from_id(A), Case.from_id(B)
    inputs_ahead.schedule([a])
    inputs_ahead.schedule([b])
    assert inputs_ahead.pending() == [inputs_ahead._key(b)]
    assert inputs_ahead.take(a) is None and inputs_ahead.take(b) is not None


def test_an_op_that_builds_its_own_way_or_too_large_inputs_are_not_built_ahead(monkeypatch):
    b = Case.from_id(B)
    monkeypatch.setattr(inputs_ahead, "AHEAD_MAX_BYTES", 1000)
    monkeypatch.setattr(inputs_ahead, "AHEAD_HOST_SHARE", 0.0)
    assert inputs_ahead.schedule([b]) == 0
    monkeypatch.undo()
    cls = type(b.op)
    monkeypatch.setattr(cls, "make_inputs", lambda self, *a: None, raising=False)
    assert inputs_ahead.schedule([b]) == 0


def test_a_build_that_fails_ahead_fails_in_its_own_case_as_before(monkeypatch):
    a, b = Case.from_id(A), Case.from_id(B)

    def broken(self, *a, **k):
        raise RuntimeError("no inputs today")

    monkeypatch.setattr(type(b.op), "build_inputs", broken)
    run_case(a, [get_backend("torch")], _opts(), ahead=b)
    (row,) = run_case(b, [get_backend("torch")], _opts())
    assert row.status == "error" and "no inputs today" in row.reason


def test_batch_b_of_the_replay_check_is_built_ahead_with_the_same_outcomes(monkeypatch):
    """The replay check's batch B (a second full draw of a decode's data) is built from the next case's
    CPU inputs on the background thread (`ReplayCheck.build_ahead`): the case draws none itself, and the
    outcomes are those of a B drawn in the check (the mutant that baked its longest length still fails)."""
    from attnbench.check.checklist import CHECKS, ReplayCheck
    from attnbench.check.replay import StandInGraph
    from attnbench.kernels.mutants.replay import BakedLengthDecode, GraphSafeDecode

    checks = tuple(c for c in CHECKS if c.name != "replay") + (ReplayCheck(StandInGraph),)
    opts = RunOptions(timing=False, checks=checks, determinism_repeats=1)
    a, b = Case.from_id(A), Case.from_id(B)
    backends = [GraphSafeDecode(), BakedLengthDecode()]
    plain = run_case(b, backends, opts)
    draws: list[str] = []
    cls = type(b.op)
    real = cls.replay_batch
    monkeypatch.setattr(
        cls, "replay_batch", lambda self, *x: draws.append(threading.current_thread().name) or real(self, *x)
    )
    run_case(a, [get_backend("torch")], opts, ahead=b)
    rows = run_case(b, backends, opts)
    assert draws == ["attnbench-inputs_0"]
    assert [(r.status, r.replay, r.metrics) for r in rows] == [(r.status, r.replay, r.metrics) for r in plain]
    assert [(r.status, r.replay) for r in rows] == [("pass", "pass"), ("fail", "fail")]


def test_the_cap_grows_with_the_hosts_available_memory(monkeypatch):
    """Inputs over the fixed cap are built ahead where a quarter of the host's available memory holds them
    (a 4.3 GB decode cache on a 128 GB GPU host); where MemAvailable cannot be read, the fixed cap holds."""
    b = Case.from_id(B)
    n = b.op.input_bytes(b.params, b.torch_dtype, b.seed)
    monkeypatch.setattr(inputs_ahead, "AHEAD_MAX_BYTES", n - 1)
    monkeypatch.setattr(inputs_ahead, "host_available_bytes", lambda: 4 * n)
    assert inputs_ahead.max_bytes() == 4 * n * inputs_ahead.AHEAD_HOST_SHARE and inputs_ahead._buildable(b)
    monkeypatch.setattr(inputs_ahead, "host_available_bytes", lambda: 2 * n)
    assert not inputs_ahead._buildable(b)  # a quarter of it is under the inputs
    monkeypatch.setattr(inputs_ahead, "host_available_bytes", lambda: None)
    assert inputs_ahead.max_bytes() == n - 1 and not inputs_ahead._buildable(b)
