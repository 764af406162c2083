"""What a sweep's supervisor (pool.py) and its worker processes (worker.py) say to each other.

Small frozen records, pickled over the worker's socket. Supervisor -> worker: `RunJob`, `Stop`.
Worker -> supervisor: `Ready` once its backends are loaded, `Stage` before each stage of a job (so a
crash or timeout is charged to the backend that was running), `Rows` when a job (or, before `Lost`,
part of it) is done, `Lost` when a backend broke the CUDA context and the worker is about to exit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnbench.case import Case
    from attnbench.run.runner import RunOptions
    from attnbench.store.results import Result


@dataclass(frozen=True)
class RunJob:
    """Run `case` on the named backends (in this order) with `opts`. `ahead`: the case the supervisor
    will likely send next, whose reference-cache entries the worker reads while this one runs."""

    case: Case
    backends: tuple[str, ...]
    opts: RunOptions
    ahead: Case | None = None


@dataclass(frozen=True)
class Stop:
    """Finish: the worker closes its socket and exits."""


@dataclass(frozen=True)
class Ready:
    """Backends loaded; `problems` are the plugin load problems to show the user once."""

    pid: int
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Stage:
    """About to run `name`: a backend (its checks, or its timing alone after the shared timing failed),
    "reference" (inputs and references) or "timing" (all backends of the job together)."""

    name: str


@dataclass(frozen=True)
class Rows:
    """Rows of the current job (all of them, or before `Lost` those finished)."""

    rows: tuple[Result, ...]


@dataclass(frozen=True)
class Lost:
    """The CUDA context is unusable (`reason`); the worker exits after this. `alone`: the job's backends
    with no row in the `Rows` before (runner.ContextLost.alone: timed together when the context was lost,
    or not timed), for the supervisor to run each in a job of its own."""

    reason: str
    alone: tuple[str, ...] = ()
