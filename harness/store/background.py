"""Keyed work on one background thread: what the runner starts ahead of the case that needs it.

Two things are prepared ahead of their case on the host, each on a thread of its own: the next case's
CPU inputs (run/inputs_ahead.py) and the reference-cache entries a case will read (store/refcache.py,
Reading ahead). Both want the same bookkeeping, kept here once: a job per key (a case, an entry path),
started once, run one after another on one thread that this object starts on its first job; jobs whose
key is no longer wanted are forgotten (`keep_only`: cancelled, or, where one already runs, left to
finish unused); `take` hands a job's result to the one caller that needs it and holds it no longer;
`wait` returns once nothing runs, so the runner can time a case with the host idle, forgotten jobs
still running included. A job may say how many bytes its result holds (`nbytes`): `start` refuses a job
that would take the bytes held past a cap, so results waiting for their case stay bounded in host memory.

A job must make no CUDA call (a CUDA-graph capture on the main thread would see it). Call every method
from one thread (the runner's); only the jobs run on the background one.

This module sits in store/ (the lowest stage both store/refcache.py and run/inputs_ahead.py may import,
docs/architecture.md); it imports nothing of attnbench.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import wait as _wait_all
from typing import Any


class BackgroundWork:
    """Jobs keyed by a hashable key, run in the order started on one thread named `<thread_name>_0`."""

    def __init__(self, thread_name: str):
        self.thread_name = thread_name
        self._held: dict[Hashable, tuple[int, Future]] = {}  # key -> (bytes its result holds, the job)
        self._forgotten: list[Future] = []  # jobs dropped by `keep_only` that were running: `wait` waits for them
        self._pool: ThreadPoolExecutor | None = None

    def start(self, key: Hashable, fn: Callable[[], Any], nbytes: int = 0, max_bytes: int | None = None) -> bool:
        """Start `fn()` for `key` on the background thread, after the jobs started before it. False (nothing
        started) when a job of `key` is already held, or when `max_bytes` is given and the bytes held
        (`held_bytes()`) plus this job's `nbytes` would exceed it."""
        if key in self._held:
            return False
        if max_bytes is not None and self.held_bytes() + nbytes > max_bytes:
            return False
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.thread_name)
        self._held[key] = (nbytes, self._pool.submit(fn))
        return True

    def keep_only(self, keys) -> None:
        """Forget every job whose key is not in `keys`: one not begun never runs, one running finishes
        unused (`wait` still waits for it); their results are no longer held."""
        keep = set(keys)
        self._forgotten = [f for f in self._forgotten if not f.done()]
        for key in [k for k in self._held if k not in keep]:
            fut = self._held.pop(key)[1]
            if not fut.cancel() and not fut.done():
                self._forgotten.append(fut)

    def take(self, key: Hashable) -> Any:
        """The result of `key`'s job, waited for and no longer held; None when no job of `key` is held or
        it was cancelled before it ran. An error of the job is raised here (once: the job is gone)."""
        got = self._held.pop(key, None)
        if got is None:
            return None
        try:
            return got[1].result()
        except CancelledError:
            return None

    def wait(self) -> float:
        """Wait until no job runs, forgotten ones included (the results stay held for `take`); returns
        the seconds waited."""
        t0 = time.perf_counter()
        jobs = [fut for _, fut in self._held.values()] + self._forgotten
        if jobs:
            _wait_all(jobs)
        self._forgotten = []
        return time.perf_counter() - t0

    def keys(self) -> list:
        """The keys of the jobs held (started, not taken or forgotten), in the order started."""
        return list(self._held)

    def running(self) -> list:
        """The keys of the held jobs not finished yet (queued or running)."""
        return [k for k, (_, fut) in self._held.items() if not fut.done()]

    def held_bytes(self) -> int:
        """The bytes the held jobs said their results hold (`start`'s `nbytes`), taken ones not counted."""
        return sum(n for n, _ in self._held.values())
