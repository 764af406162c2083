"""Reading the reference cache ahead: a case's entry is read on a background thread while the case before
it runs (or while its own inputs are built), `get` takes those bytes with the same checks, nothing is
read twice, nothing is read during a timing, and the supervisor names the next case to its worker."""

from __future__ import annotations

import threading
import time
from collections import deque

import torch

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.run import runner
from attnbench.run.messages import RunJob
from attnbench.run.pool import Pool, _Job
from attnbench.run.runner import RunOptions, run_case
from attnbench.run.timing import CPU_CONFIG
from attnbench.store import refcache

A, B = "merge_state/t33-h4-d64-fp32", "merge_state/t34-h4-d64-fp32"


def _run(case, root, ahead=None, timing=False):
    opts = RunOptions(timing=timing, timing_config=CPU_CONFIG, ref_cache=str(root))
    return run_case(case, [get_backend("torch")], opts, ahead=ahead)


def _path(root, case, variant=""):
    return str(refcache.RefCache(root).path(refcache.key_of(refcache.key_material(case, variant))))


class _Loads:
    """Counts `refcache._load` by entry path and by thread (the main thread or the read-ahead one)."""

    def __init__(self, monkeypatch, delay: float = 0.0):
        self.calls: list[tuple[str, str]] = []
        real = refcache._load

        def load(path):
            self.calls.append((str(path), threading.current_thread().name))
            if delay:
                time.sleep(delay)
            return real(path)

        monkeypatch.setattr(refcache, "_load", load)

    def on_main(self):
        return [p for p, t in self.calls if t == threading.main_thread().name]


def _flip_last_bit(path) -> None:
    """Corrupt the entry at `path`: its digest no longer matches."""
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[:-1] + bytes([raw[-1] ^ 1]))


def _warm(root):
    a, b = Case.from_id(A), Case.from_id(B)
    for c in (a, b):
        assert {r.reference_from for r in _run(c, root)} == {"computed"}
    return a, b


def test_the_next_case_is_read_while_this_one_runs_and_get_takes_it(tmp_path, monkeypatch):
    root = tmp_path / "refs"
    a, b = _warm(root)
    loads = _Loads(monkeypatch)
    rows_a = _run(a, root, ahead=b)
    assert _path(root, b) in refcache.reads_ahead()  # held for b's run
    rows_b = _run(b, root)
    assert {r.reference_from for r in rows_a + rows_b} == {"cache"}
    assert {r.status for r in rows_a + rows_b} == {"pass"}
    # each entry read once (the cases' own, their stale check's), on the background thread: no `get` read
    # a file itself
    paths = [p for p, _ in loads.calls]
    assert len(paths) == len(set(paths)) and {_path(root, a), _path(root, b)} <= set(paths)
    assert loads.on_main() == []
    assert refcache.reads_ahead() == []


def test_read_ahead_gives_the_bits_a_plain_get_gives(tmp_path):
    a, b = _warm(tmp_path / "refs")
    cache = refcache.RefCache(tmp_path / "refs")
    plain, _ = cache.get(b)
    assert cache.read_ahead([(b, "")]) == 1
    got, problem = cache.get(b)
    assert problem == "" and refcache.reads_ahead() == []
    for want, have in zip(plain, got):
        assert want.keys() == have.keys() and all(torch.equal(want[k], have[k]) for k in want)


def test_a_corrupt_entry_read_ahead_is_recomputed_as_ever(tmp_path):
    root = tmp_path / "refs"
    a, b = _warm(root)
    path = _path(root, b)
    _flip_last_bit(path)
    _run(a, root, ahead=b)
    rows = _run(b, root)
    assert {r.reference_from for r in rows} == {"computed"} and "is corrupt" in rows[0].reference_note
    assert {r.status for r in rows} == {"pass"}


def test_the_error_of_a_read_ahead_reaches_get_without_a_second_read(tmp_path, monkeypatch):
    """`get` meets a corrupt entry's error as the background read raised it: it does not read the file
    again on the main thread."""
    root = tmp_path / "refs"
    a, b = _warm(root)
    path = _path(root, b)
    _flip_last_bit(path)
    loads = _Loads(monkeypatch)
    cache = refcache.RefCache(root)
    assert cache.read_ahead([(b, "")]) == 1
    got, problem = cache.get(b)
    assert got is None and "is corrupt" in problem and "digest" in problem
    assert [p for p, _ in loads.calls] == [path] and loads.on_main() == []


def test_reads_not_wanted_any_more_are_forgotten_and_misses_start_none(tmp_path):
    root = tmp_path / "refs"
    a, b = _warm(root)
    cache = refcache.RefCache(root)
    other = Case.from_id("merge_state/t35-h4-d64-fp32")  # never computed: nothing on disk
    assert cache.read_ahead([(a, ""), (other, "")]) == 1
    assert cache.read_ahead([(b, "")]) == 1
    assert refcache.reads_ahead() == [_path(root, b)]
    assert cache.read_ahead([(b, "")]) == 0  # already under way
    cache.read_ahead([])
    assert refcache.reads_ahead() == []


def test_the_cap_on_bytes_held_ahead(tmp_path, monkeypatch):
    root = tmp_path / "refs"
    a, b = _warm(root)
    monkeypatch.setattr(refcache, "AHEAD_MAX_BYTES", 100)  # smaller than any entry
    assert refcache.RefCache(root).read_ahead([(a, ""), (b, "")]) == 0
    assert {r.reference_from for r in _run(b, root)} == {"cache"}  # read when asked for, as before


def test_no_read_runs_while_a_case_is_timed(tmp_path, monkeypatch):
    root = tmp_path / "refs"
    a, b = _warm(root)
    _Loads(monkeypatch, delay=0.5)  # a slow disk: the read of b outlasts a's checks
    seen = []
    real = runner.time_closures

    def timed(*args, **kw):
        seen.append(refcache.reads_running())
        return real(*args, **kw)

    monkeypatch.setattr(runner, "time_closures", timed)
    rows = _run(a, root, ahead=b, timing=True)
    assert seen == [[]]  # b's read was waited for before the timing began
    assert all(r.timing for r in rows)
    assert rows[0].reference_s >= 0.3  # the wait counts as reading references


def test_the_supervisor_names_the_next_case_to_the_worker():
    sent = []

    class Conn:
        def send(self, msg):
            sent.append(msg)

    class W:
        conn = Conn()

    pool = Pool.__new__(Pool)
    pool.opts = RunOptions(timing=False)
    pool.launch = type("L", (), {"fresh_per_job": False})()
    a, b = Case.from_id(A), Case.from_id(B)
    pool._dispatch(W(), deque(), _Job(a, ["torch"]), b)
    pool._dispatch(W(), deque(), _Job(b, ["torch"]))
    assert [(m.case.id, m.ahead.id if m.ahead else None) for m in sent] == [(A, B), (B, None)]
    assert isinstance(sent[0], RunJob)


def test_the_entries_checks_name_are_read_ahead_too(tmp_path, monkeypatch):
    """The replay check's batch B and the stale check's perturbed references (`reference_variants`) of a
    decode: a warm run loads every one of them on the background thread, none on the main one."""
    from attnbench.backend import implements
    from attnbench.check.checklist import CHECKS, ReplayCheck
    from attnbench.check.checks import stale_variant
    from attnbench.check.replay import REPLAY_VARIANT, StandInGraph
    from attnbench.kernels.mutants.replay import GraphSafeDecode
    from helpers import Nudges

    checks = tuple(c for c in CHECKS if c.name != "replay") + (ReplayCheck(StandInGraph),)
    case = Case.from_id("decode/b3-l37-mixed-h8x2-d128-p16-bf16", "cpu")
    opts = RunOptions(timing=False, checks=checks, determinism_repeats=1, ref_cache=str(tmp_path))

    class Nudged(GraphSafeDecode):  # unlike a fresh closure: the stale check needs every perturbed reference
        name = "nudged"
        nudges = Nudges()

        @implements("decode", graph_safe=True)
        def prepare_decode(self, case, x):
            return Nudged.nudges.wrap(super().prepare_decode(case, x))

    first = run_case(case, [Nudged()], opts)
    loads = _Loads(monkeypatch)
    Nudged.nudges.reset()
    second = run_case(case, [Nudged()], opts)
    assert [(r.status, r.replay, r.metrics) for r in first] == [(r.status, r.replay, r.metrics) for r in second]
    assert [(r.status, r.replay) for r in second] == [("pass", "pass")]
    perts = [p.name for p in case.op.perturbations(case.params)]
    variants = {_path(tmp_path, case, v): v for v in ["", REPLAY_VARIANT, *(stale_variant((n,)) for n in perts)]}
    assert sorted(variants.get(p, p) for p, _ in loads.calls) == sorted(variants.values())  # each once
    assert loads.on_main() == []
