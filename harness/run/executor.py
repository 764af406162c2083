"""How a sweep runs its jobs: one Executor, chosen once per sweep from the user's `Execution`.

- `InProcess` (`--no-isolate`): cases run in this process, one after another; after a backend
  breaks the CUDA context, every later row is an error naming it. Backends timed together when the
  context was lost keep error rows that say so (only isolated workers can run each alone).
- `Isolated` (default): crash-isolated worker processes, one per device (pool.py).
- `Sanitized` (`--sanitize TOOL`): skips decided here, then each (case, backend) in a fresh worker
  under NVIDIA compute-sanitizer, whose findings fail the row (sanitizer.py); nothing is timed.

Every executor takes jobs `(case, backend names)` and hands each batch of rows to `record(case, rows)`
as soon as it exists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar, Protocol

from attnbench.backend import Backend
from attnbench.case import Case
from attnbench.errors import AttnbenchError
from attnbench.run.pool import Pool, WorkerLaunch
from attnbench.run.runner import ContextLost, RunOptions, error_row, run_case, triage
from attnbench.store.results import Result

Job = tuple[Case, list[str]]
Record = Callable[[Case, list[Result]], None]


@dataclass(frozen=True)
class Execution:
    """What the user asked for: in crash-isolated workers (default), in this process, or sanitized."""

    isolate: bool = True
    devices: tuple[str, ...] = ()  # worker devices; default: the plan's device
    timeout_s: float = 900.0  # per case, in a worker
    plugins: tuple[str, ...] = ()
    resume: bool = False
    sanitize: str | None = None  # a compute-sanitizer tool: one worker per (case, backend) under it, no timing
    sanitizer: str = "compute-sanitizer"  # its executable (sanitizer.locate())

    @property
    def mode(self) -> str:
        """in-process | isolated | sanitizer (the executor `choose` makes)."""
        return Sanitized.name if self.sanitize else Isolated.name if self.isolate else InProcess.name

    def check(self) -> None:
        if self.sanitize and not self.isolate:
            raise AttnbenchError("--sanitize runs kernels in worker processes; it cannot be combined with --no-isolate")


class Executor(Protocol):
    name: ClassVar[str]

    def run(
        self, jobs: list[Job], record: Record, before: Callable[[], None] | None = None, costs: dict | None = None
    ) -> None:
        """Run every job; rows reach `record` as they are produced. `before()` (the sweep's precompile) runs
        first, in this process; worker processes start while it runs. The costs outside the cases (worker
        start-up: `worker_start_s`, `workers_started`; jobs, shutdown), for run.json's wall breakdown, accrue
        in `costs` as they are spent, so a run stopped mid-way keeps them."""


@dataclass(frozen=True)
class InProcess:
    """Cases in this process. A lost CUDA context turns every later row into an error naming it."""

    name: ClassVar[str] = "in-process"
    backends: Mapping[str, Backend]
    opts: RunOptions
    env: Mapping

    def run(
        self, jobs: list[Job], record: Record, before: Callable[[], None] | None = None, costs: dict | None = None
    ) -> None:
        if before:
            before()
        lost = ""
        for i, (case, names) in enumerate(jobs):
            ahead = jobs[i + 1][0] if i + 1 < len(jobs) else None  # its reference is read while this case runs
            if lost:
                record(
                    case, [error_row(case, n, f"not run: the CUDA context was lost earlier ({lost})") for n in names]
                )
                continue
            try:
                record(case, run_case(case, [self.backends[n] for n in names], self.opts, dict(self.env), ahead=ahead))
            except ContextLost as e:
                lost = e.reason
                got = {r.backend for r in e.rows}
                missing = [
                    error_row(case, n, f"not run: CUDA context lost ({e.reason})") for n in names if n not in got
                ]
                record(case, _unattributed(e) + missing)


ALONE_HINT = "; rerun with isolation (no --no-isolate) to run it alone and attribute it"


def _unattributed(e: ContextLost) -> list[Result]:
    """`e`'s rows, those of the backends it could not attribute (`e.alone`) saying how to get their own
    verdicts: in this process no fresh context can run them alone."""
    for r in e.rows:
        if r.backend in e.alone:
            r.reason += ALONE_HINT
    return e.rows


@dataclass(frozen=True)
class Isolated:
    """Crash-isolated worker processes over `devices` (see pool.py); `launch` says how they start."""

    name: ClassVar[str] = "isolated"
    devices: tuple[str, ...]
    opts: RunOptions
    plugins: tuple[str, ...] = ()
    timeout_s: float = 900.0
    log_dir: Path | None = None
    on_problem: Callable[[str], None] | None = None
    launch: WorkerLaunch = WorkerLaunch()
    warm: tuple[str, ...] = ()  # the sweep's backends: each worker imports their libraries before Ready

    def run(
        self, jobs: list[Job], record: Record, before: Callable[[], None] | None = None, costs: dict | None = None
    ) -> None:
        pool = Pool(list(self.devices), self.opts, record, plugins=list(self.plugins), timeout_s=self.timeout_s,
                    log_dir=self.log_dir, on_problem=self.on_problem, launch=self.launch, warm=list(self.warm),
                    costs=costs)  # fmt: skip
        pool.run(jobs, before)


@dataclass(frozen=True)
class Sanitized:
    """Skips decided here; every (case, backend) that runs gets a fresh worker under the sanitizer."""

    name: ClassVar[str] = "sanitizer"
    backends: Mapping[str, Backend]
    env: Mapping
    workers: Isolated  # launched under the sanitizer, one job per worker

    def run(
        self, jobs: list[Job], record: Record, before: Callable[[], None] | None = None, costs: dict | None = None
    ) -> None:
        if before:  # one worker per job, each started under the sanitizer when its job comes: nothing to overlap
            before()
        single: list[Job] = []
        for case, names in jobs:
            rows, todo = triage(case, [self.backends[n] for n in names], dict(self.env))
            if rows:
                record(case, list(rows.values()))
            single += [(case, [b.name]) for b in todo]
        self.workers.run(single, record, costs=costs)


def choose(
    how: Execution,
    device: str,
    backends: list[Backend],
    opts: RunOptions,
    env: Mapping,
    log_dir: Path,
    on_problem: Callable[[str], None] | None = None,
) -> Executor:
    """The one executor of a sweep (how.check() has passed; for sanitize, `opts` has timing off)."""
    by_name = {b.name: b for b in backends}
    if how.mode == InProcess.name:
        return InProcess(by_name, opts, env)
    workers = Isolated(how.devices or (device,), opts, how.plugins, how.timeout_s, log_dir, on_problem,
                       warm=tuple(by_name))  # fmt: skip
    if how.mode == Isolated.name:
        return workers
    from attnbench.run import sanitizer

    launch = sanitizer.launch(how.sanitize, how.sanitizer)
    return Sanitized(by_name, env, replace(workers, launch=launch, warm=()))  # a worker per job: its own backend
