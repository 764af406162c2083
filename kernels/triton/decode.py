"""Paged decode as two-stage flash decoding (Triton).

Stage 1 (`_decode_split_kernel`): one program per (kv head, head block, work item). A work item is a
request and a contiguous range of its keys (a KV split). The program attends the query heads that
share the kv head (GQA/MQA/MLA: a `tl.dot` over the head group; MHA: a vector product) over that
range and writes either the final output and LSE (a request with one split) or a partial output and
its base-2 LSE into scratch. Stage 2 (`_decode_merge_kernel`) merges the partials of every request
with more than one split by their LSEs and adds the sink.

The split schedule is planned on the host from `seq_lens_host` (no device sync), in `plan_decode`:
the default mode balances key tokens over the SMs; the deterministic mode cuts every request into
fixed tiles of `split_tile` keys so a request's result does not depend on the rest of the batch.
A sliding window is applied by the schedule itself: only the last W + 1 keys are ever scheduled, so
no key before the window is ever loaded (a sliding-window layer's own pool, `kv_pool: swa`, whose
pages before the window were freed, runs through its page table unchanged).

Scores are computed in base 2: `s * sm_scale * log2(e)` (or the soft cap of `s * sm_scale`, times
log2(e)), so the softmax uses exp2; the LSE written out is natural log.

fp8 caches (`KV_FP8`): K/V tiles are loaded as fp8 and converted to the query dtype (exact); the kv
head's k scale is folded into the score scale and its v scale into the accumulator (powers of two:
exact), so partials and the merge are unchanged. See NOTES.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from attnbench.kernels.triton import tune
from attnbench.kernels.triton.common import (
    LOG2E,
    arch,
    bind_launches,
    block_dv,
    dot_precision,
    exp2_,
    f16_rows_scale,
    finish_lse,
    finish_o,
    fp8_to,
    fp8_to_f16_rows,
    head_split,
    interpreting,
    kv_fp8_code,
    kv_scale_args,
    load_tile,
    mma,
    pow2_row_scale,
    sm_count,
    soft_cap_scores,
    v_is_k_prefix,
)


@triton.jit
def _decode_split_kernel(
    # Inputs
    q, k_cache, v_cache, kv_page_indices, kv_indptr, qo_indptr, sinks, work, k_scale, v_scale,
    # Outputs: final (requests with one split) and partial (requests with several)
    o, lse, part_o, part_ml,
    # Scalars
    qk_scale, scale_over_cap, cap_log2e,
    # Strides (last dims are contiguous)
    stride_qt, stride_qh,
    stride_kp, stride_ks, stride_kh,
    stride_vp, stride_vs, stride_vh,
    stride_ot, stride_oh, stride_lt,
    stride_pw, stride_ph, stride_mw, stride_ml, stride_ksc, stride_vsc,
    # Fused merge (FUSED_MERGE): merge rows, each work item's merge row, arrival counters [M, units]
    merge, work_row, counters,
    # Meta-parameters
    G: tl.constexpr, NUM_HB: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, BLOCK_DV: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_DOT: tl.constexpr, V_FROM_K: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PRECISE_EXP: tl.constexpr, KV_FP8: tl.constexpr = 0,
    FP8_DQ: tl.constexpr = 0, FUSED_MERGE: tl.constexpr = 0, MERGE_DV: tl.constexpr = 128,
    PDL: tl.constexpr = 0,
):  # fmt: skip
    if PDL:  # the merge launch may start now: it reads the partials only after its gdc_wait
        gdc_launch_dependents()
    i_u, i_w = tl.program_id(0), tl.program_id(1)
    i_hk, i_hb = i_u // NUM_HB, i_u % NUM_HB
    i_b = tl.load(work + i_w * 4)
    n_start = tl.load(work + i_w * 4 + 1)
    n_end = tl.load(work + i_w * 4 + 2)
    is_final = tl.load(work + i_w * 4 + 3)
    i_t = tl.load(qo_indptr + i_b)

    o_g = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_g < G
    o_h = i_hk * G + o_g  # query heads of this program
    o_da = tl.arange(0, DA)
    m_da = o_da < DK
    o_dv = tl.arange(0, BLOCK_DV)
    m_dv = o_dv < DV

    p_q = q + i_t * stride_qt + o_h[:, None] * stride_qh
    b_q = tl.load(p_q + o_da[None, :], mask=m_h[:, None] & m_da[None, :], other=0.0)
    if DB > 0:
        o_db = DA + tl.arange(0, DB)
        m_db = o_db < DK
        b_qb = tl.load(p_q + o_db[None, :], mask=m_h[:, None] & m_db[None, :], other=0.0)
    if FP8_DQ:  # fp16 tensor cores: each query row times a power of two, into fp16 (exact)
        b_amax = tl.max(tl.abs(b_q.to(tl.float32)), 1)
        if DB > 0:
            b_amax = tl.maximum(b_amax, tl.max(tl.abs(b_qb.to(tl.float32)), 1))
        b_qup, b_qdown = pow2_row_scale(b_amax)
        if FP8_DQ == 3:  # keys as fp16 x 2^-8 (by bits): undone with the query's scale
            b_qdown = b_qdown / f16_rows_scale(KV_FP8, True)
        b_q = (b_q.to(tl.float32) * b_qup[:, None]).to(tl.float16)
        if DB > 0:
            b_qb = (b_qb.to(tl.float32) * b_qup[:, None]).to(tl.float16)

    if KV_FP8:  # fp8 cache: scores in stored units times this kv head's k scale (a power of two: exact)
        k_sc = tl.load(k_scale + i_hk * stride_ksc)
        qk_scale = qk_scale * k_sc
        scale_over_cap = scale_over_cap * k_sc

    p_pages = kv_page_indices + tl.load(kv_indptr + i_b)
    b_m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    b_l = tl.zeros([BLOCK_H], tl.float32)
    b_acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    # Page indices are loaded one block ahead by hand: with the index load and the K/V loads that
    # depend on it in the same iteration, Triton's pipeliner does not overlap the K/V copies with
    # the math (it waits for all copies at the top of every iteration).
    o_n = n_start + tl.arange(0, BLOCK_N)
    i_page_next = tl.load(p_pages + o_n // PAGE_SIZE, mask=o_n < n_end, other=0)
    for n0 in tl.range(n_start, n_end, BLOCK_N):
        o_n = n0 + tl.arange(0, BLOCK_N)
        m_n = o_n < n_end
        i_page = i_page_next.to(tl.int64)
        o_next = o_n + BLOCK_N
        i_page_next = tl.load(p_pages + o_next // PAGE_SIZE, mask=o_next < n_end, other=0)
        o_slot = o_n % PAGE_SIZE
        p_k = k_cache + i_page * stride_kp + o_slot * stride_ks + i_hk * stride_kh
        b_k = load_tile(p_k[:, None] + o_da[None, :], m_n, m_da, True, DA > DK)
        if FP8_DQ == 3:
            b_k = fp8_to_f16_rows(b_k, KV_FP8, True, False)
        elif KV_FP8:
            b_k = fp8_to(b_k, b_q)
        if USE_DOT:
            b_s = mma(b_q, tl.trans(b_k), tl.zeros([BLOCK_H, BLOCK_N], tl.float32), DOT_PRECISION)
        else:  # one head (BLOCK_H == 1): a vector product
            b_s = tl.sum(b_q.to(tl.float32) * b_k.to(tl.float32), 1)[None, :]
        if DB > 0:
            b_kb = load_tile(p_k[:, None] + o_db[None, :], m_n, m_db, True, DA + DB > DK)
            if FP8_DQ == 3:
                b_kb = fp8_to_f16_rows(b_kb, KV_FP8, True, False)
            elif KV_FP8:
                b_kb = fp8_to(b_kb, b_q)
            if USE_DOT:
                b_s = mma(b_qb, tl.trans(b_kb), b_s, DOT_PRECISION)
            else:
                b_s += tl.sum(b_qb.to(tl.float32) * b_kb.to(tl.float32), 1)[None, :]
        if FP8_DQ:  # back to the query's own scale (a power of two: exact)
            b_s = b_s * b_qdown[:, None]
        if HAS_SOFTCAP:
            b_s = soft_cap_scores(b_s, scale_over_cap, cap_log2e, PRECISE_EXP)
        else:
            b_s = b_s * qk_scale
        b_s = tl.where(m_n[None, :], b_s, float("-inf"))
        if V_FROM_K:
            b_v = b_k
        else:
            p_v = v_cache + i_page * stride_vp + o_slot * stride_vs + i_hk * stride_vh
            b_v = load_tile(p_v[:, None] + o_dv[None, :], m_n, m_dv, True, BLOCK_DV > DV)
            if FP8_DQ >= 2:  # converted in the load's row layout, then staged for the dot as fp16
                b_v = fp8_to_f16_rows(b_v, KV_FP8, FP8_DQ == 3)
            elif KV_FP8:
                b_v = fp8_to(b_v, b_q)
        # every block holds a key of the range, so the new max is finite
        b_mn = tl.maximum(b_m, tl.max(b_s, 1))
        b_alpha = exp2_(b_m - b_mn, PRECISE_EXP)
        b_p = exp2_(b_s - b_mn[:, None], PRECISE_EXP)
        b_l = b_l * b_alpha + tl.sum(b_p, 1)
        if FP8_DQ:  # fp16 probabilities times 2^15 (<= 32768): 11 bits down to 2^-29, the scale undone at the end
            b_p = (b_p * 32768.0).to(tl.float16)
        else:
            b_p = b_p.to(b_v.dtype)  # probabilities meet the values in the input precision, as in a flash kernel
        if USE_DOT:
            b_acc = mma(b_p, b_v, b_acc * b_alpha[:, None], DOT_PRECISION)
        else:
            b_pv = tl.sum(tl.trans(b_p.to(tl.float32)) * b_v.to(tl.float32), 0)[None, :]
            b_acc = b_acc * b_alpha[:, None] + b_pv
        b_m = b_mn
    if KV_FP8:  # the values were summed in stored units: times the v scale (exact), before normalising
        b_acc = b_acc * tl.load(v_scale + i_hk * stride_vsc)
        if FP8_DQ:  # the probabilities' 2^15 (and the values' 2^-8 by bits)
            b_acc = b_acc * (1.0 / 32768.0 / f16_rows_scale(KV_FP8, FP8_DQ == 3))

    if is_final != 0:
        if HAS_SINKS:
            b_sink = tl.load(sinks + o_h, mask=m_h, other=0.0)
        else:
            b_sink = b_m  # unused
        b_o = finish_o(b_acc, b_m, b_l, b_sink, HAS_SINKS, PRECISE_EXP)
        p_o = o + i_t * stride_ot + o_h[:, None] * stride_oh + o_dv[None, :]
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_h[:, None] & m_dv[None, :])
        tl.store(lse + i_t * stride_lt + o_h, finish_lse(b_m, b_l, b_sink, HAS_SINKS, PRECISE_EXP), mask=m_h)
    else:  # the partial output, normalised, with its max (log2 units) and sum kept apart
        p_part = part_o + i_w * stride_pw + o_h[:, None] * stride_ph + o_dv[None, :]
        tl.store(p_part, b_acc / b_l[:, None], mask=m_h[:, None] & m_dv[None, :])
        tl.store(part_ml + i_w * stride_mw + o_h, b_m, mask=m_h)
        tl.store(part_ml + i_w * stride_mw + stride_ml + o_h, b_l, mask=m_h)
        if FUSED_MERGE:
            merge_if_last(
                merge, work_row, counters, i_w, i_u, sinks, part_o, part_ml, o, lse, i_t, o_h, m_h,
                stride_pw, stride_ph, stride_mw, stride_ml, stride_ot, stride_oh, stride_lt,
                DV, BLOCK_DV, MERGE_DV, BLOCK_H, HAS_SINKS, PRECISE_EXP,
            )  # fmt: skip


MERGE_BLOCK_S = tl.constexpr(16)  # splits per step of the fused merge's max pass (fixed: no batch dependence)


@triton.jit
def merge_if_last(
    merge, work_row, counters, i_w, i_u, sinks, part_o, part_ml, o, lse, i_t, o_h, m_h,
    stride_pw, stride_ph, stride_mw, stride_ml, stride_ot, stride_oh, stride_lt,
    DV: tl.constexpr, BLOCK_DV: tl.constexpr, MERGE_DV: tl.constexpr, BLOCK_H: tl.constexpr,
    HAS_SINKS: tl.constexpr, PRECISE_EXP: tl.constexpr,
):  # fmt: skip
    """The fused merge, called by a split program right after it stored its partial (work item `i_w`,
    head-block unit `i_u`, heads `o_h` / `m_h`, output row `i_t`).

    Every program of the group (one merge row `work_row[i_w]` x one unit) counts itself in
    `counters[row, unit]` (int32, zero between calls): all threads' partial stores, then a CTA
    barrier, then an acq_rel atomic add at gpu scope (the release publishes the stores; the last
    program's acquire makes every other program's stores visible to its loads). The program that
    sees `n - 1` arrivals before it merges the group's partials in split-index order
    (`merge_group`: the same loads and arithmetic whichever program arrives last, so the result does
    not depend on the arrival order) and sets the counter back to 0 for the next call (and a CUDA
    graph replay). A launch that dies mid-way leaves counters set: the plan is then stale."""
    i_r = tl.load(work_row + i_w)
    w_start = tl.load(merge + i_r * 3 + 1)
    w_end = tl.load(merge + i_r * 3 + 2)
    p_count = counters + i_r * tl.num_programs(0) + i_u
    tl.debug_barrier()  # every thread's partial stores before the release
    arrived = tl.atomic_add(p_count, 1, sem="acq_rel", scope="gpu")
    if arrived == w_end - w_start - 1:
        merge_group(
            sinks, part_o, part_ml, o, lse, i_t, o_h, m_h, w_start, w_end,
            stride_pw, stride_ph, stride_mw, stride_ml, stride_ot, stride_oh, stride_lt,
            DV, BLOCK_DV, MERGE_DV, BLOCK_H, MERGE_BLOCK_S, HAS_SINKS, PRECISE_EXP,
        )  # fmt: skip
        tl.atomic_xchg(p_count, 0, sem="relaxed", scope="gpu")


@triton.jit
def merge_group(
    sinks, part_o, part_ml, o, lse, i_t, o_h, m_h, w_start, w_end,
    stride_pw, stride_ph, stride_mw, stride_ml, stride_ot, stride_oh, stride_lt,
    DV: tl.constexpr, BLOCK_DV: tl.constexpr, MERGE_DV: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_S: tl.constexpr, HAS_SINKS: tl.constexpr, PRECISE_EXP: tl.constexpr,
):  # fmt: skip
    """Merge the partials `[w_start, w_end)` of heads `o_h` (mask `m_h`) into output row `i_t`.

    The max over the splits first (exact, any order), then per `MERGE_DV` columns the splits one at a
    time in index order: weight `l_w 2^(m_w - M)` summed into the total and, times the partial, into
    the accumulator (elementwise only: no reduction whose order a tile layout could change). Every
    split of a decode holds keys, so M is finite for real heads."""
    b_mx = tl.full([BLOCK_H], float("-inf"), tl.float32)
    for s0 in tl.range(w_start, w_end, BLOCK_S):
        o_s = s0 + tl.arange(0, BLOCK_S)
        b_ms = tl.load(
            part_ml + o_s[:, None] * stride_mw + o_h[None, :],
            mask=(o_s < w_end)[:, None] & m_h[None, :],
            other=float("-inf"),
        )
        b_mx = tl.maximum(b_mx, tl.max(b_ms, 0))
    b_mr = tl.where(b_mx == float("-inf"), 0.0, b_mx)  # padding heads only
    if HAS_SINKS:
        b_sink = tl.load(sinks + o_h, mask=m_h, other=0.0)
    else:
        b_sink = b_mx  # unused
    b_l = tl.zeros([BLOCK_H], tl.float32)
    for d0 in tl.static_range(0, BLOCK_DV, MERGE_DV):
        o_d = d0 + tl.arange(0, MERGE_DV)
        m_hd = m_h[:, None] & (o_d < DV)[None, :]
        b_l = tl.zeros([BLOCK_H], tl.float32)  # the same sum for every column block
        b_acc = tl.zeros([BLOCK_H, MERGE_DV], tl.float32)
        for w in tl.range(w_start, w_end):
            b_mw = tl.load(part_ml + w * stride_mw + o_h, mask=m_h, other=float("-inf"))
            b_lw = tl.load(part_ml + w * stride_mw + stride_ml + o_h, mask=m_h, other=0.0)
            b_ow = tl.load(part_o + w * stride_pw + o_h[:, None] * stride_ph + o_d[None, :], mask=m_hd, other=0.0)
            b_ww = b_lw * exp2_(b_mw - b_mr, PRECISE_EXP)
            b_l = b_l + b_ww
            b_acc = b_acc + b_ww[:, None] * b_ow
        b_o = finish_o(b_acc, b_mx, b_l, b_sink, HAS_SINKS, PRECISE_EXP)
        p_o = o + i_t * stride_ot + o_h[:, None] * stride_oh + o_d[None, :]
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_hd)
    tl.store(lse + i_t * stride_lt + o_h, finish_lse(b_mx, b_l, b_sink, HAS_SINKS, PRECISE_EXP), mask=m_h)


@triton.jit
def _decode_merge_kernel(
    # Inputs
    qo_indptr, merge, sinks, part_o, part_ml,
    # Outputs
    o, lse,
    # Strides
    stride_pw, stride_ph, stride_mw, stride_ml, stride_ot, stride_oh, stride_lt,
    # Meta-parameters
    DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr, HAS_SINKS: tl.constexpr,
    PRECISE_EXP: tl.constexpr, HAS_EMPTY: tl.constexpr = False, PDL: tl.constexpr = 0,
):  # fmt: skip
    """Merge the partials `[w_start, w_end)` of each `merge` row (request, w_start, w_end) into the
    output row `qo_indptr[request]`. HAS_EMPTY: a partial may have seen no key (max -inf, sum 0,
    output 0; extend's split path), so the running max may still be -inf after a block. PDL: launched
    as a programmatic dependent of the split kernel, it reads its tables (which the split kernel does
    not write) and then waits for the split kernel's partials."""
    i_r, i_h = tl.program_id(0), tl.program_id(1)
    i_b = tl.load(merge + i_r * 3)
    w_start = tl.load(merge + i_r * 3 + 1)
    w_end = tl.load(merge + i_r * 3 + 2)
    i_t = tl.load(qo_indptr + i_b)
    if PDL:
        gdc_wait()
    o_dv = tl.arange(0, BLOCK_DV)
    m_dv = o_dv < DV

    b_m = tl.full([1], float("-inf"), tl.float32)
    b_l = tl.zeros([1], tl.float32)
    b_acc = tl.zeros([BLOCK_DV], tl.float32)
    for s0 in tl.range(w_start, w_end, BLOCK_S):
        o_s = s0 + tl.arange(0, BLOCK_S)
        m_s = o_s < w_end
        b_ms = tl.load(part_ml + o_s * stride_mw + i_h, mask=m_s, other=float("-inf"))
        b_ls = tl.load(part_ml + o_s * stride_mw + stride_ml + i_h, mask=m_s, other=0.0)
        b_part = tl.load(
            part_o + o_s[:, None] * stride_pw + i_h * stride_ph + o_dv[None, :],
            mask=m_s[:, None] & m_dv[None, :],
            other=0.0,
        )
        b_mn = tl.maximum(b_m, tl.max(b_ms, 0))  # decode: finite, every split holds keys
        if HAS_EMPTY:  # nothing seen yet: any finite reference keeps exp2 away from -inf - -inf
            b_mr = tl.where(b_mn == float("-inf"), 0.0, b_mn)
        else:
            b_mr = b_mn
        b_alpha = exp2_(b_m - b_mr, PRECISE_EXP)
        b_w = b_ls * exp2_(b_ms - b_mr, PRECISE_EXP)
        b_acc = b_acc * b_alpha + tl.sum(b_w[:, None] * b_part, 0)
        b_l = b_l * b_alpha + tl.sum(b_w, 0)
        b_m = b_mn
    o_one = tl.zeros([1], tl.int32)
    if HAS_SINKS:
        b_sink = tl.load(sinks + i_h + o_one)
    else:
        b_sink = b_m  # unused
    b_o = finish_o(b_acc[None, :], b_m, b_l, b_sink, HAS_SINKS, PRECISE_EXP)
    p_o = o + i_t * stride_ot + i_h * stride_oh + o_dv[None, :]
    tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_dv[None, :])
    tl.store(lse + i_t * stride_lt + i_h + o_one, finish_lse(b_m, b_l, b_sink, HAS_SINKS, PRECISE_EXP))


# ---- launch configuration and schedule ---------------------------------------------------------


@dataclass(frozen=True)
class DecodeConfig:
    """Stage-1 tiling: `block_h` query heads of one kv head by `block_n` keys per step.

    `ctas_per_sm` is how many such programs an SM is expected to run at once; the split planner aims
    at `ctas_per_sm` programs per SM.

    `fp8_dequant`: how fp8 K/V tiles reach the tensor cores (fp8 caches with bf16/fp16 queries and a
    head group on tensor cores; elsewhere it has no effect), one of `FP8_DEQUANT`:
    - "operand": converted to the query dtype in the dot's operand layout (V one byte per
      shared-memory load; e4m3 -> bf16 through fp16: three conversions per two values);
    - "f16": fp16 tensor cores (query rows scaled by powers of two into fp16, probabilities as
      fp16 x 2^15), tiles converted to fp16 in the operand layout (one conversion per two values);
    - "f16-rows": as "f16", but V converted in the layout it was loaded in (16 contiguous bytes per
      thread) and staged through shared memory as fp16 for `ldmatrix.trans`;
    - "f16-bits": as "f16-rows", with K and V converted by byte permutes and masks instead of `cvt`
      (values x 2^-8, folded into the scales; e4m3 NaN reads as 480).

    `fused_merge`: split requests are merged by the last of their split programs to finish (one
    launch; `merge_if_last`) instead of by a second kernel (`_decode_merge_kernel`). Off by default: it
    gained 1% where a merge runs and lost 7-22% at B1 (NOTES.md, "Fused merge").

    `pdl`: the merge kernel is launched as a programmatic dependent of the split kernel (Hopper's PDL:
    `launch_pdl`, `griddepcontrol`): its programs start while the split programs run, read the merge
    table, and wait for the partials, so the second launch's latency and prologue overlap the first
    kernel (the merge launch is the gap at B16 L4096: 5.0 of 103.9 us under Nsight Compute on an H100,
    reports/examples/h100-session22). Sm_90+ compiled only (elsewhere it has no effect). On by default:
    on an H200 it took B8 L1024 from 17.3 to 16.4 us and B16 L1024 (two splits) from 25.9 to 25.0
    (reports/examples/h200-session24/split); with it the split rule cuts shorter
    (`SplitPolicy.fill_keys_overlapped`). Where the split programs take several waves it moved nothing
    beyond the spread between two H200s (`targets` against `targets-before` there: B64 L4096 259.5 ->
    258.4, B64 L8192 510.0 -> 506.6, B128 L8192 995.6 -> 1002.4; a row without a merge, which PDL leaves
    as it is, moved 525.0 -> 542.3).
    """

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    ctas_per_sm: int
    fp8_dequant: str = "f16-rows"
    fused_merge: bool = False
    pdl: bool = True


FP8_DEQUANT = {"operand": 0, "f16": 1, "f16-rows": 2, "f16-bits": 3}  # DecodeConfig.fp8_dequant -> FP8_DQ


def decode_config(group: int, dk: int, dv: int, sm: int) -> DecodeConfig:
    """Tiling by head-group size and head dims (Hopper-first; the same on every batch, for determinism)."""
    width = max(sum(_parts(dk)), block_dv(dv))
    # 3 stages = 2 K/V buffers (the page-index load takes the first stage): copies overlap the math
    stages = 3 if sm >= 80 else 1
    if group == 1:  # MHA: a vector product per head, no tensor cores
        return DecodeConfig(1, 64 if width <= 128 else 32, 4, stages, 4)
    if group >= 64 and width >= 512:  # absorbed MLA: 64 heads x 512+64 latent, one heavy CTA per SM
        return DecodeConfig(64, 32, 8, stages, 1)
    block_h = max(16, min(64, triton.next_power_of_2(group)))
    block_n = 64 if width <= 128 else 32
    return DecodeConfig(block_h, block_n, 4, stages, 3 if block_h <= 16 else 2)


# The fp8 conversion paths (`DecodeConfig.fp8_dequant`) the tuner tries, each with every candidate
# tiling, the first with the heuristic's tiling first. Measured on an H100 (reports/examples/h100-session12/
# fp8dq, one sweep, Llama-3 8B heads, page 16, e4m3; best tiling of each path, us):
#   case          operand  f16    f16-rows  f16-bits  FlashInfer fa2
#   B16 L4096      80.8    68.9    58.5      66.4      76.8
#   B64 L4096     253.7   232.3   199.4     198.5     250.6
#   B128 L8192    984.8   857.1   771.1     777.9     937.0
# "f16-rows" wins or ties on every row there and passes their float64 checks; "f16-bits" ties it but
# reads an e4m3 NaN as 480. "f16-rows" is the default (DecodeConfig) and the only path tuned.
FP8_TUNED_DEQUANT: tuple[str, ...] = ("f16-rows",)


def decode_candidates(
    group: int, dk: int, dv: int, sm: int, kv_fp8: bool = False, fp8_dequant: tuple[str, ...] | None = None
) -> list[DecodeConfig]:
    """Configs worth timing on the device (the heuristic's choice first).

    fp8 caches add 2-warp programs, 4 per SM: their tiles reach the tensor cores through byte-wide
    shared-memory loads and conversions, so the kernel is bound by issue rather than bandwidth and
    more, smaller programs keep more copies in flight where the batch fills the SMs (H100, Llama-3 8B
    heads, page 16, tools/bench/decode_fp8.yaml: B64 L4096 273.6 -> 253.6 us, B64 L8192 529.1 -> 502.1,
    B128 L8192 1025.3 -> 986.8; at B16 they lose, 151.8 -> 168.7 at L8192, and the tuner keeps 4 warps).
    With fp8 caches every tiling comes once per conversion path of `fp8_dequant` (default
    `FP8_TUNED_DEQUANT`)."""
    first = decode_config(group, dk, dv, sm)
    if first.block_h == 1:
        more = [DecodeConfig(1, 32, 4, 4, 4), DecodeConfig(1, 128, 8, 3, 2)]
    elif first.block_h >= 64:  # MLA
        more = [DecodeConfig(64, 16, 8, 4, 1), DecodeConfig(32, 32, 4, 3, 1)]
    else:
        more = [
            DecodeConfig(first.block_h, first.block_n // 2, 4, 4, 4),
            DecodeConfig(first.block_h, first.block_n * 2, 8, 3, 1),
        ]
        if kv_fp8 and first.block_h == 16:
            more.append(DecodeConfig(16, first.block_n, 2, first.num_stages, 4))
    tilings = [first] + [c for c in more if c != first]
    if not kv_fp8:
        return tilings
    return [replace(c, fp8_dequant=m) for m in (fp8_dequant or FP8_TUNED_DEQUANT) for c in tilings]


def shrink_decode_config(c: DecodeConfig) -> DecodeConfig | None:
    """A config needing less shared memory (fewer stages, then fewer keys per step), or None."""
    if c.num_stages > 2:
        return replace(c, num_stages=c.num_stages - 1)
    if c.block_n > 16:
        return replace(c, block_n=c.block_n // 2)
    return None


def _parts(dk: int) -> tuple[int, int]:
    s = head_split(dk)
    return s.da, s.db


def default_decode_config(x) -> DecodeConfig:
    """`decode_config` for the shapes of `x`."""
    _, Hq, Dk = x.q.shape
    Hkv, Dv = x.k_cache.shape[2], x.v_cache.shape[-1]
    return decode_config(Hq // Hkv, Dk, Dv, arch(x.q.device))


@dataclass
class DecodePlan:
    """Everything the timed call needs, built once: schedule, scratch, grid and constexprs."""

    work: torch.Tensor  # [W, 4] int32: request, first key, end key, 1 = write the final output
    merge: torch.Tensor | None  # [M, 3] int32: request, first work item, end work item
    part_o: torch.Tensor  # [W, Hq, Dv] fp32 partial outputs (1 element when nothing is split)
    part_ml: torch.Tensor  # [W, 2, Hq] fp32 per split: max of the scores (log2 units), sum of exp2
    grid: tuple[int, int]
    merge_grid: tuple[int, int]
    meta: dict
    merge_meta: dict
    splits: list[int]  # per request
    config: DecodeConfig
    # fused merge (FUSED_MERGE in meta): each work item's merge row (-1: final), arrival counters [M, units]
    work_row: torch.Tensor | None = None
    counters: torch.Tensor | None = None

    @property
    def fused(self) -> bool:
        """Split requests are merged inside the split launch (no merge launch)."""
        return bool(self.meta.get("FUSED_MERGE", 0))


@dataclass(frozen=True)
class SplitPolicy:
    """How the default (not deterministic) plans cut requests into KV splits: `decode_chunk` for decode,
    extend_plan.py's split path for extend. Frozen; the backend knobs `min_split`, `fill_ctas`,
    `fill_keys` and `step_keys` (`-b "triton:fill_keys=2048"`) plan with another one. Each value and
    the measurement behind it (kernels/triton/NOTES.md, "Decode"):

    - `waves` = 4: extend's split path balances the keys over waves x SMs programs.
    - `min_split` = 256 keys: the shortest split a default plan makes. H200, B1 L8192 GQA 32/8: 256-key
      splits ran 19.0 us where the four-wave plan's 64-key splits ran 24.5 (merge and launch overhead).
    - `fill_ctas` = 2: programs per SM aimed at, in one wave, while the unsplit batch runs fewer.
    - `fill_keys` = 1024 keys: the shortest split worth a second program per SM where every SM already
      has one, when the merge kernel waits for the split kernel to end. H100, B16: L1024 29.9 us
      unsplit against 32.3 in two splits; L4096 99.2 in two against 102.0 in more
      (reports/examples/h100-session10/splits at e281b29).
    - `fill_keys_overlapped` = 512 keys: the same where the merge is launched as a programmatic
      dependent (`DecodeConfig.pdl` on sm_90+): its launch and prologue overlap the splits. H200, B16
      L1024: two splits of 512 with PDL 25.0 us, unsplit 26.8 (FA4 23.9; reports/examples/h200-session24/split).
    - `step_keys` = 128 keys: a program's fixed cost when split counts are weighed by their waves.
    """

    waves: int = 4
    min_split: int = 256
    fill_ctas: int = 2
    fill_keys: int = 1024
    fill_keys_overlapped: int = 512
    step_keys: int = 128


SPLITS = SplitPolicy()  # the default


def balanced_chunk(sizes: list[int], units: int, block_n: int, target_programs: int, min_chunk: int) -> int:
    """Keys per split: the `sizes` (keys of each range, each run by `units` programs) balanced over
    `target_programs` programs, at least `min_chunk`, evened out over the longest range (it gets
    `round(longest / chunk)` equal splits) and rounded up to a multiple of `block_n`."""
    longest = max(sizes)
    total = sum(sizes) * units
    chunk = max(min_chunk, -(-total // max(1, target_programs)))
    splits = max(1, round(longest / chunk))
    chunk = -(-longest // splits)
    return -(-chunk // block_n) * block_n


def split_counts(sizes: list[int], units: int, block_n: int, slots: int, min_chunk: int, max_splits: int):
    """For n = 1, 2, ... splits of the longest of `sizes` (keys): `(n, chunk, programs, waves)`, the
    chunk rounded up to `block_n`, every request cut into `ceil(size / chunk)` splits of `units`
    programs each, `waves` of `slots` resident programs; it stops before a chunk under `min_chunk`."""
    longest = max(sizes)
    for n in range(1, max_splits + 1):
        per_split = -(-longest // n)
        chunk = -(-per_split // block_n) * block_n
        if n > 1 and chunk < min_chunk:
            return
        programs = sum(-(-size // chunk) for size in sizes) * units
        yield n, chunk, programs, -(-programs // slots)


def fewest_within(costs: list[tuple[float, int]], slack: float) -> int:
    """The first (fewest splits) value of `costs` `[(cost, value)]` whose cost is within `slack` of the least."""
    best = min(c for c, _ in costs)
    return next(v for c, v in costs if c <= best * (1 + slack))


def decode_chunk(
    sizes: list[int], units: int, block_n: int, sms: int, ctas_per_sm: int, min_chunk: int,
    policy: SplitPolicy = SPLITS,
) -> int:  # fmt: skip
    """Keys per split of the default decode plan, for requests of `sizes` visible keys, each run by
    `units` programs per split, on `sms` SMs holding `ctas_per_sm` programs each.

    - Few programs unsplit (at most `policy.fill_ctas` per SM): the keys are balanced over `fill_ctas x sms`
      programs, one wave (`balanced_chunk`), so short batches are split only as far as the SMs need;
      where the unsplit programs already cover half the SMs or more, into splits of `fill_keys` keys
      at least: a skewed batch still cuts its long requests, and a uniform one is not cut where the
      merge and the partials cost more than a second program per SM gains (H100, B16: 1024 keys,
      29.9 us unsplit against 32.3 in two splits; 4096 keys, 99.2 in two against 102.0).
    - More: the split count whose waves of programs end soonest, each program costing its keys plus
      `step_keys` (`ceil(programs / slots) x (chunk + step_keys)`); the fewest splits within 5%.

    Measured on an H100 (reports/examples/h100-session10/splits at e281b29: Llama-3 8B heads, B 1-128, 1k-8k keys,
    every fixed split size beside the plan): the four-wave plan this replaces cut B16-B32 requests of
    1k-8k keys into 4-12 splits where one or two ran 5-14% faster, and B8 into 16-22 where 4 did.
    """
    programs = len(sizes) * units
    if programs <= policy.fill_ctas * sms:
        chunk = balanced_chunk(sizes, units, block_n, policy.fill_ctas * sms, min_chunk)
        if 2 * programs >= sms:  # half the SMs or more busy already: splits of fill_keys at least
            chunk = max(chunk, -(-min(policy.fill_keys, max(sizes)) // block_n) * block_n)
        return chunk
    counts = split_counts(sizes, units, block_n, sms * ctas_per_sm, min_chunk, 16)
    return fewest_within([(waves * (chunk + policy.step_keys), chunk) for _, chunk, _, waves in counts], 0.05)


def split_tables(items: list[tuple[int, int, int]], requests: int, Hq: int, Dv: int, device) -> tuple:
    """The device tables of a split schedule (`items` grouped by request): `(work [W, 4] int32:
    request, first key, end key, 1 = write the final output; merge [M, 3] int32: request, first item,
    end item, or None when nothing is split; part_o [W, Hq, Dv] and part_ml [W, 2, Hq] fp32 scratch
    (one element each when nothing is split); splits per request)`."""
    counts = [0] * requests
    for b, _, _ in items:
        counts[b] += 1
    work = [(b, s, e, int(counts[b] == 1)) for b, s, e in items]
    merge, w = [], 0
    for b, n in enumerate(counts):
        if n > 1:
            merge.append((b, w, w + n))
        w += n
    work_t = torch.tensor(work, dtype=torch.int32).to(device)
    merge_t = torch.tensor(merge, dtype=torch.int32).to(device) if merge else None
    W = len(work) if merge else 1
    part_o = torch.empty((W, Hq, Dv) if merge else (1, 1, 1), dtype=torch.float32, device=device)
    part_ml = torch.empty((W, 2, Hq) if merge else (1, 2, 1), dtype=torch.float32, device=device)
    return work_t, merge_t, part_o, part_ml, counts


def fused_merge_tables(counts: list[int], units: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """For a split schedule with `counts` splits per request (work items grouped by request, merge
    rows in request order, as `split_tables` makes them), run by `units` programs per work item:
    `(work_row [W] int32: the merge row of each work item, -1 for a request's only item; counters
    [M, units] int32 zeros: the arrival counters of the fused merge, which leaves them at zero)`."""
    rows, r = [], 0
    for n in counts:
        rows += [r if n > 1 else -1] * n
        r += n > 1
    work_row = torch.tensor(rows, dtype=torch.int32).to(device)
    return work_row, torch.zeros((max(1, r), units), dtype=torch.int32, device=device)


def split_schedule(
    lens: list[int], window: int, units: int, block_n: int, sms: int, ctas_per_sm: int,
    *, min_chunk: int, deterministic: bool, split_tile: int, policy: SplitPolicy = SPLITS,
) -> tuple[list[tuple[int, int, int]], int]:  # fmt: skip
    """Cut each request's visible keys into splits: `([(request, start, end)], chunk)`.

    Visible keys of a request of length L are [L - 1 - W, L) under a window W, else [0, L).
    Deterministic: every split is `split_tile` keys (the last one shorter), whatever the batch.
    Otherwise the chunk is `decode_chunk`'s (each of the `units` (kv head, head block) pairs of a
    request runs its own program; `sms` SMs of `ctas_per_sm` programs), at least `min_chunk`, and
    evened out over the longest request, so uniform batches get equal splits and a skewed batch cuts
    its long requests finely while the short ones stay whole.
    """
    ranges = [(max(0, L - 1 - window) if window >= 0 else 0, L) for L in lens]
    if deterministic:
        chunk = split_tile
    else:
        chunk = decode_chunk([e - s for s, e in ranges], units, block_n, sms, ctas_per_sm, min_chunk, policy)
    items = []
    for b, (s, e) in enumerate(ranges):
        for a in range(s, e, chunk):
            items.append((b, a, min(e, a + chunk)))
    return items, chunk


def plan_decode(
    x, *, deterministic: bool = False, split_tile: int = 256, min_chunk: int | None = None,
    num_sms: int | None = None, config: DecodeConfig | None = None, policy: SplitPolicy = SPLITS,
) -> DecodePlan:  # fmt: skip
    """Schedule, scratch and launch parameters for `decode(x, plan)` (host work only, no device sync).

    Args:
        x: `AttentionInputs` of a decode case (one query per request).
        deterministic: fixed splits of `split_tile` keys (batch-invariant results).
        split_tile: keys per split in deterministic mode (a multiple of the config's block_n);
            raised to a multiple of itself where a split's partials would be a quarter of its keys
            or more (MLA: 2048), which depends on the head dims only, never on the batch.
        min_chunk: smallest split in the default mode (default: `policy.min_split` keys, 2 * block_n, or
            more where the partial outputs of a split would outweigh its keys).
        num_sms: SMs to plan for (default: the device's).
        config: stage-1 tiling (default: `decode_config`).
        policy: the split rule of the default mode (`SplitPolicy`).
    """
    device = x.q.device
    T, Hq, Dk = x.q.shape
    Hkv, Dv = x.k_cache.shape[2], x.v_cache.shape[-1]
    if any(n != 1 for n in x.q_lens_host) or T != len(x.seq_lens_host):
        raise ValueError("decode takes exactly one query per request")
    G = Hq // Hkv
    cfg = config or default_decode_config(x)
    split = head_split(Dk)
    num_hb = -(-G // cfg.block_h)
    if deterministic and split_tile % cfg.block_n:
        raise ValueError(f"split_tile ({split_tile}) must be a multiple of block_n ({cfg.block_n})")
    sms = num_sms or sm_count(device)
    v_from_k = v_is_k_prefix(x.k_cache, x.v_cache) and Dv == split.da
    # a split costs Hq x Dv fp32 partials written and read again: keep that below the split's own
    # K/V bytes (it matters for MLA: 128 heads x 512 of partials against 1152 bytes per key)
    kv_bytes_per_key = Hkv * (Dk + (0 if v_from_k else Dv)) * x.k_cache.element_size()
    partial_keys = -(-Hq * Dv * 8 // kv_bytes_per_key)
    if min_chunk is None:
        min_chunk = max(2 * cfg.block_n, partial_keys, policy.min_split)
    if merge_overlaps(cfg, device):
        policy = replace(policy, fill_keys=policy.fill_keys_overlapped)
    if deterministic and 4 * partial_keys > split_tile:
        # still batch-independent (head dims only): MLA tiles grow to 2048 keys, GQA stays at 256
        split_tile *= -(-4 * partial_keys // split_tile)
    items, _ = split_schedule(
        list(x.seq_lens_host), x.window, Hkv * num_hb, cfg.block_n, sms, cfg.ctas_per_sm,
        min_chunk=min_chunk, deterministic=deterministic, split_tile=split_tile, policy=policy,
    )  # fmt: skip
    work_t, merge_t, part_o, part_ml, counts = split_tables(items, len(x.seq_lens_host), Hq, Dv, device)
    W = work_t.shape[0]
    bdv = block_dv(Dv)
    meta = dict(
        G=G, NUM_HB=num_hb, DK=Dk, DV=Dv, DA=split.da, DB=split.db, BLOCK_DV=bdv,
        PAGE_SIZE=x.k_cache.shape[1], BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
        USE_DOT=cfg.block_h >= 16, V_FROM_K=v_from_k, HAS_SOFTCAP=x.soft_cap > 0,
        HAS_SINKS=x.sinks is not None, DOT_PRECISION=dot_precision(x.q.dtype),
        PRECISE_EXP=x.q.dtype == torch.float32, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if kv_fp8_code(x.k_cache.dtype):  # absent otherwise: the bf16/fp16/fp32 kernels compile as before
        meta["KV_FP8"] = kv_fp8_code(x.k_cache.dtype)
        if FP8_DEQUANT[cfg.fp8_dequant] and meta["USE_DOT"] and x.q.dtype in (torch.bfloat16, torch.float16):
            meta["FP8_DQ"] = FP8_DEQUANT[cfg.fp8_dequant]
    merge_meta = dict(  # BLOCK_S is fixed: the merge's summation order must not depend on the batch
        DV=Dv, BLOCK_DV=bdv, BLOCK_S=16,
        HAS_SINKS=x.sinks is not None, PRECISE_EXP=x.q.dtype == torch.float32,
        num_warps=4 if bdv >= 256 else 2,
    )  # fmt: skip
    plan = DecodePlan(
        work_t,
        merge_t,
        part_o,
        part_ml,
        (Hkv * num_hb, W),
        (0 if merge_t is None else merge_t.shape[0], Hq),
        meta,
        merge_meta,
        counts,
        cfg,
    )
    return arrange_merge(plan, cfg, Hkv * num_hb, device)


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch: compiled kernels on sm_90 or later (never the interpreter)."""
    return device.type == "cuda" and not interpreting() and arch(device) >= 90


def with_pdl(plan: DecodePlan, trigger: bool = True) -> DecodePlan:
    """`plan` with its merge launched as a programmatic dependent of the split kernel (`DecodeConfig.pdl`);
    a plan with nothing to merge, or merging inside the split launch, is returned as it is. `trigger`:
    the split kernel lets it launch as its programs start (`PDL` constexpr: this file's kernel); without,
    each split program triggers as it exits (the MLA kernels), so merge programs start on the SMs of the
    first ones to finish."""
    if plan.merge is not None and not plan.fused:
        plan.meta = plan.meta | ({"PDL": 1} if trigger else {})
        plan.merge_meta = plan.merge_meta | {"PDL": 1, "launch_pdl": True}
    return plan


def arrange_merge(plan: DecodePlan, config, units: int, device: torch.device, trigger: bool = True) -> DecodePlan:
    """How `plan`'s splits are merged, as `config` (a `DecodeConfig` or `MLAConfig`) says: inside the
    split launch (`fused_merge`), by a merge kernel launched as a programmatic dependent (`pdl`, where
    supported; `trigger`: see `with_pdl`), else by a merge kernel after it."""
    if config.fused_merge:
        return fuse_merge(plan, units)
    return with_pdl(plan, trigger) if merge_overlaps(config, device) else plan


def merge_overlaps(config, device: torch.device) -> bool:
    """Whether `config`'s merge kernel is launched as a programmatic dependent of its split kernel, so it
    overlaps the splits (`pdl` where supported, and not merged inside the split launch)."""
    return config.pdl and not config.fused_merge and pdl_supported(device)


def fuse_merge(plan: DecodePlan, units: int) -> DecodePlan:
    """`plan` with its split requests merged inside the split launch (`merge_if_last`): the counters
    and work rows added, `FUSED_MERGE` set. A plan with nothing split is returned as it is (one launch
    already, compiled as without the option)."""
    if plan.merge is None:
        return plan
    plan.work_row, plan.counters = fused_merge_tables(plan.splits, units, plan.work.device)
    plan.meta = plan.meta | {"FUSED_MERGE": 1, "MERGE_DV": min(plan.meta.get("BLOCK_DV", 512), 128)}
    return plan


def fused_args(plan: DecodePlan) -> tuple:
    """The split kernel's `merge, work_row, counters` arguments (stand-ins, never read, when not fused)."""
    if not plan.fused:
        return plan.work, plan.work, plan.work
    return plan.merge, plan.work_row, plan.counters


def _launches(x, plan: DecodePlan) -> list[tuple]:
    """(kernel, grid, args, kwargs) of the stage-1 launch and, when some request is split, stage 2."""
    q, k, v, o, lse = x.q, x.k_cache, x.v_cache, x.o, x.lse
    sinks = x.sinks if x.sinks is not None else lse  # never read without sinks
    scale, cap = x.sm_scale, x.soft_cap
    k_scale, v_scale, stride_ksc, stride_vsc = kv_scale_args(x, lse)
    split_args = (
        q, k, v, x.kv_page_indices, x.kv_indptr, x.qo_indptr, sinks, plan.work, k_scale, v_scale,
        o, lse, plan.part_o, plan.part_ml,
        scale * LOG2E, scale / cap if cap > 0 else 0.0, cap * LOG2E,
        q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        o.stride(0), o.stride(1), lse.stride(0),
        plan.part_o.stride(0), plan.part_o.stride(1), plan.part_ml.stride(0), plan.part_ml.stride(1),
        stride_ksc, stride_vsc, *fused_args(plan),
    )  # fmt: skip
    out = [(_decode_split_kernel, plan.grid, split_args, plan.meta)]
    if plan.merge is not None and not plan.fused:
        out.append(merge_launch(x.qo_indptr, plan, sinks, o, lse))
    return out


def merge_launch(rows: torch.Tensor, plan, sinks, o: torch.Tensor, lse: torch.Tensor) -> tuple:
    """The merge kernel's launch (kernel, grid, args, meta) combining `plan`'s partials (`part_o`,
    `part_ml`, rows of `plan.merge`) into `o` / `lse`; `rows[request]` is the request's first output row."""
    args = (
        rows, plan.merge, sinks, plan.part_o, plan.part_ml, o, lse,
        plan.part_o.stride(0), plan.part_o.stride(1), plan.part_ml.stride(0), plan.part_ml.stride(1),
        o.stride(0), o.stride(1), lse.stride(0),
    )  # fmt: skip
    return (_decode_merge_kernel, plan.merge_grid, args, plan.merge_meta)


def decode(x, plan: DecodePlan) -> dict[str, torch.Tensor]:
    """Paged decode of `x.q [B, Hq, Dk]` over `x.k_cache/x.v_cache [P, page, Hkv, D*]` into `x.o`, `x.lse`.

    Args:
        x: `AttentionInputs` (one query per request; `x.o [B, Hq, Dv]`, `x.lse [B, Hq]` fp32 natural log).
        plan: from `plan_decode(x)`, built once per batch layout.

    Returns:
        `{"o": x.o, "lse": x.lse}`.

    Example::

        plan = plan_decode(x)          # host work: schedule, scratch
        out = decode(x, plan)          # launches; call again for new contents of the same tensors
    """
    for fn, grid, args, kwargs in _launches(x, plan):
        fn[grid](*args, **kwargs)
    return {"o": x.o, "lse": x.lse}


def bind_decode(x, plan: DecodePlan) -> Callable[[], dict[str, torch.Tensor]]:
    """`decode(x, plan)` as a zero-argument call with its kernels compiled and arguments bound now."""
    return bind_launches(_launches(x, plan), {"o": x.o, "lse": x.lse})


# Batches of fewer key-heads (sum of lengths x kv heads) keep the heuristic. 2^19: the Llama-3-8B B64 L1024
# decode (2^19) ran 104.4 us on the heuristic's two 64-key-block splits, 95.6 unsplit with 32-key blocks
# (the tuner's 4-per-SM candidate plans it so), where vLLM ran 95.6 (H100, reports/examples/h100-session21
# dec3); at B16 L1024 (2^17) the 32-key blocks lose (34.7 against 30.2).
TUNE_MIN_WORK = 1 << 19


def tuned_decode_config(x, policy: SplitPolicy = SPLITS) -> tuple[DecodeConfig | None, dict]:
    """On CUDA, for MLA and for GQA/MHA batches of `TUNE_MIN_WORK` key-heads or more: the fastest of
    `decode_candidates` on `x`, each planned under the split rule `policy` (timed now, cached per kernel
    variant and rule). Otherwise (None, {}): the heuristic stands."""
    device = x.q.device
    if not tune.enabled(device):
        return None, {}
    _, Hq, Dk = x.q.shape
    Hkv, Dv = x.k_cache.shape[2], x.v_cache.shape[-1]
    G = Hq // Hkv
    mla = G >= 64 and Dk >= 512
    work = sum(x.seq_lens_host) * Hkv
    if not mla and work < TUNE_MIN_WORK:
        return None, {}
    key = (
        "decode", G, Dk, Dv, x.k_cache.shape[1], x.q.dtype, x.k_cache.dtype, x.window >= 0, x.soft_cap > 0,
        x.sinks is not None, len(x.seq_lens_host) >= 32, (work.bit_length() if not mla else 0),
    ) + ((policy,) if policy != SPLITS else ())  # fmt: skip
    cands = decode_candidates(G, Dk, Dv, arch(device), kv_fp8=bool(kv_fp8_code(x.k_cache.dtype)))
    return tune.pick(key, cands, lambda cfg: bind_decode(x, plan_decode(x, config=cfg, policy=policy)))
