"""Shared test helpers: run one backend on one case the way a sweep does."""

from __future__ import annotations

import os

from attnbench.backend import Backend
from attnbench.case import Case
from attnbench.check.checks import DETERMINISM_REPEATS
from attnbench.run.runner import RunOptions, run_case
from attnbench.store.results import Result

# Under TRITON_INTERPRET=1 a kernel runs program after program in numpy: a later call cannot reorder a
# reduction, so the sweep's five determinism repeats (harness/check/checks.py) only multiply the time of the
# interpreter tests; one repeat still checks that the closure recomputes from its inputs. Compiled
# kernels (a GPU) get the sweep's full count.
KERNEL_REPEATS = 1 if os.environ.get("TRITON_INTERPRET") == "1" else DETERMINISM_REPEATS


def run_one(
    case: Case | str, backend: Backend, device: str = "cpu", timing: bool = False, repeats: int = DETERMINISM_REPEATS
) -> Result:
    """The result row of `backend` on `case` (an id or a Case), correctness only by default; `repeats`:
    the determinism check's calls (`KERNEL_REPEATS` for our kernels' tests)."""
    if isinstance(case, str):
        case = Case.from_id(case, device)
    return run_case(case, [backend], RunOptions(timing=timing, determinism_repeats=repeats))[0]
