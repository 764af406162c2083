"""SGLang's CuTe DSL GDN decode (`sglang.jit_kernel.cutedsl_gdn.cutedsl_fused_sigmoid_gating_delta_rule_update`,
sglang 0.5.10.post1) behind the canonical gdn_decode contract: the `sglang-cute` backend.

The kernel indexes its state pool as `(pool, HV, K, V)` (its code reads `h0_source[pool, hv, k, v]`),
attnbench's canonical layout, so the pool is passed as it is and updated in place; -1 indices are
skipped. Tiles: K = 128 (TILE_K), V in tiles of 32; it writes o in bf16; a small-batch kernel below 32
requests. It compiles one kernel per (batch, heads, dims, pool size): `prepare` runs it once on a copy
of the inputs (untimed, `jit_s`), so the timed call finds it compiled.

Note for SGLang itself: its `CuteDSLGDNKernel.decode` passes the server's `ssm_states` unchanged, the
pool its Triton kernels address as `[N, HV, V, K]`; with K = V = 128 the shapes agree and the layouts
do not. A row that passes here with the canonical pool says the kernel computes the canonical math on
a `[.., K, V]` pool.
"""

from __future__ import annotations

import time

import torch

from attnbench.buffers import clone_tensors
from attnbench.kernels.sglang import _lib


def cute_unsupported(case) -> str | None:
    p = case.params
    if not case.on_cuda:
        return "SGLang's CuTe DSL GDN decode runs on CUDA (SM90+) only"
    if case.dtype != "bf16":
        return "SGLang's CuTe DSL GDN decode writes o in bf16 (bf16 cases only)"
    if p.head_dim_k != 128:
        return "SGLang's CuTe DSL GDN decode: head_dim_k 128 (TILE_K)"
    if p.head_dim_v % 32:
        return "SGLang's CuTe DSL GDN decode: head_dim_v a multiple of 32 (TILE_V)"
    return None


def prepare_decode(case, x):
    import importlib

    kernel = importlib.import_module(_lib.CUTE_GDN).cutedsl_fused_sigmoid_gating_delta_rule_update
    B, HV, V = x.batch, x.v.shape[1], x.v.shape[2]

    def call(y):
        return kernel(
            y.A_log, y.dt_bias, y.q[:, None], y.k[:, None], y.v[:, None], y.a, y.b, y.state_pool, y.state_indices,
            scale=y.scale, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip

    t0 = time.perf_counter()
    call(clone_tensors(x))  # compiles this shape's kernel on a copy: the pool of x stays pristine
    if x.q.is_cuda:
        torch.cuda.synchronize(x.q.device)
    jit_s = time.perf_counter() - t0

    def run():
        return {"o": call(x).view(B, HV, V)}

    run.info = {"variant": "cutedsl_fused_sigmoid_gating_delta_rule_update" + (" (small batch)" if B < 32 else ""),
                "jit_s": jit_s}  # fmt: skip
    return run
