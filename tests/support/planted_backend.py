"""A plugin backend for tests of the CI gate: `planted`, the torch backend with faults set by environment.

Load it with `attnbench sweep --plugin tests/support/planted_backend.py -b planted`. Read at `prepare`:

- ATTNBENCH_PLANTED_SLEEP_S: each call returns this long after it started (a kernel made slower);
- ATTNBENCH_PLANTED_LSE: comma-separated case-id globs whose `lse` output is off by 1e-2 (a known finding);
- ATTNBENCH_PLANTED_O: comma-separated case-id globs whose `o` output is off by 0.1 (a new breakage).
"""

from __future__ import annotations

import fnmatch
import os
import time

import attnbench
from attnbench.kernels.torch import TorchBackend


def _hit(var: str, case_id: str) -> bool:
    return any(g and fnmatch.fnmatchcase(case_id, g) for g in os.environ.get(var, "").split(","))


@attnbench.register_backend("planted")
class Planted(TorchBackend):
    description = "torch with planted faults (slowdown, wrong lse, wrong o) for tests of the CI gate"

    def prepare(self, case, inputs):
        inner = super().prepare(case, inputs)
        wait = float(os.environ.get("ATTNBENCH_PLANTED_SLEEP_S", "0") or 0)
        shift = {"lse": 1e-2 if _hit("ATTNBENCH_PLANTED_LSE", case.id) else 0.0}
        shift["o"] = 0.1 if _hit("ATTNBENCH_PLANTED_O", case.id) else 0.0

        def run():
            deadline = time.perf_counter() + wait
            out = dict(inner())
            for name, delta in shift.items():
                if delta and name in out:
                    out[name] = out[name] + delta
            # sleep to 0.5 ms before the deadline, then spin (time.sleep alone overshoots by a varying amount)
            time.sleep(max(0.0, deadline - time.perf_counter() - 5e-4))
            while time.perf_counter() < deadline:
                pass
            return out

        return run
