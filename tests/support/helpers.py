"""Shared test helpers: run one backend on one case the way a sweep does."""

from __future__ import annotations

from attnbench.backend import Backend
from attnbench.case import Case
from attnbench.results import Result
from attnbench.runner import RunOptions, run_case


def run_one(case: Case | str, backend: Backend, device: str = "cpu", timing: bool = False) -> Result:
    """The result row of `backend` on `case` (an id or a Case), correctness only by default."""
    if isinstance(case, str):
        case = Case.from_id(case, device)
    return run_case(case, [backend], RunOptions(timing=timing))[0]
