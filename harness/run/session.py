"""One session: what `attnbench sweep`, `pytest --attnbench` and `attnbench selftest` all build and run.

A session is the backends loaded (built-in, installed entry points, `--plugin` modules), the plan
(suites, cases, backends, expectations: attnbench.run.sweep.plan) and the verdicts: a case's rows with
the expectations applied (a known failure is `xfail`, an expected failure that passed `xpass`).
Whichever entry point runs a suite, the same backends, expectations and verdicts come out.

    s = Session.open(Selection(suites=("smoke",), device="cpu", backends=("torch",)), plugins=["my_backend.py"])
    rows = s.run_case(s.plan.cases[0], RunOptions(timing=False))   # verdicts applied
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from attnbench import backend as backend_mod
from attnbench.backend import Backend
from attnbench.case import Case
from attnbench.errors import AttnbenchError
from attnbench.run.runner import RunOptions, run_case
from attnbench.run.sweep import Plan, Selection, plan
from attnbench.store.results import Result


def load_backends(plugins: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Built-in, installed (entry points) and named backends. A plugin the user named that does not
    load raises AttnbenchError (`--plugin: ...`); an installed one that does not load is returned as a
    warning (each once per process)."""
    known = len(backend_mod.LOAD_PROBLEMS)
    backend_mod.load_builtin()
    backend_mod.load_entry_points()
    warnings = list(dict.fromkeys(backend_mod.LOAD_PROBLEMS[known:]))
    for p in plugins or ():
        before = len(backend_mod.LOAD_PROBLEMS)
        backend_mod.load_plugin(p)
        if len(backend_mod.LOAD_PROBLEMS) > before:
            problem = backend_mod.LOAD_PROBLEMS.pop()
            del backend_mod.LOAD_PROBLEMS[before:]
            raise AttnbenchError(f"--plugin: {problem}")
    return warnings


@dataclass(frozen=True)
class Session:
    """A planned run and how its rows get their verdicts. Build it with `Session.open`."""

    plan: Plan
    plugins: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default_factory=tuple)  # backends that did not load, the plan's warnings

    @classmethod
    def open(cls, selection: Selection, plugins: tuple[str, ...] | list[str] = ()) -> Session:
        """Load the backends (built-in, installed, `plugins`), then plan the `selection`
        (attnbench.run.sweep.Selection: suites, cases, backends, expectations). Raises AttnbenchError for
        what the user got wrong (one line)."""
        loaded = load_backends(tuple(plugins))
        p = plan(selection)
        return cls(p, tuple(plugins), tuple(loaded) + tuple(p.warnings))

    def verdicts(self, rows: list[Result]) -> list[Result]:
        """`rows` with the plan's expectations applied (fail -> xfail, an expected failure passing -> xpass)."""
        return self.plan.verdicts(rows)

    def run_case(
        self,
        case: Case,
        opts: RunOptions,
        backends: list[Backend] | None = None,
        on_stage: Callable[[str], None] | None = None,
    ) -> list[Result]:
        """One case in this process (default: every planned backend), verdicts applied."""
        return self.verdicts(run_case(case, list(backends or self.plan.backends), opts, on_stage=on_stage))
