"""Shared test helpers: run one backend on one case the way a sweep does; judge a kernel's outputs as the
harness would; one request of a decode batch on its own; closures that are correct but unlike any fresh
one (`Nudges`); a stand-in for CUDA events on the CPU (`logging_events`)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import zlib
from collections.abc import Callable
from unittest import mock

import torch

from attnbench.backend import Backend
from attnbench.buffers import alloc_output
from attnbench.case import Case
from attnbench.check import checks
from attnbench.check.checks import DETERMINISM_REPEATS, check
from attnbench.check.tolerance import rule_for
from attnbench.run.runner import RunOptions, run_case
from attnbench.store.results import Result

# Under TRITON_INTERPRET=1 a kernel runs program after program in numpy: a later call cannot reorder a
# reduction, so the sweep's five determinism repeats (harness/check/checks.py) only multiply the time of the
# interpreter tests; one repeat still checks that the closure recomputes from its inputs. Compiled
# kernels (a GPU) get the sweep's full count.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
KERNEL_REPEATS = 1 if INTERPRETED else DETERMINISM_REPEATS
# The stale-output check matches each re-run against a freshly prepared closure's call first and computes the
# float64 reference of the changed inputs only where they differ (checks.FRESH_FIRST_MAX_BYTES): on a GPU the
# reference is the dear part. Under the interpreter a test case's reference takes milliseconds and a kernel call
# seconds, so the kernel tests take the other order: the reference first, the fresh closure only as the control of
# a failing re-run. The verdicts are the same either way (a re-run that does what a fresh closure does fails the
# reference exactly where that closure does, and the control passes it over: stale_check's docstring);
# test_stale_cost.py holds the control-first order to that, on the torch backend.
KERNEL = {"repeats": KERNEL_REPEATS, "stale_control_first": not INTERPRETED}  # run_one's options for kernel tests
# The bulk interpreter tests (every smoke case of a backend) re-run each case's closure under one of the op's
# perturbations, not all of them: the stale check's re-runs were two thirds of such a case's time (an fp32
# fp8 extend: 55 of 81 s, four re-runs), and CI must stay under 20 minutes. Which one is fixed by the case id
# (`one_perturbation`), so every class of changed input is still re-run on some case of every op; the
# focused and mutant tests (KERNEL) and every GPU sweep re-run them all.
SMOKE_KERNEL = KERNEL | {"stale_one": INTERPRETED}


def run_one(
    case: Case | str,
    backend: Backend,
    device: str = "cpu",
    timing: bool = False,
    repeats: int = DETERMINISM_REPEATS,
    stale_control_first: bool = True,
    stale_one: bool = False,
) -> Result:
    """The result row of `backend` on `case` (an id or a Case), correctness only by default; `repeats`:
    the determinism check's calls; `stale_control_first`: the stale check's order (`**KERNEL` sets both for
    our kernels' tests); `stale_one`: the stale check re-runs one of the op's perturbations (`SMOKE_KERNEL`)."""
    if isinstance(case, str):
        case = Case.from_id(case, device)
    opts = RunOptions(timing=timing, determinism_repeats=repeats)
    with contextlib.ExitStack() as stack:
        if not stale_control_first:
            stack.enter_context(mock.patch.object(checks, "FRESH_FIRST_MAX_BYTES", -1))
        if stale_one:
            stack.enter_context(one_perturbation(case))
        return run_case(case, [backend], opts)[0]


@contextlib.contextmanager
def one_perturbation(case: Case):
    """While open, `case`'s op offers the stale check one of its perturbations: the one its id picks
    (a CRC of the id modulo their count, the same in every run)."""
    op_type = type(case.op)
    real = op_type.perturbations
    pick = zlib.crc32(case.id.encode())

    def one(self, p):
        perts = tuple(real(self, p))
        return perts[pick % len(perts) :][:1] if perts else perts

    with mock.patch.object(op_type, "perturbations", one):
        yield


def kernel_verdict(case: Case, pristine, work, outputs):
    """The harness's verdict on `outputs` (and every side effect in `work`) for inputs `pristine`."""
    op, p = case.op, case.params
    expected = op.expected(p, pristine, torch.float64)
    twin = op.expected(p, pristine, case.torch_dtype)
    return check(op, p, pristine, work, outputs, expected, twin, rule_for(case))


def decode_request(x, b: int):
    """The decode inputs of request `b` alone (same caches, fresh outputs)."""
    pages = x.kv_page_indices[int(x.kv_indptr[b]) : int(x.kv_indptr[b + 1])]
    one = torch.tensor([0, 1], dtype=torch.int32, device=x.q.device)
    return dataclasses.replace(
        x,
        q=x.q[b : b + 1].clone(),
        kv_indptr=torch.tensor([0, len(pages)], dtype=torch.int32, device=x.q.device),
        kv_page_indices=pages.clone(),
        seq_lens=x.seq_lens[b : b + 1].clone(),
        qo_indptr=one,
        o=alloc_output((1, *x.o.shape[1:]), x.o.dtype, x.o.device),
        lse=alloc_output((1, x.lse.shape[1]), x.lse.dtype, x.lse.device),
        seq_lens_host=x.seq_lens_host[b : b + 1],
        q_lens_host=(1,),
    )


class Nudges:
    """Closures that are correct but unlike any other: a stale-output check cannot match a re-run of one
    against a freshly prepared closure (their bits differ by the offsets), so it judges every perturbed run
    on the float64 reference of the changed inputs; the offsets stay far inside every tolerance.

    Wraps the closures a backend prepares: the n-th closure wrapped since the last `reset()` (n from 1)
    adds `step * n` to its output `o` (in place, on every call). The offsets depend only on the order the
    closures are made, so two runs that each `reset()` first give the same bits."""

    def __init__(self, step: float = 1e-4):
        self.step = step
        self.made = 0

    def reset(self) -> None:
        self.made = 0

    def wrap(self, inner: Callable[[], dict]) -> Callable[[], dict]:
        """`inner` (a closure returning a dict with a tensor "o"), nudged by the next offset."""
        self.made += 1
        nudge = self.step * self.made

        def run():
            out = inner()
            out["o"].add_(nudge)
            return out

        return run


def logging_events(log: list, elapsed_ms: float):
    """A stand-in for `torch.cuda.Event` (monkeypatch it in): `record` appends "event" to `log`, and every
    pair of events is `elapsed_ms` apart."""

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            log.append("event")

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return elapsed_ms

    return Event
