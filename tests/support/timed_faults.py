"""A plugin backend for tests of the shared timing: torch's kernels, with a fault only while timed.

Load it with `--plugin tests/support/timed_faults.py` (or `attnbench.backend.load_plugin`). Each backend
runs the `torch` backend's closure, checks and all, and faults only when its call comes from inside the
timer (`attnbench.run.timing.time_closures` on the stack), whatever the other backends timed with it:

- `raises-timed`: raises a plain ValueError (the CUDA context, were there one, intact);
- `loses-context-timed`: raises the RuntimeError of a lost CUDA context (runner.context_lost);
- `exits-timed`: ends its process (`os._exit(9)`), as a crash of a worker would.
"""

from __future__ import annotations

import os
import traceback

import attnbench
from attnbench.backend import get_backend


def _timed() -> bool:
    return any(frame.name == "time_closures" for frame in traceback.extract_stack())


class _FaultsTimed(attnbench.Backend):
    @property
    def ops(self):
        return get_backend("torch").ops

    def supports(self, case):
        return get_backend("torch").supports(case)

    def prepare(self, case, inputs):
        fn = get_backend("torch").prepare(case, inputs)

        def run():
            if _timed():
                self.fault()
            return fn()

        return run


@attnbench.register_backend("raises-timed")
class RaisesTimed(_FaultsTimed):
    def fault(self):
        raise ValueError("planted: fails under the timer")


@attnbench.register_backend("loses-context-timed")
class LosesContextTimed(_FaultsTimed):
    def fault(self):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


@attnbench.register_backend("exits-timed")
class ExitsTimed(_FaultsTimed):
    def fault(self):
        os._exit(9)
