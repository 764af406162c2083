"""A plugin backend for tests of the CI gate: another backend with faults planted through the environment.

Load it with `attnbench sweep --plugin tests/support/planted_backend.py -b planted`. It registers:

- `planted`: every fault below;
- `planted-slow`: only the slowdowns; `planted-wrong`: only the wrong outputs (so that one run can
  plant a slowdown in one backend and a wrong output in another).

Each runs the backend named by ATTNBENCH_PLANTED_BASE (default `torch`), then, read at `prepare`:

- ATTNBENCH_PLANTED_SLEEP_S: the call returns this long after it started (host clock; CPU runs);
- ATTNBENCH_PLANTED_SLOWDOWN: a relative slowdown (0.05: 5%) on a GPU: after the kernel, a spin kernel
  (`torch.cuda._sleep`) as long as that fraction of the kernel's own time, measured once per case;
- ATTNBENCH_PLANTED_LSE: comma-separated case-id globs whose `lse` output is off by 1e-2;
- ATTNBENCH_PLANTED_O: comma-separated case-id globs whose `o` output is off by 0.1.
"""

from __future__ import annotations

import fnmatch
import os
import statistics
import time

import attnbench
from attnbench.backend import get_backend
from attnbench.buffers import clone_tensors

_SPIN: dict[str, int] = {}  # case id -> spin cycles, measured once (rotation prepares many copies)


def _hit(var: str, case_id: str) -> bool:
    return any(g and fnmatch.fnmatchcase(case_id, g) for g in os.environ.get(var, "").split(","))


def _spin_cycles(case, make_probe, fraction: float) -> int:
    """Cycles of torch.cuda._sleep that take `fraction` of one kernel call (CUDA events, median of 20 calls),
    measured on a closure over a copy of the inputs (`make_probe()`), so ops that write their inputs
    (caches, states) are checked from untouched ones."""
    import torch

    if case.id not in _SPIN:
        inner = make_probe()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def ms(fn) -> float:
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

        for _ in range(3):
            inner()
        kernel_ms = statistics.median(ms(inner) for _ in range(20))
        per_ms = 1e6 / ms(lambda: torch.cuda._sleep(1_000_000))
        _SPIN[case.id] = max(1, int(fraction * kernel_ms * per_ms))
    return _SPIN[case.id]


class _Planted(attnbench.Backend):
    faults = ("slow", "wrong")
    description = "another backend with planted faults (slowdown, wrong lse, wrong o) for tests of the CI gate"

    @property
    def base(self):
        return get_backend(os.environ.get("ATTNBENCH_PLANTED_BASE", "torch"))

    @property
    def ops(self):
        return self.base.ops

    def available(self):
        return self.base.available()

    def supports(self, case):
        return self.base.supports(case)

    def prepare(self, case, inputs):
        inner = self.base.prepare(case, inputs)
        slow, wrong = "slow" in self.faults, "wrong" in self.faults
        wait = float(os.environ.get("ATTNBENCH_PLANTED_SLEEP_S", "0") or 0) if slow else 0.0
        fraction = float(os.environ.get("ATTNBENCH_PLANTED_SLOWDOWN", "0") or 0) if slow else 0.0
        probe = lambda: self.base.prepare(case, clone_tensors(inputs))
        spin = _spin_cycles(case, probe, fraction) if fraction and case.on_cuda else 0
        shift = {"lse": 1e-2 if wrong and _hit("ATTNBENCH_PLANTED_LSE", case.id) else 0.0}
        shift["o"] = 0.1 if wrong and _hit("ATTNBENCH_PLANTED_O", case.id) else 0.0

        def run():
            deadline = time.perf_counter() + wait
            out = dict(inner())
            if spin:
                import torch

                torch.cuda._sleep(spin)
            for name, delta in shift.items():
                if delta and name in out:
                    out[name] = out[name] + delta
            # sleep to 0.5 ms before the deadline, then spin (time.sleep alone overshoots by a varying amount)
            time.sleep(max(0.0, deadline - time.perf_counter() - 5e-4))
            while time.perf_counter() < deadline:
                pass
            return out

        run.__dict__.update(getattr(inner, "__dict__", {}))  # the closure's hooks (info, finalize, absent)
        return run


@attnbench.register_backend("planted")
class Planted(_Planted):
    pass


@attnbench.register_backend("planted-slow")
class PlantedSlow(_Planted):
    faults = ("slow",)


@attnbench.register_backend("planted-wrong")
class PlantedWrong(_Planted):
    faults = ("wrong",)
