"""The keyed background work behind the inputs built ahead and the reference-cache reads ahead
(harness/store/background.py): one thread, jobs in the order started, a result taken once, a job's
error raised to its taker, forgotten jobs never run (or, running, are still waited for), and the cap on
the bytes held."""

from __future__ import annotations

import threading
import time

import pytest

from attnbench.store.background import BackgroundWork


class _Gate:
    """A job that blocks until `open()`, so a test decides what is still running."""

    def __init__(self):
        self.event = threading.Event()
        self.ran = False

    def __call__(self):
        assert self.event.wait(10), "gate never opened"
        self.ran = True
        return "gate"

    def open(self):
        self.event.set()


def test_jobs_run_in_order_on_one_named_thread_and_a_result_is_taken_once():
    work = BackgroundWork("attnbench-test")
    order: list[tuple[str, str]] = []

    def job(name):
        return lambda: order.append((name, threading.current_thread().name)) or name

    assert work.start("a", job("a")) and work.start("b", job("b"))
    assert work.keys() == ["a", "b"]
    assert work.take("b") == "b" and work.take("a") == "a"
    assert order == [("a", "attnbench-test_0"), ("b", "attnbench-test_0")]
    assert work.take("a") is None and work.keys() == []  # no longer held
    assert work.take("never started") is None


def test_a_jobs_error_is_raised_to_its_taker_once():
    work = BackgroundWork("attnbench-test")
    boom = ValueError("truncated")

    def fails():
        raise boom

    work.start("x", fails)
    with pytest.raises(ValueError) as got:
        work.take("x")
    assert got.value is boom
    assert work.take("x") is None and work.keys() == []


def test_a_key_already_held_is_not_started_again():
    work = BackgroundWork("attnbench-test")
    calls = []
    assert work.start("k", lambda: calls.append(1) or 1)
    assert not work.start("k", lambda: calls.append(2) or 2)
    assert work.take("k") == 1
    work.wait()
    assert calls == [1]


def test_keep_only_forgets_the_others_and_a_forgotten_job_not_begun_never_runs():
    work = BackgroundWork("attnbench-test")
    gate, ran = _Gate(), []
    work.start("gate", gate)
    work.start("b", lambda: ran.append("b"))
    work.start("c", lambda: ran.append("c") or "c")
    work.keep_only(["gate", "c", "not started"])
    assert work.keys() == ["gate", "c"]
    assert work.take("b") is None
    gate.open()
    work.wait()
    assert ran == ["c"] and work.take("c") == "c" and work.take("gate") == "gate"


def test_a_queued_job_taken_after_being_cancelled_gives_none():
    work = BackgroundWork("attnbench-test")
    gate = _Gate()
    work.start("gate", gate)
    work.start("b", lambda: "b")
    fut = work._held["b"][1]
    assert fut.cancel()  # as if forgotten between start and take
    assert work.take("b") is None
    gate.open()
    assert work.take("gate") == "gate"


def test_wait_returns_once_nothing_runs_and_keeps_the_results():
    work = BackgroundWork("attnbench-test")
    work.start("slow", lambda: time.sleep(0.3) or "slow")
    assert work.running() == ["slow"]
    waited = work.wait()
    assert waited >= 0.2 and work.running() == []
    assert work.keys() == ["slow"] and work.take("slow") == "slow"
    assert work.wait() < 0.1  # nothing held: nothing to wait for


def test_wait_also_waits_for_a_forgotten_job_that_was_running():
    """A job forgotten while it runs cannot be cancelled: it finishes unused, and the runner's wait before
    a case's timing must still see it, or it would run beside the timed window."""
    work = BackgroundWork("attnbench-test")
    started, done = threading.Event(), threading.Event()

    def job():
        started.set()
        time.sleep(0.3)
        done.set()

    work.start("old", job)
    assert started.wait(10)
    work.keep_only([])
    assert work.keys() == [] and work.running() == []
    work.wait()
    assert done.is_set()


def test_the_bytes_held_and_their_cap():
    work = BackgroundWork("attnbench-test")
    gate = _Gate()
    assert work.start("a", gate, nbytes=60, max_bytes=100)
    assert not work.start("b", lambda: "b", nbytes=50, max_bytes=100)  # 110 > 100: refused
    assert work.keys() == ["a"] and work.held_bytes() == 60
    assert work.start("c", lambda: "c", nbytes=40, max_bytes=100)  # exactly the cap
    assert work.held_bytes() == 100
    work.keep_only(["c"])  # a forgotten job's result is no longer held
    assert work.held_bytes() == 40
    gate.open()
    assert work.take("c") == "c" and work.held_bytes() == 0
    assert work.start("b", lambda: "b", nbytes=50, max_bytes=100) and work.take("b") == "b"
    assert work.start("big", lambda: "big", nbytes=10**12)  # no cap given: no limit
    assert work.take("big") == "big"
