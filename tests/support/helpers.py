"""Shared test helpers: run one backend on one case the way a sweep does."""

from __future__ import annotations

import torch

from attnbench.backend import Backend
from attnbench.case import Case
from attnbench.results import Result
from attnbench.runner import RunOptions, run_case


def run_one(case: Case | str, backend: Backend, device: str = "cpu", timing: bool = False) -> Result:
    """The result row of `backend` on `case` (an id or a Case), correctness only by default."""
    if isinstance(case, str):
        case = Case.from_id(case, device)
    return run_case(case, [backend], RunOptions(timing=timing))[0]


def cuda_mean_us(run, n: int = 50) -> float:
    """GPU benchmark scripts: mean µs a call of `run` over `n` back-to-back calls after 5 warm-up calls."""
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(n):
        run()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) / n * 1e3
