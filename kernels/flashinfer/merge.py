"""merge_state through FlashInfer's cascade kernel (base-2 LSE in and out).

`flashinfer.merge_state(v_a, s_a, v_b, s_b)` allocates its outputs and calls the cascade module's
`merge_state(v_a, s_a, v_b, s_b, v_merged, s_merged)`; the adapter calls that same function with the
case's preallocated `o`/`lse` so no copy is timed. The LSE conversions (natural log -> base 2 on
the way in, back on the way out) are part of using the library with canonical semantics and are
timed with it. Empty states (-inf) stay -inf through both conversions; the kernel turns two empty
states into o = 0, lse = -inf, as the reference does.
"""

from __future__ import annotations

import torch

from attnbench.kernels.flashinfer import _lib
from attnbench.kernels.flashinfer import conventions as conv


def prepare_merge_state(case, x):
    _lib.flashinfer()
    from flashinfer.cascade import get_cascade_module

    module, jit_s = _lib.timed(get_cascade_module)
    s_a2, s_b2 = torch.empty_like(x.s_a), torch.empty_like(x.s_b)

    def run():
        conv.lse_ln_to_log2(x.s_a, s_a2)
        conv.lse_ln_to_log2(x.s_b, s_b2)
        module.merge_state(x.v_a, s_a2, x.v_b, s_b2, x.o, x.lse)
        conv.lse_log2_to_ln_(x.lse)
        return {"o": x.o, "lse": x.lse}

    run.info = {"jit_s": jit_s, "plan_s": 0.0, "variant": "cascade merge_state"}
    return run
