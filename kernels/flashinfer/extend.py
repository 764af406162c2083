"""Extend (prefill over a paged prefix) through FlashInfer's batch prefill wrappers.

Two paths:

- `prepare_paged`: one `BatchPrefillWithPagedKVCacheWrapper` call over the whole sequence in the
  cache. `new_kv: save` first writes the new K/V into their slots (timed, as SGLang's
  `set_kv_buffer` is part of its extend), `shared` reads the cache as it is.
- `prepare_cascade`: SGLang's FlashInfer extend. The new tokens go through
  `BatchPrefillWithRaggedKVCacheWrapper` (causal among themselves, K/V from `k_new`/`v_new`), the
  cached prefix through the paged wrapper (non-causal: every prefix key precedes every new query),
  and `merge_state_in_place` joins the two (base-2 LSE in and out, converted once at the end). A
  batch without prefixes is the ragged call alone. This is the path for `new_kv: attend`, where
  the new K/V never enter the cache.

Both pass the backend ("fa2" or "fa3") explicitly: `auto` decides on fa3 without seeing a
custom mask passed to plan() (it looks at `custom_mask_buf`, a CUDA-graph buffer), and fa3 has no
custom mask.
"""

from __future__ import annotations

import torch

from attnbench.kernels.flashinfer import _lib
from attnbench.kernels.flashinfer import conventions as conv
from attnbench.kernels.torch.attention import save_new_kv


def _plan_common(x) -> dict:
    dtype = x.q.dtype
    return dict(
        pos_encoding_mode="NONE",
        sm_scale=x.sm_scale,
        logits_soft_cap=conv.soft_cap(x.soft_cap),
        q_data_type=dtype,  # plan() defaults to float16: always pass the case dtype
        kv_data_type=dtype,
        o_data_type=dtype,
    )


def _mask_args(x) -> dict:
    """Custom mask (bool, True = visible; the wrapper packs it little-endian) or causal/non-causal.

    Verified: "FlashInfer custom_mask (bool) | True = visible". attnbench's mask is per request
    `[q_len, seq_len]` row-major, FlashInfer's flattened layout. With a custom mask, causal is
    False: the mask decides alone, and a causal plan would schedule away key tiles it may show.
    Causal is bottom-right aligned, verified: "single_prefill_with_kv_cache(causal=True) |
    bottom-right aligned causal".
    """
    if x.custom_mask is not None:
        return {"custom_mask": x.custom_mask, "causal": False}
    return {"causal": x.causal}


def _strides_differ(x) -> bool:
    return tuple(x.k_cache.stride()) != tuple(x.v_cache.stride())


def _planned(x) -> dict[str, str]:
    """The custom mask is an argument of plan(), which packs it into the wrapper's own buffer: a server
    plans each batch with its mask (SGLang's FlashInfer backend, per forward), run() never reads it."""
    if x.custom_mask is None:
        return {}
    return {"custom_mask": "plan() packs it into the wrapper's buffer; a server re-plans per batch"}


def prepare_paged(case, x, *, backend: str):
    """Extend as one paged prefill over prefix + new tokens (after saving them, for `save`)."""
    fi = _lib.flashinfer()
    Hq, Hkv, Dk, Dv = x.q.shape[1], x.k_cache.shape[2], x.q.shape[2], x.v_cache.shape[3]
    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(_lib.float_workspace(x.q.device), "NHD", backend=backend)
    last = conv.last_page_len(x.seq_lens, x.page_size)

    def plan():
        wrapper.plan(
            x.qo_indptr,
            x.kv_indptr,
            x.kv_page_indices,
            last,
            Hq,
            Hkv,
            Dk,
            x.page_size,
            head_dim_vo=Dv,
            window_left=conv.window_left(x.window),
            **_mask_args(x),
            **_plan_common(x),
        )

    jit_s, plan_s = _lib.timed_twice(plan)
    if backend == "fa2" and _strides_differ(x):
        # K and V caches with different strides (Dk != Dv) run fa2's "independent stride" module,
        # which FlashInfer builds lazily at the first run(): build it here, outside the timed call.
        _, more = _lib.timed(lambda: wrapper.prewarm_paged_kv_stride_variant("independent"))
        jit_s += more
    kv = (x.k_cache, x.v_cache)

    def run():
        if x.save_kv:
            save_new_kv(x)
        wrapper.run(x.q, kv, out=x.o, lse=x.lse, return_lse=True, lse_base="ln")
        return {"o": x.o, "lse": x.lse}

    run.info = {"jit_s": jit_s, "plan_s": plan_s, "variant": f"BatchPrefillWithPagedKVCacheWrapper {backend}"}
    run.planned = _planned(x)
    return run


def prepare_cascade(case, x, *, backend: str):
    """Extend as ragged (new tokens) + paged (prefix) + merge_state, or ragged alone without prefixes.

    Needs the new tokens' K/V (`new_kv` save or attend) and a prefix on every request or on none
    (the declared limits `ragged_extend_limits` / `paged_extend_limits` say so before `prepare`)."""
    fi = _lib.flashinfer()
    Hq, Hkv, Dk, Dv = x.q.shape[1], x.k_cache.shape[2], x.q.shape[2], x.v_cache.shape[3]
    prefix = [L - n for L, n in zip(x.seq_lens_host, x.q_lens_host, strict=True)]
    ws = _lib.float_workspace(x.q.device)
    ragged = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
    paged = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend) if all(prefix) else None
    if paged is not None:
        indptr, indices, last = conv.prefix_page_table(x.kv_indptr.tolist(), x.kv_page_indices, prefix, x.page_size)

    def plan():
        # new tokens among themselves: kv_indptr = qo_indptr (k_new is packed like q)
        ragged.plan(
            x.qo_indptr,
            x.qo_indptr,
            Hq,
            Hkv,
            Dk,
            head_dim_vo=Dv,
            window_left=conv.window_left(x.window),  # limits.cascade allows a window only without prefixes
            **_mask_args(x),
            **_plan_common(x),
        )
        if paged is not None:
            paged.plan(
                x.qo_indptr,
                indptr,
                indices,
                last,
                Hq,
                Hkv,
                Dk,
                x.page_size,
                head_dim_vo=Dv,
                causal=False,  # every prefix key precedes every new query
                window_left=-1,
                **_plan_common(x),
            )

    jit_s, plan_s = _lib.timed_twice(plan)
    if paged is not None:
        if backend == "fa2" and _strides_differ(x):
            _, more = _lib.timed(lambda: paged.prewarm_paged_kv_stride_variant("independent"))
            jit_s += more
        from flashinfer.cascade import get_cascade_module

        _, more = _lib.timed(get_cascade_module)  # merge_state_in_place's JIT module
        jit_s += more
        o_new = torch.empty_like(x.o)
        lse_new = torch.empty_like(x.lse)
    kv = (x.k_cache, x.v_cache)

    def run():
        if x.save_kv:
            save_new_kv(x)
        if paged is None:
            ragged.run(x.q, x.k_new, x.v_new, out=x.o, lse=x.lse, return_lse=True, lse_base="ln")
        else:
            paged.run(x.q, kv, out=x.o, lse=x.lse, return_lse=True)  # base-2 LSE, as merge wants it
            ragged.run(x.q, x.k_new, x.v_new, out=o_new, lse=lse_new, return_lse=True)
            fi.merge_state_in_place(x.o, x.lse, o_new, lse_new)
            conv.lse_log2_to_ln_(x.lse)
        return {"o": x.o, "lse": x.lse}

    kind = "ragged + paged prefix + merge_state_in_place" if paged is not None else "ragged"
    run.info = {"jit_s": jit_s, "plan_s": plan_s, "variant": f"{kind} {backend}"}
    run.planned = _planned(x)
    return run
