"""Extend / prefill over a paged prefix (Triton): FlashAttention-2 style tiles, causal block skipping.

One program per (query tile of `BLOCK_M` new tokens of one request, query head). For short requests
(spec tree verify, small chunks) the planner packs the query heads of a kv group into the tile
instead (`HEADS` > 1, FlashInfer's GQA packing): one program per (tile of `BLOCK_M // HEADS` tokens,
`HEADS` query heads of one kv head), row r = token r // HEADS, head r % HEADS, so each K/V block is
read once per group rather than once per head and the MMA's rows are filled. Masks, sinks and stores
take each row's token and head; nothing else differs. Keys come from two sources: the request's
cached prefix (paged, `kv_page_indices`) and its new tokens (`k_new`/`v_new` packed by `qo_indptr`;
or the cache itself in `shared` mode, where k_new is None). Each source's key range is walked in
three loops: masked blocks on the left (window edge), unmasked blocks that every row of the tile
sees whole (no mask arithmetic at all), masked blocks on the right (causal diagonal, sequence end).
Blocks no row can see are never visited: causal tiles stop at their last query, and a window starts
at the first query's window. A custom mask (True = visible) replaces causality and masks every
block; the window still applies.

In `save` mode the programs of the first head (or head group) of each kv group also write the tile's
new K/V into their cache slots (`slot_mapping`); attention reads new keys from k_new/v_new, so the
writes never race with reads. Rows that see no key (and have no sink) get o = 0 and lse = -inf.

Split-KV path (`SPLIT`, planned only when the grid above would leave SMs idle over a long prefix:
speculative tree verify, small chunked-prefill chunks): one program per (query tile, query head or
head group, key split). A tile's key range is cut into splits; each program attends its split with
every mask as above and writes a normalised fp32 partial output and its (max, sum) apart (a row that
sees no key of the split: max -inf, sum 0, output 0), and decode's merge kernel combines them and
adds the sink once. A tile with a single split writes its output directly; only the first split's
programs save.

fp8 caches (`KV_FP8`): cached K/V are read in stored units (fp8 converted to the query dtype, exact),
with the kv head's k scale folded into the score scale and its v scale into the accumulator. `save`
stores new tokens as fp8(x / scale) and attends them as stored (rounded the same way in registers);
`attend` reads them unquantised with the plain score scale. See NOTES.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from attnbench.kernels.triton import tune
from attnbench.kernels.triton.common import (
    LOG2E,
    arch,
    bind_launch,
    block_dv,
    dot_precision,
    exp2_,
    finish_lse,
    finish_o,
    fp8_to,
    head_split,
    kv_fp8_code,
    kv_scale_args,
    load_tile,
    mma,
    sm_count,
    soft_cap_scores,
    to_fp8,
    v_is_k_prefix,
)
from attnbench.kernels.triton.decode import MIN_SPLIT, WAVES, balanced_chunk, merge_launch


@triton.jit
def _attend_range(
    b_acc, b_m, b_l, b_q, b_qb,
    k_src, v_src, p_pages, row0, new_start, n_lo, n_hi,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, i_hk,
    o_pos, m_rows, o_mask_row, custom_mask, seq_len, window,
    qk_scale, scale_over_cap, cap_log2e, k_inv, v_inv,
    DK: tl.constexpr, DV: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, BLOCK_DV: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, FROM_NEW: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_SOFTCAP: tl.constexpr, V_FROM_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PRECISE_EXP: tl.constexpr, KV_FP8: tl.constexpr, REQUANT: tl.constexpr,
):  # fmt: skip
    """Online-softmax update of (acc, m, l) over keys [n_lo, n_hi) of one source.

    MASKED: apply bounds and visibility masks; else every key of every block is visible to every row
    (the caller guarantees it), so no mask is computed at all. KV_FP8: the source's K/V are fp8 values
    in stored units (converted to the query dtype, exactly); with REQUANT they are the new tokens in
    the query dtype, rounded here to what the cache stores (`x * inv` to fp8) before use.
    """
    o_da = tl.arange(0, DA)
    o_dv = tl.arange(0, BLOCK_DV)
    m_da = o_da < DK
    m_dv = o_dv < DV
    if DB > 0:
        o_db = DA + tl.arange(0, DB)
        m_db = o_db < DK
    # paged keys: page indices are loaded one block ahead by hand, so the pipeliner overlaps the K/V
    # copies with the math (with the index load in the same iteration it does not)
    o_n = n_lo + tl.arange(0, BLOCK_N)
    if FROM_NEW:
        i_page_next = o_n  # unused
    else:
        i_page_next = tl.load(p_pages + o_n // PAGE_SIZE, mask=o_n < n_hi, other=0)
    for n0 in tl.range(n_lo, n_hi, BLOCK_N):
        o_n = n0 + tl.arange(0, BLOCK_N)
        m_n = o_n < n_hi
        if FROM_NEW:  # packed new tokens: row = first row of the request + (position - prefix)
            i_row = (row0 + o_n - new_start).to(tl.int64)
            p_k = k_src + i_row * stride_kp + i_hk * stride_kh
            p_v = v_src + i_row * stride_vp + i_hk * stride_vh
        else:  # paged cache
            i_page = i_page_next.to(tl.int64)
            o_next = o_n + BLOCK_N
            i_page_next = tl.load(p_pages + o_next // PAGE_SIZE, mask=o_next < n_hi, other=0)
            o_slot = o_n % PAGE_SIZE
            p_k = k_src + i_page * stride_kp + o_slot * stride_ks + i_hk * stride_kh
            p_v = v_src + i_page * stride_vp + o_slot * stride_vs + i_hk * stride_vh
        b_k = load_tile(p_k[:, None] + o_da[None, :], m_n, m_da, MASKED, DA > DK)
        if KV_FP8:
            if REQUANT:
                b_k = to_fp8(b_k.to(tl.float32) * k_inv, KV_FP8)
            b_k = fp8_to(b_k, b_q)
        b_s = mma(b_q, tl.trans(b_k), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), DOT_PRECISION)
        if DB > 0:
            b_kb = load_tile(p_k[:, None] + o_db[None, :], m_n, m_db, MASKED, DA + DB > DK)
            if KV_FP8:
                if REQUANT:
                    b_kb = to_fp8(b_kb.to(tl.float32) * k_inv, KV_FP8)
                b_kb = fp8_to(b_kb, b_q)
            b_s = mma(b_qb, tl.trans(b_kb), b_s, DOT_PRECISION)
        if HAS_SOFTCAP:
            b_s = soft_cap_scores(b_s, scale_over_cap, cap_log2e, PRECISE_EXP)
        else:
            b_s = b_s * qk_scale
        if V_FROM_K:
            b_v = b_k
        else:
            b_v = load_tile(p_v[:, None] + o_dv[None, :], m_n, m_dv, MASKED, BLOCK_DV > DV)
            if KV_FP8:
                if REQUANT:
                    b_v = to_fp8(b_v.to(tl.float32) * v_inv, KV_FP8)
                b_v = fp8_to(b_v, b_q)
        if MASKED:
            b_vis = m_n[None, :] & m_rows[:, None]
            if IS_CAUSAL:
                b_vis = b_vis & (o_n[None, :] <= o_pos[:, None])
            if HAS_WINDOW:
                b_vis = b_vis & (o_n[None, :] >= o_pos[:, None] - window)
            if HAS_MASK:
                p_cm = custom_mask + o_mask_row[:, None] + o_n[None, :]
                b_cm = tl.load(p_cm, mask=b_vis, other=0)
                b_vis = b_vis & (b_cm != 0)
            b_s = tl.where(b_vis, b_s, float("-inf"))
            b_mn = tl.maximum(b_m, tl.max(b_s, 1))
            b_ms = tl.where(b_mn == float("-inf"), 0.0, b_mn)  # a row with nothing visible yet
        else:
            b_mn = tl.maximum(b_m, tl.max(b_s, 1))
            b_ms = b_mn
        b_alpha = exp2_(b_m - b_ms, PRECISE_EXP)
        b_p = exp2_(b_s - b_ms[:, None], PRECISE_EXP)
        b_l = b_l * b_alpha + tl.sum(b_p, 1)
        b_acc = mma(b_p.to(b_v.dtype), b_v, b_acc * b_alpha[:, None], DOT_PRECISION)
        b_m = b_mn
    return b_acc, b_m, b_l


@triton.jit
def _attend_source(
    b_acc, b_m, b_l, b_q, b_qb,
    k_src, v_src, p_pages, row0, new_start, a, e, full_lo, full_hi,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, i_hk,
    o_pos, m_rows, o_mask_row, custom_mask, seq_len, window, qk_scale, scale_over_cap, cap_log2e,
    k_inv, v_inv,
    DK: tl.constexpr, DV: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, BLOCK_DV: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    FROM_NEW: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, V_FROM_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PRECISE_EXP: tl.constexpr, KV_FP8: tl.constexpr, REQUANT: tl.constexpr,
):  # fmt: skip
    """Keys [a, e) of one source: masked blocks left of `full_lo`, whole unmasked blocks inside
    [full_lo, full_hi), masked blocks for the rest."""
    u0 = tl.minimum(tl.maximum(full_lo, a), tl.maximum(e, a))
    u1 = u0 + tl.maximum(tl.minimum(full_hi, e) - u0, 0) // BLOCK_N * BLOCK_N
    b_acc, b_m, b_l = _attend_range(
        b_acc, b_m, b_l, b_q, b_qb, k_src, v_src, p_pages, row0, new_start, a, u0,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, i_hk,
        o_pos, m_rows, o_mask_row, custom_mask, seq_len, window, qk_scale, scale_over_cap, cap_log2e,
        k_inv, v_inv, DK, DV, DA, DB, BLOCK_DV, PAGE_SIZE, BLOCK_M, BLOCK_N,
        True, FROM_NEW, IS_CAUSAL, HAS_WINDOW, HAS_MASK, HAS_SOFTCAP, V_FROM_K, DOT_PRECISION, PRECISE_EXP,
        KV_FP8, REQUANT,
    )  # fmt: skip
    b_acc, b_m, b_l = _attend_range(
        b_acc, b_m, b_l, b_q, b_qb, k_src, v_src, p_pages, row0, new_start, u0, u1,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, i_hk,
        o_pos, m_rows, o_mask_row, custom_mask, seq_len, window, qk_scale, scale_over_cap, cap_log2e,
        k_inv, v_inv, DK, DV, DA, DB, BLOCK_DV, PAGE_SIZE, BLOCK_M, BLOCK_N,
        False, FROM_NEW, IS_CAUSAL, HAS_WINDOW, HAS_MASK, HAS_SOFTCAP, V_FROM_K, DOT_PRECISION, PRECISE_EXP,
        KV_FP8, REQUANT,
    )  # fmt: skip
    b_acc, b_m, b_l = _attend_range(
        b_acc, b_m, b_l, b_q, b_qb, k_src, v_src, p_pages, row0, new_start, u1, e,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, i_hk,
        o_pos, m_rows, o_mask_row, custom_mask, seq_len, window, qk_scale, scale_over_cap, cap_log2e,
        k_inv, v_inv, DK, DV, DA, DB, BLOCK_DV, PAGE_SIZE, BLOCK_M, BLOCK_N,
        True, FROM_NEW, IS_CAUSAL, HAS_WINDOW, HAS_MASK, HAS_SOFTCAP, V_FROM_K, DOT_PRECISION, PRECISE_EXP,
        KV_FP8, REQUANT,
    )  # fmt: skip
    return b_acc, b_m, b_l


@triton.jit
def _save_rows(p_cache, p_new, mask, inv_scale, KV_FP8: tl.constexpr):
    """Copy new K or V rows into their cache slots; an fp8 cache stores fp8(x / scale), with x / scale
    exact as x * (1 / scale)."""
    if KV_FP8:
        b_x = tl.load(p_new, mask=mask, other=0.0)
        tl.store(p_cache, to_fp8(b_x.to(tl.float32) * inv_scale, KV_FP8), mask=mask)
    else:
        tl.store(p_cache, tl.load(p_new, mask=mask), mask=mask)


@triton.jit
def _extend_kernel(
    # Inputs
    q, k_cache, v_cache, k_new, v_new, kv_page_indices, kv_indptr, qo_indptr, seq_lens, tiles,
    custom_mask, mask_indptr, sinks, slot_mapping, k_scale, v_scale,
    # Outputs: final, and partial (split path: tiles with several key splits)
    o, lse, part_o, part_ml,
    # Scalars
    qk_scale, scale_over_cap, cap_log2e, window,
    # Strides (last dims are contiguous)
    stride_qt, stride_qh,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    stride_knt, stride_knh, stride_vnt, stride_vnh,
    stride_ot, stride_oh, stride_lt,
    stride_pw, stride_ph, stride_mw, stride_ml, stride_ksc, stride_vsc,
    # Meta-parameters
    HQ: tl.constexpr, G: tl.constexpr, HEADS: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, BLOCK_DV: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
    NEW_FROM_CACHE: tl.constexpr, SAVE_KV: tl.constexpr, V_FROM_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PRECISE_EXP: tl.constexpr, SPLIT: tl.constexpr, KV_FP8: tl.constexpr = 0,
):  # fmt: skip
    pid = tl.program_id(0)
    i_h0 = pid % (HQ // HEADS) * HEADS  # the tile's first query head
    i_tile = pid // (HQ // HEADS)
    i_hk = i_h0 // G
    if SPLIT:  # work item: request, first query, key range, first partial, splits of the tile, final?, split
        i_b = tl.load(tiles + i_tile * 8)
        m_start = tl.load(tiles + i_tile * 8 + 1)
        n_lo = tl.load(tiles + i_tile * 8 + 2)
        n_hi = tl.load(tiles + i_tile * 8 + 3)
        i_part = tl.load(tiles + i_tile * 8 + 4)
        n_split = tl.load(tiles + i_tile * 8 + 5)
        is_final = tl.load(tiles + i_tile * 8 + 6)
        is_first = tl.load(tiles + i_tile * 8 + 7) == 0
    else:
        i_b = tl.load(tiles + i_tile * 2)
        m_start = tl.load(tiles + i_tile * 2 + 1)
    row0 = tl.load(qo_indptr + i_b)
    q_len = tl.load(qo_indptr + i_b + 1) - row0
    seq_len = tl.load(seq_lens + i_b)
    prefix = seq_len - q_len
    p_pages = kv_page_indices + tl.load(kv_indptr + i_b)

    # row r: token m_start + r // HEADS of the request, query head i_h0 + r % HEADS (HEADS = 1: a head's tile)
    o_r = tl.arange(0, BLOCK_M)
    o_m = m_start + o_r // HEADS
    o_h = i_h0 + o_r % HEADS
    m_end = tl.minimum(m_start + BLOCK_M // HEADS, q_len)  # end of the tile's tokens
    m_rows = o_m < m_end
    o_pos = prefix + o_m  # absolute positions of the rows' queries
    o_da = tl.arange(0, DA)
    m_da = o_da < DK
    o_dv = tl.arange(0, BLOCK_DV)
    m_dv = o_dv < DV
    p_q = q + (row0 + o_m)[:, None] * stride_qt + o_h[:, None] * stride_qh
    b_q = tl.load(p_q + o_da[None, :], mask=m_rows[:, None] & m_da[None, :], other=0.0)
    if DB > 0:
        o_db = DA + tl.arange(0, DB)
        m_db = o_db < DK
        b_qb = tl.load(p_q + o_db[None, :], mask=m_rows[:, None] & m_db[None, :], other=0.0)
    else:
        b_qb = b_q  # unused
    # fp8 cache: cached keys/values are used in stored units; the kv head's k scale goes into the score
    # scale, its v scale onto the accumulator (powers of two: exact). New tokens: `attend` reads them
    # unscaled from k_new/v_new; `save` rounds them to their stored fp8 values (times 1 / scale) and
    # uses those, like the cache; `shared` reads them from the cache.
    if KV_FP8:
        k_sc = tl.load(k_scale + i_hk * stride_ksc)
        v_sc = tl.load(v_scale + i_hk * stride_vsc)
        k_inv = tl.math.div_rn(1.0, k_sc)
        v_inv = tl.math.div_rn(1.0, v_sc)
        qk_cache = qk_scale * k_sc
        cap_cache = scale_over_cap * k_sc
    else:
        k_sc = qk_scale  # unused
        v_sc = qk_scale
        k_inv = qk_scale
        v_inv = qk_scale
        qk_cache = qk_scale
        cap_cache = scale_over_cap
    if KV_FP8 and not (SAVE_KV or NEW_FROM_CACHE):  # attend: new tokens in the query dtype, unscaled
        qk_new = qk_scale
        cap_new = scale_over_cap
    else:
        qk_new = qk_cache
        cap_new = cap_cache

    if SPLIT:
        do_save = (i_h0 % G == 0) & is_first  # once per tile: the first split's programs
    else:
        do_save = i_h0 % G == 0
    if SAVE_KV:  # the programs of the first head of each kv group write the tile's new K/V into the cache
        if do_save:
            o_t = m_start + o_r  # one token per row
            m_t = o_t < m_end
            i_slot = tl.load(slot_mapping + row0 + o_t, mask=m_t, other=0)
            p_kc = k_cache + (i_slot // PAGE_SIZE) * stride_kp + (i_slot % PAGE_SIZE) * stride_ks
            p_kc += i_hk * stride_kh
            p_kn = k_new + (row0 + o_t)[:, None] * stride_knt + i_hk * stride_knh
            m_a = m_t[:, None] & m_da[None, :]
            _save_rows(p_kc[:, None] + o_da[None, :], p_kn + o_da[None, :], m_a, k_inv, KV_FP8)
            if DB > 0:
                m_b = m_t[:, None] & m_db[None, :]
                _save_rows(p_kc[:, None] + o_db[None, :], p_kn + o_db[None, :], m_b, k_inv, KV_FP8)
            if not V_FROM_K:
                p_vc = v_cache + (i_slot // PAGE_SIZE) * stride_vp + (i_slot % PAGE_SIZE) * stride_vs
                p_vc += i_hk * stride_vh
                p_vn = v_new + (row0 + o_t)[:, None] * stride_vnt + i_hk * stride_vnh
                m_v = m_t[:, None] & m_dv[None, :]
                _save_rows(p_vc[:, None] + o_dv[None, :], p_vn + o_dv[None, :], m_v, v_inv, KV_FP8)

    # key ranges: [lo, hi) holds every key some row may see; [full_lo, full_hi) the keys all rows see
    p_first = prefix + m_start
    p_last = prefix + m_end - 1
    if IS_CAUSAL:
        hi = p_last + 1
        full_hi = p_first + 1
    else:
        hi = seq_len
        full_hi = seq_len
    if HAS_WINDOW:
        lo = tl.maximum(p_first - window, 0)
        full_lo = tl.maximum(p_last - window, 0)
    else:
        lo = 0
        full_lo = 0
    if SPLIT:  # this program's share of the keys (the masks above still decide what a row sees)
        lo = tl.maximum(lo, n_lo)
        hi = tl.minimum(hi, n_hi)
    if HAS_MASK:
        full_lo = seq_len  # nothing is visible without looking at the mask
        o_mask_row = tl.load(mask_indptr + i_b) + o_m.to(tl.int64) * seq_len
    else:
        o_mask_row = o_m.to(tl.int64)  # unused

    b_acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    b_m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    b_l = tl.zeros([BLOCK_M], tl.float32)
    # the cached prefix [lo, min(hi, prefix)), then the new tokens [max(lo, prefix), hi)
    b_acc, b_m, b_l = _attend_source(
        b_acc, b_m, b_l, b_q, b_qb,
        k_cache, v_cache, p_pages, row0, prefix, lo, tl.minimum(hi, prefix), full_lo, full_hi,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, i_hk,
        o_pos, m_rows, o_mask_row, custom_mask, seq_len, window, qk_cache, cap_cache, cap_log2e, k_inv, v_inv,
        DK, DV, DA, DB, BLOCK_DV, PAGE_SIZE, BLOCK_M, BLOCK_N,
        False, IS_CAUSAL, HAS_WINDOW, HAS_MASK, HAS_SOFTCAP, V_FROM_K, DOT_PRECISION, PRECISE_EXP,
        KV_FP8, False,
    )  # fmt: skip
    if KV_FP8 and not (SAVE_KV or NEW_FROM_CACHE):  # attend: the prefix's values to real units now
        b_acc = b_acc * v_sc
    if NEW_FROM_CACHE:  # shared (cross-layer) KV: the new tokens are in the cache too
        b_acc, b_m, b_l = _attend_source(
            b_acc, b_m, b_l, b_q, b_qb,
            k_cache, v_cache, p_pages, row0, prefix, tl.maximum(lo, prefix), hi, full_lo, full_hi,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, i_hk,
            o_pos, m_rows, o_mask_row, custom_mask, seq_len, window, qk_new, cap_new, cap_log2e, k_inv, v_inv,
            DK, DV, DA, DB, BLOCK_DV, PAGE_SIZE, BLOCK_M, BLOCK_N,
            False, IS_CAUSAL, HAS_WINDOW, HAS_MASK, HAS_SOFTCAP, V_FROM_K, DOT_PRECISION, PRECISE_EXP,
            KV_FP8, False,
        )  # fmt: skip
    else:
        b_acc, b_m, b_l = _attend_source(
            b_acc, b_m, b_l, b_q, b_qb,
            k_new, v_new, p_pages, row0, prefix, tl.maximum(lo, prefix), hi, full_lo, full_hi,
            stride_knt, 0, stride_knh, stride_vnt, 0, stride_vnh, i_hk,
            o_pos, m_rows, o_mask_row, custom_mask, seq_len, window, qk_new, cap_new, cap_log2e, k_inv, v_inv,
            DK, DV, DA, DB, BLOCK_DV, PAGE_SIZE, BLOCK_M, BLOCK_N,
            True, IS_CAUSAL, HAS_WINDOW, HAS_MASK, HAS_SOFTCAP, V_FROM_K, DOT_PRECISION, PRECISE_EXP,
            KV_FP8 if SAVE_KV else 0, SAVE_KV,
        )  # fmt: skip
    if KV_FP8 and (SAVE_KV or NEW_FROM_CACHE):  # every value was summed in stored units
        b_acc = b_acc * v_sc

    if SPLIT:
        if is_final != 0:  # a tile with one split: written like the unsplit path
            _store_final(b_acc, b_m, b_l, sinks, o, lse, row0, o_m, o_h, m_rows, stride_ot, stride_oh, stride_lt,
                         DV, BLOCK_DV, HAS_SINKS, PRECISE_EXP)  # fmt: skip
        else:  # normalised partial output (0 where a row saw no key), max (log2 units) and sum apart;
            # token m of the tile, split s: partial i_part + m * n_split (i_part holds + s); no sink here
            o_w = (i_part + (o_m - m_start) * n_split).to(tl.int64)
            b_part = finish_o(b_acc, b_m, b_l, b_m, False, PRECISE_EXP)
            p_part = part_o + o_w[:, None] * stride_pw + o_h[:, None] * stride_ph + o_dv[None, :]
            tl.store(p_part, b_part, mask=m_rows[:, None] & m_dv[None, :])
            tl.store(part_ml + o_w * stride_mw + o_h, b_m, mask=m_rows)
            tl.store(part_ml + o_w * stride_mw + stride_ml + o_h, b_l, mask=m_rows)
    else:
        _store_final(b_acc, b_m, b_l, sinks, o, lse, row0, o_m, o_h, m_rows, stride_ot, stride_oh, stride_lt,
                     DV, BLOCK_DV, HAS_SINKS, PRECISE_EXP)  # fmt: skip


@triton.jit
def _store_final(
    b_acc, b_m, b_l, sinks, o, lse, row0, o_m, o_h, m_rows, stride_ot, stride_oh, stride_lt,
    DV: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_SINKS: tl.constexpr, PRECISE_EXP: tl.constexpr,
):  # fmt: skip
    """Normalise a tile's softmax state (adding the sink) and store its rows' outputs and LSEs (row:
    token `o_m`, query head `o_h`)."""
    o_dv = tl.arange(0, BLOCK_DV)
    m_dv = o_dv < DV
    if HAS_SINKS:
        b_sink = tl.load(sinks + o_h)
    else:
        b_sink = b_m  # unused
    b_o = finish_o(b_acc, b_m, b_l, b_sink, HAS_SINKS, PRECISE_EXP)
    p_o = o + (row0 + o_m)[:, None] * stride_ot + o_h[:, None] * stride_oh + o_dv[None, :]
    tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_rows[:, None] & m_dv[None, :])
    b_lse = finish_lse(b_m, b_l, b_sink, HAS_SINKS, PRECISE_EXP)
    tl.store(lse + (row0 + o_m) * stride_lt + o_h, b_lse, mask=m_rows)


# ---- launch configuration and schedule ---------------------------------------------------------


@dataclass(frozen=True)
class ExtendConfig:
    """`block_m` query rows (tokens of one head, or tokens x packed heads) by `block_n` keys per step."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def _head_dim_config(dk: int, dv: int, sm: int) -> ExtendConfig:
    s = head_split(dk)
    width = max(s.da + s.db, block_dv(dv))
    stages = 3 if sm >= 80 else 1
    if width <= 64:
        cfg = ExtendConfig(128, 64, 4, stages)
    elif width <= 128:
        cfg = ExtendConfig(128, 64, 8, stages)
    elif width <= 256:
        cfg = ExtendConfig(64, 64, 8, 2 if sm >= 80 else 1)
    else:  # MLA 576/512: a 64 x 512 fp32 accumulator
        cfg = ExtendConfig(64, 32, 8, 2 if sm >= 80 else 1)
    return cfg


def extend_config(dk: int, dv: int, max_q_len: int, sm: int, heads: int = 1) -> ExtendConfig:
    """Tiling by head dims (Hopper-first: 128 x 64 tiles, 8 warps, 3 stages for head dim 128); the
    tile shrinks to the longest request's rows (`heads` rows per token when GQA-packed), at least 16."""
    cfg = _head_dim_config(dk, dv, sm)
    block_m = max(16, min(cfg.block_m, triton.next_power_of_2(max_q_len * heads)))
    return ExtendConfig(block_m, cfg.block_n, cfg.num_warps if block_m >= 64 else 4, cfg.num_stages)


def extend_candidates(dk: int, dv: int, max_q_len: int, sm: int) -> list[ExtendConfig]:
    """Configs worth timing on the device for a long prefill (the heuristic's choice first)."""
    first = extend_config(dk, dv, max_q_len, sm)
    s = head_split(dk)
    width = max(s.da + s.db, block_dv(dv))
    if width <= 128:  # on an H200 at S = 8192, D = 128: 256 x 64 with 16 warps 445 TFLOP/s, 128 x 64 424
        more = [ExtendConfig(256, 64, 16, 3), ExtendConfig(128, 128, 8, 3), ExtendConfig(64, 64, 4, 3)]
    elif width <= 256:
        more = [ExtendConfig(64, 32, 4, 3), ExtendConfig(128, 64, 8, 2)]
    else:
        more = [ExtendConfig(64, 16, 8, 3), ExtendConfig(32, 32, 4, 2)]
    tallest = triton.next_power_of_2(max_q_len)  # no query tile taller than the longest request
    return [first] + [c for c in more if c != first and c.block_m <= tallest]


def shrink_extend_config(c: ExtendConfig) -> ExtendConfig | None:
    """A config needing less shared memory, or None: down to 2 stages, then narrower key blocks (to 32),
    then 1 stage, then shorter query tiles, then the narrowest key blocks."""
    if c.num_stages > 2:
        return replace(c, num_stages=c.num_stages - 1)
    if c.block_n > 32:
        return replace(c, block_n=c.block_n // 2)
    if c.num_stages > 1:
        return replace(c, num_stages=1)
    if c.block_m > 16:
        return replace(c, block_m=c.block_m // 2)
    if c.block_n > 16:
        return replace(c, block_n=c.block_n // 2)
    return None


def group_heads(G: int, block_m: int) -> int:
    """Query heads a GQA-packed tile holds per token: the whole group, or where the group is taller
    than the tile (MLA with 128 heads in 64 rows) its largest divisor that fits."""
    return max(d for d in range(1, min(G, block_m) + 1) if G % d == 0)


# Packed tiles taller than this lost to one-head tiles on an H200 (spec suite, D = 128, G = 4, against
# the unpacked split-KV kernel): <= 32 rows (<= 8 tokens) took 0.29-0.92x the time, 64 rows 0.97-1.37x
# and 128 rows 0.92-1.39x (fewer, taller programs starve the grid at B = 16). kernels/triton/NOTES.md.
PACK_MAX_ROWS = 32


def gqa_packs(x, deterministic: bool = False) -> bool:
    """Whether extend packs the query heads of a kv group into a tile's rows (the automatic rule).

    Yes when G > 1 and the requests are so short that a packed tile (next power of two of the longest
    q_len x the heads it packs) has at most PACK_MAX_ROWS rows, or one token where a kv group alone
    is taller (MLA with 128 heads: 64 heads per tile): one-head tiles would be mostly empty rows of
    the MMA and read K/V once per query head; packed, K/V are read once per group. Longer requests
    keep one-head tiles. Never for `triton-det`: whether a batch packs follows its longest request,
    and packing changes a row's tile (its MMA shape, its tile's key range), so a request's bits would
    follow its batch.
    """
    Hq, Hkv = x.q.shape[1], x.k_cache.shape[2]
    base = _head_dim_config(x.q.shape[2], x.v_cache.shape[-1], arch(x.q.device))
    heads = group_heads(Hq // Hkv, base.block_m)
    rows = triton.next_power_of_2(max(x.q_lens_host) * heads)
    return not deterministic and heads > 1 and rows <= max(PACK_MAX_ROWS, heads)


def default_extend_config(x, deterministic: bool = False, pack: bool | None = None) -> ExtendConfig:
    """`extend_config` for the shapes of `x` and its GQA packing (`pack`; None: `gqa_packs`)."""
    Dk, Dv = x.q.shape[2], x.v_cache.shape[-1]
    G = x.q.shape[1] // x.k_cache.shape[2]
    sm = arch(x.q.device)
    if pack is None:
        pack = gqa_packs(x, deterministic)
    heads = group_heads(G, _head_dim_config(Dk, Dv, sm).block_m) if pack else 1
    return extend_config(Dk, Dv, max(x.q_lens_host), sm, heads)


@dataclass
class ExtendPlan:
    """Everything the timed call needs, built once.

    A tile is `block_m // heads` tokens of one request by `heads` query heads of one kv group
    (`meta["HEADS"]`; 1: unpacked, tokens of one head); a launch runs `Hq // heads` programs per tile.
    Unsplit: `tiles` [N, 2] int32 (request, first query; heaviest tiles first), one launch.
    Split: `tiles` [W, 8] int32 work items (request, first query, first key, end key, first partial,
    splits of the tile, 1 = final, split index), then a merge launch over `merge` [M, 3] int32
    (token row, first partial, end partial) when some tile has several splits.
    """

    tiles: torch.Tensor
    grid: tuple[int]
    meta: dict
    config: ExtendConfig
    splits: int = 1  # the most key splits of any tile (1: the unsplit kernel)
    merge: torch.Tensor | None = None
    rows: torch.Tensor | None = None  # [T] int32 identity: the merge's "qo_indptr" (a merge row is a token)
    part_o: torch.Tensor | None = None  # [P, Hq, Dv] fp32 partial outputs (normalised)
    part_ml: torch.Tensor | None = None  # [P, 2, Hq] fp32 per partial: max (log2 units), sum of exp2
    merge_grid: tuple[int, int] = (0, 0)
    merge_meta: dict | None = None


SPLIT_MIN_KEYS = 2048  # the split path needs a request at least this long (and a grid under one wave)


def _tile_ranges(
    lens: list[int], q_lens: list[int], tokens: int, causal: bool, window: int
) -> list[tuple[int, int, int, int]]:
    """(request, first query, first key, end key) of every tile of `tokens` queries: the keys some
    row of the tile may see; ordered by keys visited, most first (the kernel computes the same range)."""
    tiles = []
    for b, (L, n) in enumerate(zip(lens, q_lens, strict=True)):
        for m0 in range(0, n, tokens):
            last = L - n + min(m0 + tokens, n) - 1
            hi = last + 1 if causal else L
            lo = max(0, L - n + m0 - window) if window >= 0 else 0
            tiles.append((hi - lo, b, m0, lo, hi))
    tiles.sort(key=lambda t: -t[0])
    return [(b, m0, lo, hi) for _, b, m0, lo, hi in tiles]


def query_tiles(lens: list[int], q_lens: list[int], tokens: int, causal: bool, window: int) -> list[tuple[int, int]]:
    """(request, first query) of every tile of `tokens` queries, ordered by keys visited, most first."""
    return [(b, m0) for b, m0, _, _ in _tile_ranges(lens, q_lens, tokens, causal, window)]


def split_chunk(x, cfg: ExtendConfig, heads: int, ranges: list[tuple[int, int, int, int]], splits: int | None,
                num_sms: int) -> int | None:  # fmt: skip
    """Keys per split for the split path, or None for the unsplit kernel.

    `splits=None` (automatic): split only when the unsplit grid (Hq / heads programs x tiles) would fill less
    than one wave of `num_sms` programs and the longest request has at least SPLIT_MIN_KEYS keys; the
    chunk then balances the tiles' keys over WAVES x num_sms programs like decode's planner, with at
    least MIN_SPLIT keys and at least as many keys as the partials a split writes weigh (fp32 rows of
    Hq x Dv per query row, against the split's K/V bytes). `splits=1`: never; `splits=n >= 2`: always
    (tests), the longest tile cut into n equal chunks (not aligned to blocks: edges anywhere work).
    """
    _, Hq, Dk = x.q.shape
    Hkv, Dv = x.k_cache.shape[2], x.v_cache.shape[-1]
    sizes = [hi - lo for _, _, lo, hi in ranges]
    if not sizes:
        return None
    if splits is not None:
        if splits <= 1:
            return None
        return max(1, -(-max(sizes) // splits))
    if Hq // heads * len(ranges) >= num_sms or max(x.seq_lens_host) < SPLIT_MIN_KEYS:
        return None
    rows = min(cfg.block_m // heads, max(x.q_lens_host))  # tokens of a tile
    v_bytes = 0 if v_is_k_prefix(x.k_cache, x.v_cache) else Dv  # absorbed MLA reads V from K
    kv_bytes_per_key = Hkv * (Dk + v_bytes) * x.k_cache.element_size()
    partial_keys = -(-rows * Hq * Dv * 8 // kv_bytes_per_key)
    min_chunk = max(MIN_SPLIT, 2 * cfg.block_n, partial_keys)
    return balanced_chunk(sizes, Hq // heads, cfg.block_n, WAVES * num_sms, min_chunk)


def plan_extend(
    x, *, config: ExtendConfig | None = None, splits: int | None = None, pack: bool | None = None,
    deterministic: bool = False, num_sms: int | None = None,
) -> ExtendPlan:  # fmt: skip
    """Tile schedule and launch parameters for `extend(x, plan)` (host work only, no device sync).

    Args:
        x: `AttentionInputs` of an extend (or tree_verify) case.
        config: tiling (default: `default_extend_config`).
        splits: None: split the key range only in the starved regime (see `split_chunk`); 1: never;
            n >= 2: always, about n splits for the longest tile (forces the split path, for tests).
        pack: None: GQA-pack the tiles by `gqa_packs`; True/False: always/never (tests). A packed
            tile holds `group_heads(G, block_m)` heads per token (split path too).
        deterministic: `triton-det` stays on the unsplit, unpacked path (whether a batch is split or
            packed depends on the whole batch, so its requests' bits would too).
        num_sms: SMs to plan for (default: the device's).
    """
    device = x.q.device
    T, Hq, Dk = x.q.shape
    Hkv, Dv = x.k_cache.shape[2], x.v_cache.shape[-1]
    G = Hq // Hkv
    if pack is None:
        pack = gqa_packs(x, deterministic)
    cfg = config or default_extend_config(x, pack=pack)
    heads = group_heads(G, cfg.block_m) if pack else 1
    split = head_split(Dk)
    has_mask = x.custom_mask is not None
    causal = x.causal and not has_mask
    ranges = _tile_ranges(list(x.seq_lens_host), list(x.q_lens_host), cfg.block_m // heads, causal, x.window)
    chunk = None if deterministic else split_chunk(x, cfg, heads, ranges, splits, num_sms or sm_count(device))
    if x.k_new is None:
        v_from_k = v_is_k_prefix(x.k_cache, x.v_cache)
    else:
        v_from_k = v_is_k_prefix(x.k_cache, x.v_cache) and v_is_k_prefix(x.k_new, x.v_new)
    meta = dict(
        HQ=Hq, G=G, HEADS=heads, DK=Dk, DV=Dv, DA=split.da, DB=split.db, BLOCK_DV=block_dv(Dv),
        PAGE_SIZE=x.k_cache.shape[1], BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        IS_CAUSAL=causal, HAS_WINDOW=x.window >= 0, HAS_MASK=has_mask,
        HAS_SOFTCAP=x.soft_cap > 0, HAS_SINKS=x.sinks is not None,
        NEW_FROM_CACHE=x.k_new is None, SAVE_KV=bool(x.save_kv), V_FROM_K=v_from_k and Dv == split.da,
        DOT_PRECISION=dot_precision(x.q.dtype), PRECISE_EXP=x.q.dtype == torch.float32,
        SPLIT=chunk is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if kv_fp8_code(x.k_cache.dtype):  # absent otherwise: the bf16/fp16/fp32 kernels compile as before
        meta["KV_FP8"] = kv_fp8_code(x.k_cache.dtype)
    if chunk is None:
        tiles_t = torch.tensor([(b, m0) for b, m0, _, _ in ranges], dtype=torch.int32).reshape(-1, 2).to(device)
        return ExtendPlan(tiles_t, (Hq // heads * len(ranges),), meta, cfg)
    return _split_plan(x, cfg, meta, ranges, chunk)


def _split_plan(x, cfg: ExtendConfig, meta: dict, ranges: list, chunk: int) -> ExtendPlan:
    """The split path: every tile's key range cut into `chunk`-key splits (starts at multiples of
    `chunk` past the range's start); a tile with one split writes its output itself, the others
    write partials that one merge launch combines (and adds the sink to)."""
    device = x.q.device
    T, Hq, _ = x.q.shape
    Dv = x.v_cache.shape[-1]
    heads = meta["HEADS"]
    starts = [0]
    for n in x.q_lens_host:
        starts.append(starts[-1] + n)
    items, merge, n_part, most = [], [], 0, 1
    for b, m0, lo, hi in ranges:
        k = max(1, -(-(hi - lo) // chunk))
        most = max(most, k)
        rows = min(cfg.block_m // heads, x.q_lens_host[b] - m0)  # tokens of the tile
        for s in range(k):
            a, e = lo + s * chunk, min(hi, lo + (s + 1) * chunk)
            items.append((b, m0, a, e, n_part + s, k, int(k == 1), s))
        if k > 1:
            merge += [(starts[b] + m0 + m, n_part + m * k, n_part + (m + 1) * k) for m in range(rows)]
            n_part += rows * k
    tiles_t = torch.tensor(items, dtype=torch.int32).to(device)
    n_alloc = max(1, n_part)
    part_o = torch.empty(n_alloc, Hq, Dv, dtype=torch.float32, device=device)
    part_ml = torch.empty(n_alloc, 2, Hq, dtype=torch.float32, device=device)
    bdv = block_dv(Dv)
    merge_meta = dict(  # decode's merge, told that a split may have seen no key
        DV=Dv, BLOCK_DV=bdv, BLOCK_S=16, HAS_SINKS=x.sinks is not None, PRECISE_EXP=x.q.dtype == torch.float32,
        HAS_EMPTY=True, num_warps=4 if bdv >= 256 else 2,
    )  # fmt: skip
    return ExtendPlan(
        tiles_t, (Hq // heads * len(items),), meta, cfg, splits=most,
        merge=torch.tensor(merge, dtype=torch.int32).to(device) if merge else None,
        rows=torch.arange(T, dtype=torch.int32, device=device),
        part_o=part_o, part_ml=part_ml, merge_grid=(len(merge), Hq), merge_meta=merge_meta,
    )  # fmt: skip


def _launches(x, plan: ExtendPlan) -> list[tuple]:
    """(kernel, grid, args, kwargs) of the extend launch and, on the split path with a tile of
    several splits, of the merge."""
    q, kc, vc, o, lse = x.q, x.k_cache, x.v_cache, x.o, x.lse
    kn = x.k_new if x.k_new is not None else kc
    vn = x.v_new if x.v_new is not None else vc
    # tensors a case does not have are never read: any valid pointer stands in for them
    mask = x.custom_mask if x.custom_mask is not None else x.kv_indptr
    mask_indptr = x.mask_indptr if x.mask_indptr is not None else x.kv_indptr
    sinks = x.sinks if x.sinks is not None else lse
    slots = x.slot_mapping if x.slot_mapping is not None else x.kv_indptr
    scale, cap = x.sm_scale, x.soft_cap
    part_o = plan.part_o if plan.part_o is not None else o  # unsplit: never written
    part_ml = plan.part_ml if plan.part_ml is not None else lse
    k_scale, v_scale, stride_ksc, stride_vsc = kv_scale_args(x, lse)
    args = (
        q, kc, vc, kn, vn, x.kv_page_indices, x.kv_indptr, x.qo_indptr, x.seq_lens, plan.tiles,
        mask, mask_indptr, sinks, slots, k_scale, v_scale,
        o, lse, part_o, part_ml,
        scale * LOG2E, scale / cap if cap > 0 else 0.0, cap * LOG2E, x.window,
        q.stride(0), q.stride(1),
        kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2),
        kn.stride(0), kn.stride(1), vn.stride(0), vn.stride(1),
        o.stride(0), o.stride(1), lse.stride(0),
        part_o.stride(0), part_o.stride(1), part_ml.stride(0), part_ml.stride(1), stride_ksc, stride_vsc,
    )  # fmt: skip
    out = [(_extend_kernel, plan.grid, args, plan.meta)]
    if plan.merge is not None:
        out.append(merge_launch(plan.rows, plan, sinks, o, lse))
    return out


def extend(x, plan: ExtendPlan) -> dict[str, torch.Tensor]:
    """Attention of packed new tokens over their paged prefix plus themselves, into `x.o`, `x.lse`.

    Args:
        x: `AttentionInputs`: q `[T, Hq, Dk]` packed by qo_indptr; k_cache/v_cache `[P, page, Hkv, D*]`;
            k_new/v_new `[T, Hkv, D*]` (None: shared KV, read everything from the cache); with
            `save_kv` the new K/V are also written to `slot_mapping [T]`. o `[T, Hq, Dv]`, lse `[T, Hq]`.
        plan: from `plan_extend(x)`.

    Returns:
        `{"o": x.o, "lse": x.lse}`.
    """
    for fn, grid, args, kwargs in _launches(x, plan):
        fn[grid](*args, **kwargs)
    return {"o": x.o, "lse": x.lse}


def bind_extend(x, plan: ExtendPlan) -> Callable[[], dict[str, torch.Tensor]]:
    """`extend(x, plan)` as a zero-argument call with its kernel compiled and arguments bound now."""
    calls = [bind_launch(*launch) for launch in _launches(x, plan)]  # no host sync in the call
    out = {"o": x.o, "lse": x.lse}

    def run():
        for call in calls:
            call()
        return out

    return run


def tuned_extend_config(x) -> tuple[ExtendConfig | None, dict]:
    """On CUDA, for prefills of at least 1024 queries: the fastest of `extend_candidates` on `x`
    (timed now, cached per kernel variant and power-of-two bucket of the longest request: taller
    tiles pay only when there are enough of them). Otherwise (None, {}): the heuristic stands."""
    device = x.q.device
    if not tune.enabled(device) or max(x.q_lens_host) < 1024:
        return None, {}
    _, Hq, Dk = x.q.shape
    Hkv, Dv = x.k_cache.shape[2], x.v_cache.shape[-1]
    key = (
        "extend", Hq // Hkv, Dk, Dv, x.k_cache.shape[1], x.q.dtype, x.k_cache.dtype, x.causal, x.window >= 0,
        x.custom_mask is not None, x.soft_cap > 0, x.sinks is not None, x.k_new is None, bool(x.save_kv),
        triton.next_power_of_2(max(x.q_lens_host)),
    )  # fmt: skip
    cands = extend_candidates(Dk, Dv, max(x.q_lens_host), arch(device))
    return tune.pick(key, cands, lambda cfg: bind_extend(x, plan_extend(x, config=cfg)))
