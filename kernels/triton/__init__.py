"""The triton backend (minimal: the spec and GDN mixins on this branch; the full backend class is merged in).

Runs on a CUDA GPU, or on the CPU under the Triton interpreter (`TRITON_INTERPRET=1`).
"""

from __future__ import annotations

import importlib.util
import os

from attnbench.backend import Backend, register_backend
from attnbench.kernels.triton.gdn_backend import TritonGDN
from attnbench.kernels.triton.spec_backend import TritonSpec


@register_backend("triton")
class TritonBackend(TritonSpec, TritonGDN, Backend):
    description = "attnbench's own Triton kernels (GPU, or CPU under TRITON_INTERPRET=1)"

    def available(self) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed (pip install 'attnbench[gpu]')"
        import torch

        if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            return "no CUDA GPU (set TRITON_INTERPRET=1 to run the kernels in the interpreter)"
        return None

    def supports(self, case) -> str | None:
        if case.op_name == "tree_verify" and not callable(getattr(self, "prepare_extend", None)):
            return "triton has no extend kernel on this build (tree_verify runs through extend)"
        if not case.on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            return "a CPU case needs TRITON_INTERPRET=1 (the Triton interpreter)"
        return super().supports(case)
