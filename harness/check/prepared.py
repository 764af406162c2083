"""The prepared call: one backend's closure on one case, and what a check may do with it.

A check never touches a backend directly. It gets a `PreparedCall` and may: call the closure again
(`call`: the call, then the closure's `finalize`, harness/backend.py), prepare the backend afresh on a
copy of other inputs and call that once (`fresh_call`), and wait for the device (`sync`). The
closure's buffers are `work` (the backend's copy of the case's inputs, which `prepare` saw);
`pristine` is the case's own copy, never handed to a backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.buffers import clone_tensors


def call_untimed(fn: Callable, around=None) -> dict:
    """One call of a closure outside the timed window, then its `finalize` (harness/backend.py), if any:
    the outputs and written inputs in the canonical layout, as the checks read them. `around`: a context
    manager around the call alone, not the finalize (the runner's NVTX range for profilers)."""
    with around if around is not None else contextlib.nullcontext():
        outputs = fn()
    finalize = getattr(fn, "finalize", None)
    return finalize(outputs) if finalize is not None else outputs


def sync_device(case) -> None:
    """Wait for the case's GPU (nothing on a CPU)."""
    if case.on_cuda:
        torch.cuda.synchronize(torch.device(case.device))


@dataclass
class PreparedCall:
    """`fn` = `backend.prepare(case, work)`: the closure the runner checks and times."""

    case: Any  # attnbench.case.Case
    backend: Any  # attnbench.backend.Backend
    pristine: Any  # the case's inputs, as built (never given to a backend)
    work: Any  # this backend's copy of them: the buffers `fn` holds
    fn: Callable

    @property
    def absent(self) -> dict[str, str]:
        """Outputs the closure declares it does not produce (name -> why; harness/backend.py)."""
        return dict(getattr(self.fn, "absent", {}) or {})

    @property
    def planned(self) -> dict[str, str]:
        """Inputs the closure declares its library consumed in prepare (name -> why; harness/backend.py)."""
        return dict(getattr(self.fn, "planned", {}) or {})

    def call(self) -> dict:
        """Call the closure again on its buffers (as they are now); its finalized outputs."""
        return call_untimed(self.fn)

    def fresh_call(self, inputs: Any = None) -> dict:
        """Prepare the backend again on a copy of `inputs` (default: the pristine ones) and call that
        closure once: for checks that need a call that starts clean (ops that write their inputs) or
        other inputs (a sub-batch)."""
        return self.fresh_call_on(self.pristine if inputs is None else inputs)[0]

    def fresh_call_on(self, inputs: Any) -> tuple[dict, Any]:
        """Like `fresh_call(inputs)`, but also the copy of the inputs the new closure held (its written
        inputs, canaries), as `checks.check` reads them."""
        work = clone_tensors(inputs)
        return call_untimed(self.backend.prepare(self.case, work)), work

    def sync(self) -> None:
        sync_device(self.case)
