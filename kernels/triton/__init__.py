"""Our own Triton kernels as the `triton` backend (CPU: run by the interpreter, TRITON_INTERPRET=1).

This minimal registration carries only the GDN mixin; the attention kernels' backend class (branch
`triton`) is merged with it, so that one `triton` backend serves both families.
"""

from __future__ import annotations

import importlib.util
import os

from attnbench.backend import Backend, register_backend
from attnbench.kernels.triton.gdn_backend import TritonGDN


@register_backend("triton")
class TritonBackend(TritonGDN, Backend):
    description = "our own Triton kernels (interpreted on a CPU under TRITON_INTERPRET=1)"

    def available(self) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "triton not installed"
        import torch

        if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
            return "no CUDA GPU (TRITON_INTERPRET=1 runs the kernels in the interpreter)"
        return None

    def supports(self, case) -> str | None:
        why = super().supports(case)
        if why:
            return why
        if case.on_cuda == (os.environ.get("TRITON_INTERPRET", "0") == "1"):
            return "the case device does not match Triton's mode (TRITON_INTERPRET=1 runs CPU tensors only)"
        return None
