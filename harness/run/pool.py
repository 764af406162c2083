"""Crash-isolated execution: one worker process per device, supervised.

Cases are handed out one at a time to whichever worker is free. A worker that dies (segfault, exit,
a broken CUDA context) or overruns the per-case timeout costs only the backend it was running: that
backend gets an `error` row naming the crash, a fresh worker starts, and the case continues with the
backends that have no row yet. A crash, a timeout or a lost CUDA context while several backends are
timed together blames none of them: each of those goes back to the queue in a job of its own, where
it is checked and timed alone and a failure is its own (a job of one backend is never split again).
Worker output (kernel prints, sanitizer reports) goes to one log per worker in `log_dir`, capped
(worker_log.py: its first and last 4 MiB, with the bytes cut counted). A worker runs in its own
session: when it ends, or is killed, the processes it started end too.

Several workers may share one GPU (`--gpus 0,0,0,0`, for correctness passes). Memory is then shared
too: a row that ran out of memory on a shared GPU is not the backend's fault, so it is not recorded;
its (case, backend) runs again at the end, when one worker per GPU is left, and that row counts.

How workers start is one `WorkerLaunch`: plain by default; in sanitize mode under a wrapper command,
with a fresh worker per job, stopped once its rows are in, so the worker's whole log belongs to that
job, and `review(rows, log)` then amends the rows. Messages are the records of messages.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path

from attnbench.case import Case
from attnbench.errors import OUT_OF_MEMORY, AttnbenchError
from attnbench.run.messages import Lost, Ready, Rows, RunJob, Stage, Stop
from attnbench.run.runner import RunOptions, error_row
from attnbench.run.worker_log import CappedLog
from attnbench.store.results import Result

MAX_START_FAILURES = 3
STARTUP_TIMEOUT_S = 180


@dataclass(frozen=True)
class WorkerLaunch:
    """How a pool starts its workers and what happens to a job's rows."""

    wrapper: tuple[str, ...] = ()  # put in front of `python -m attnbench.run.worker` (e.g. compute-sanitizer)
    env: tuple[tuple[str, str], ...] = ()  # extra environment variables of the workers
    fresh_per_job: bool = False  # one worker per job, stopped once its rows are in: its whole log is the job's
    review: Callable[[list[Result], Path], list[Result]] | None = None  # (rows, the worker's log) -> rows


@dataclass
class _Job:
    case: Case
    backends: list[str]


@dataclass
class _Worker:
    device: str
    proc: subprocess.Popen
    conn: Connection
    log: Path
    capped: CappedLog
    ready: bool = False
    job: _Job | None = None
    stage: str = ""
    started: float = 0.0
    counted_from: float = 0.0  # start-up is counted from here (after the supervisor's own work it overlapped)
    done: list[str] = field(default_factory=list)  # backends of the current job with rows


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _where(stage: str) -> str:
    """Where in a job a worker was when it crashed or overran, for the rows' reasons: before the case's
    first stage and while building its inputs and references no backend code runs, so the error rows
    every backend of the case then gets say so."""
    if not stage:
        return " before the case's first stage (no backend code had run)"
    if stage == "reference":
        return " while building the case's inputs and references (no backend code runs there)"
    if stage == "timing":
        return " while timing"
    return f" while running {stage}"


def _names(names) -> str:
    """`a, b and c`: the backends a problem line names."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


class Pool:
    """Workers over `devices`; `run()` feeds them cases and reports rows through `on_rows`."""

    def __init__(
        self,
        devices: list[str],
        opts: RunOptions,
        on_rows: Callable[[Case, list[Result]], None],
        plugins: list[str] | None = None,
        timeout_s: float = 900.0,
        log_dir: Path | None = None,
        on_problem: Callable[[str], None] | None = None,
        launch: WorkerLaunch = WorkerLaunch(),
        warm: list[str] | None = None,
        costs: dict[str, float] | None = None,
    ):
        self.devices, self.opts, self.on_rows = devices, opts, on_rows
        self.warm = list(warm or [])  # backends whose available() each worker asks before Ready (worker.py)
        self.plugins, self.timeout_s = plugins or [], timeout_s
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="attnbench-logs-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.launch = launch
        self.on_problem = on_problem or (lambda msg: None)
        self._count = 0
        self._problems_seen: set[str] = set()
        self._shared = len(set(devices)) < len(devices)  # some GPU has several workers
        self._alone: list[_Job] = []  # out of memory beside other workers: run again alone at the end
        # worker_start_s: seconds from each worker's start to its Ready (importing torch, loading backends, their
        # libraries), summed, less what ran while this process did its own work before the jobs (`run(before=)`:
        # the precompile), which is worker_start_hidden_s and no part of the wall breakdown; jobs_s: from handing a case to a worker to its last rows (the case plus messaging); worker_stop_s:
        # waiting for workers to exit at the end; unfinished_s: cases a worker was running when the run stopped
        # (Ctrl-C, a time limit), which produced no rows. Accrued into `costs` when given (the sweep's own
        # dict), so a run that is interrupted still accounts for them.
        self.costs: dict[str, float] = costs if costs is not None else {}
        for k in ("worker_start_s", "worker_start_hidden_s", "workers_started", "jobs_s", "worker_stop_s"):
            self.costs.setdefault(k, 0.0)

    # ---- worker lifecycle ------------------------------------------------------------------------
    def _start(self, device: str) -> _Worker:
        parent, child = socket.socketpair()
        self._count += 1
        tag = device.replace(":", "")
        log = self.log_dir / f"worker-{tag}-{self._count}.log"
        read_end, out = os.pipe()  # drained into the log with a cap (worker_log.py)
        args = [*self.launch.wrapper, sys.executable, "-m", "attnbench.run.worker", str(child.fileno()), device]
        for p in self.plugins:
            args += ["--plugin", p]
        for b in self.warm:
            args += ["--warm", b]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **dict(self.launch.env))
        proc = subprocess.Popen(
            args, pass_fds=[child.fileno()], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )  # fmt: skip  (its own session: a kill, or its end, takes the processes it started too)
        child.close()
        os.close(out)
        conn = Connection(os.dup(parent.fileno()))
        parent.close()
        now = time.monotonic()
        return _Worker(device, proc, conn, log, CappedLog(read_end, log), started=now, counted_from=now)

    def _kill(self, w: _Worker) -> None:
        try:
            os.killpg(w.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            w.proc.kill()
        w.proc.wait()

    def _ended(self, w: _Worker) -> None:
        """After a worker exits: what it started ends with it (its process group), and its log is complete."""
        try:
            os.killpg(w.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # nothing of the group is left
        w.capped.close()

    def _stop(self, w: _Worker, kill: bool = False) -> None:
        try:
            if kill:
                self._kill(w)
            else:
                w.conn.send(Stop())
        except (OSError, BrokenPipeError):
            pass
        try:
            w.proc.wait(timeout=30 if self.launch.wrapper else 10)  # a sanitizer writes its summary on the way out
        except subprocess.TimeoutExpired:
            self._kill(w)
        self._ended(w)
        w.conn.close()

    def _emit(self, w: _Worker, case: Case, rows: list[Result]) -> None:
        if self.launch.review:
            rows = self.launch.review(rows, w.log)
        self.on_rows(case, rows)

    # ---- the loop -------------------------------------------------------------------------------------
    def run(self, jobs: list[tuple[Case, list[str]]], before: Callable[[], None] | None = None) -> dict[str, float]:
        """Run each (case, backend names); rows arrive through `on_rows` as each case finishes. Returns
        `costs`: the workers' start-up seconds (summed over workers) and how many started.

        `before()`, when given, is the supervisor's own work before the first job (the sweep's precompile):
        it runs while the workers start, and the start-up it hides is not counted in `worker_start_s`."""
        queue = deque(_Job(c, list(names)) for c, names in jobs if names)
        started = [self._start(d) for d in self.devices] if queue and before else []
        if before:
            try:
                before()
            except BaseException:
                for w in started:
                    self._stop(w, kill=True)
                raise
            done = time.monotonic()
            for w in started:
                w.counted_from = done
        self._drain(queue, self.devices, started)
        if self._alone:  # out of memory beside other workers: once more, one worker per GPU
            retry, self._alone, self._shared = self._alone, [], False
            self.on_problem(f"{len(retry)} case(s) ran out of memory on a shared GPU: running them again alone")
            self._drain(deque(retry), list(dict.fromkeys(self.devices)))
        return dict(self.costs)

    def _drain(self, queue: deque[_Job], devices: list[str], started: list[_Worker] | None = None) -> None:
        workers = started or [self._start(d) for d in devices]
        start_failures = 0
        try:
            while queue or any(w.job for w in workers):
                if queue and not workers:  # every worker retired, then a crash put work back
                    workers = [self._start(d) for d in devices]
                for w in workers:
                    if w.ready and w.job is None and queue:
                        self._dispatch(w, queue, queue.popleft(), queue[0].case if queue else None)
                ready = wait([w.conn for w in workers], timeout=1.0)
                for i, w in enumerate(workers):
                    replace = False
                    if w.conn in ready:
                        replace = self._receive(w, queue)
                    elif w.job and time.monotonic() - w.started > self.timeout_s:
                        replace = self._timeout(w, queue)
                    elif not w.ready and time.monotonic() - w.counted_from > STARTUP_TIMEOUT_S:
                        self._stop(w, kill=True)
                        self.on_problem(f"worker on {w.device} did not start in {STARTUP_TIMEOUT_S} s; log: {w.log}")
                        replace = True
                    if replace:
                        start_failures = 0 if w.ready else start_failures + 1
                        if start_failures >= MAX_START_FAILURES:
                            raise AttnbenchError(f"workers on {w.device} keep failing to start; see {w.log}")
                        workers[i] = self._start(w.device) if queue or not self.launch.fresh_per_job else None
                workers = [w for w in workers if w is not None]
        finally:
            t0 = time.monotonic()
            for w in workers:  # stopped mid-way: a job whose rows all came (their recording raised), or one cut off
                if w.job:
                    key = "jobs_s" if set(w.done) >= set(w.job.backends) else "unfinished_s"
                    self.costs[key] = self.costs.get(key, 0.0) + t0 - w.started
            for w in workers:
                self._stop(w, kill=bool(w.job))
            self.costs["worker_stop_s"] += time.monotonic() - t0

    def _dispatch(self, w: _Worker, queue: deque[_Job], job: _Job, ahead: Case | None = None) -> None:
        """Hand `job` to `w`, naming `ahead`, the case at the head of the queue (the next one dispatched,
        to this worker or another), whose reference the worker reads ahead (runner.run_case); none for a
        worker that ends after its job (`fresh_per_job`). A worker already gone (all rows of its job sent,
        then its `Lost`, still unread, and exit) does not take it: `job` goes back to the queue's front."""
        w.job, w.stage, w.started, w.done = job, "", time.monotonic(), []
        ahead = None if self.launch.fresh_per_job else ahead
        try:
            w.conn.send(RunJob(job.case, tuple(job.backends), self.opts, ahead))
        except OSError:  # its Lost, or end of file, is read next and replaces it
            w.job = None
            queue.appendleft(job)

    def _receive(self, w: _Worker, queue: deque[_Job]) -> bool:
        """Handle one message; True when the worker is gone and must be replaced."""
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            return self._crashed(w, queue)
        if isinstance(msg, Ready):
            w.ready = True
            now = time.monotonic()
            self.costs["worker_start_s"] += max(0.0, now - w.counted_from)
            self.costs["worker_start_hidden_s"] += min(now, w.counted_from) - w.started
            self.costs["workers_started"] += 1
            for p in msg.problems:
                if p not in self._problems_seen:
                    self._problems_seen.add(p)
                    self.on_problem(p)
        elif isinstance(msg, Stage):
            w.stage = msg.name
        elif isinstance(msg, Rows):
            rows: list[Result] = list(msg.rows)
            if self.launch.fresh_per_job:  # the log is complete once the worker is gone
                case = w.job.case
                w.done += [r.backend for r in rows]
                self._stop(w)
                self._requeue_rest(w, queue)
                self._emit(w, case, rows)
                return True
            if rows:
                w.done += [r.backend for r in rows]
                if self._shared:
                    oom = [r.backend for r in rows if r.status == "error" and OUT_OF_MEMORY in r.reason]
                    if oom:
                        self._alone.append(_Job(w.job.case, oom))
                        rows = [r for r in rows if r.backend not in oom]
                if rows:
                    self._emit(w, w.job.case, rows)
            if w.job and set(w.done) >= set(w.job.backends):
                w.job = None
                self.costs["jobs_s"] += time.monotonic() - w.started
        elif isinstance(msg, Lost):
            alone = f"; running {_names(msg.alone)} of {w.job.case.id} each alone" if msg.alone and w.job else ""
            self.on_problem(f"{w.device}: CUDA context lost ({msg.reason}); restarting the worker{alone}")
            self._requeue_rest(w, queue, alone=bool(msg.alone))
            self._stop(w, kill=True)
            return True
        return False

    def _requeue_rest(self, w: _Worker, queue: deque[_Job], alone: bool = False) -> None:
        """The backends of `w`'s job with no row back at the queue's front: in one job, or with `alone` in
        a job each."""
        if w.job:
            rest = [b for b in w.job.backends if b not in w.done]
            jobs = [_Job(w.job.case, [b]) for b in rest] if alone else [_Job(w.job.case, rest)] if rest else []
            queue.extendleft(reversed(jobs))
        w.job = None

    def _fail_current(self, w: _Worker, why: str, queue: deque[_Job]) -> None:
        """After the worker crashed or timed out: error rows for the backend(s) it was on, and the rest of the
        case back to the queue. In the timing of several backends together none of them is to blame: no
        rows, and each goes back in a job of its own (one backend: the stage "timing" is then its own)."""
        job = w.job
        rest = [b for b in job.backends if b not in w.done]
        if w.stage == "timing" and len(rest) > 1:
            self.on_problem(f"{job.case.id}: timing {_names(rest)} together: {why}; running each alone")
            self._requeue_rest(w, queue, alone=True)
            return
        culprits = [w.stage] if w.stage in rest else rest  # set-up, reference, timing one backend: every one left
        self._emit(w, job.case, [error_row(job.case, b, why) for b in culprits])
        w.done += culprits
        self._requeue_rest(w, queue)

    def _crashed(self, w: _Worker, queue: deque[_Job]) -> bool:
        code = w.proc.wait()
        self._ended(w)
        if w.job:
            self._fail_current(w, f"worker crashed ({_exit_text(code)}){_where(w.stage)}; log: {w.log.name}", queue)
        elif not w.ready:
            self.on_problem(f"worker on {w.device} failed to start ({_exit_text(code)}); log: {w.log}")
        w.conn.close()
        return True

    def _timeout(self, w: _Worker, queue: deque[_Job]) -> bool:
        self._kill(w)
        self._ended(w)
        self._fail_current(w, f"timed out after {self.timeout_s:g} s{_where(w.stage)}", queue)
        w.conn.close()
        return True
