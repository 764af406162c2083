"""Paged decode through `BatchDecodeWithPagedKVCacheWrapper` (tensor-core fa2/fa3, or CUDA-core).

Canonical inputs map onto FlashInfer's NHD paged layout without copies: `k_cache`/`v_cache`
`[P, page_size, Hkv, D]` are NHD, the CSR page table is FlashInfer's (`kv_indptr`,
`kv_page_indices`, int32), and `last_page_len` comes from `seq_lens`. The plain decode paths have
no sink term (FlashInfer drops `sinks=` on them silently), so sink cases go to `sinks.py`.
"""

from __future__ import annotations

from attnbench.kernels.flashinfer import _lib
from attnbench.kernels.flashinfer import conventions as conv


def prepare_decode(case, x, *, tensor_cores: bool, backend: str):
    """Plan a decode wrapper and return the timed closure (writes `x.o`, natural-log `x.lse`).

    Args:
        tensor_cores: True for the prefill-style tensor-core kernel, False for the CUDA-core one.
        backend: "fa2" or "fa3" (tensor cores); "fa2" with tensor_cores=False is the CUDA-core
            kernel (an explicit backend keeps `auto` from re-routing, e.g. to cuDNN on SM100).
    """
    fi = _lib.flashinfer()
    dtype = x.q.dtype
    Hq, Hkv, D = x.q.shape[1], x.k_cache.shape[2], x.q.shape[2]
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
        _lib.float_workspace(x.q.device), "NHD", use_tensor_cores=tensor_cores, backend=backend
    )
    last = conv.last_page_len(x.seq_lens, x.page_size)
    kv_dtype = x.k_cache.dtype  # the case dtype, or fp8 (real value = stored * scale: run(k_scale=, v_scale=))
    scales = {} if x.k_scale is None else {"k_scale": float(x.k_scale), "v_scale": float(x.v_scale)}

    def plan():
        wrapper.plan(
            x.kv_indptr,
            x.kv_page_indices,
            last,
            Hq,
            Hkv,
            D,
            x.page_size,
            pos_encoding_mode="NONE",
            window_left=conv.window_left(x.window),
            logits_soft_cap=conv.soft_cap(x.soft_cap),
            q_data_type=dtype,  # plan() defaults to float16: always pass the case dtype
            kv_data_type=kv_dtype,
            o_data_type=dtype,
            sm_scale=x.sm_scale,
        )

    jit_s, plan_s = _lib.timed_twice(plan)
    kv = (x.k_cache, x.v_cache)

    def run():
        wrapper.run(x.q, kv, out=x.o, lse=x.lse, return_lse=True, **scales)
        conv.lse_log2_to_ln_(x.lse)  # decode LSE is base 2 (no lse_base option on this wrapper)
        return {"o": x.o, "lse": x.lse}

    kernel = f"tensor-core {backend}" if tensor_cores else "cuda-core"
    run.info = {
        "jit_s": jit_s,
        "plan_s": plan_s,
        "variant": f"BatchDecodeWithPagedKVCacheWrapper {kernel}",
        "resolved_backend": wrapper.resolved_backend,
    }
    return run
