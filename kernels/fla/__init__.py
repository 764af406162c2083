"""flash-linear-attention (fla-core) as the `fla` backend: gdn_extend and gdn_decode.

fla's GDN kernels are Triton: the chunked prefill (`chunk_gated_delta_rule`) and the fused recurrent
step (`fused_recurrent_gated_delta_rule`). They run on CUDA; under TRITON_INTERPRET=1 the chunk
kernels fail (autotuning needs a driver), so CPU cases are not run. Conventions: kernels/fla/gdn.py.
"""

from __future__ import annotations

import importlib.util

from attnbench.backend import Backend, implements, register_backend


def limits(backend, case) -> str | None:
    """Both ops: CUDA cases, fp16/bf16/fp32, K up to 256."""
    if not case.on_cuda:
        return "fla runs on CUDA only (its chunk kernels fail under TRITON_INTERPRET)"
    if case.dtype not in ("bf16", "fp16", "fp32"):
        return f"fla: dtype {case.dtype}"
    if case.params.head_dim_k > 256:
        return "fla: head_dim_k > 256"
    return None


@register_backend("fla")
class FlaBackend(Backend):
    description = "flash-linear-attention (fla-core 0.6.0): chunked GDN prefill, fused recurrent decode"

    def available(self) -> str | None:
        try:
            found = importlib.util.find_spec("fla") is not None
        except (ImportError, ValueError):
            found = False
        return None if found else "fla-core not installed"

    # graph-safe: fla's launcher takes its grid from the shapes; the closure gathers the dense initial states by
    # the slots on the device (index_select, where: no host sync) and its finalize scatters the final states
    # into the slots as they are when it runs
    @implements("gdn_decode", limits=limits, state_layout="kv", graph_safe=True)
    def prepare_gdn_decode(self, case, x):
        from attnbench.kernels.fla.gdn import prepare_decode

        return prepare_decode(case, x)

    @implements("gdn_extend", limits=limits, state_layout="kv")
    def prepare_gdn_extend(self, case, x):
        from attnbench.kernels.fla.gdn import prepare_extend

        return prepare_extend(case, x)
