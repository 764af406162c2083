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
at the first query's window (loads are masked from that key on, so an SWA pool's freed pages before
it, `kv_pool: swa`, are never read). A custom mask (True = visible) replaces causality and masks every
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

import torch
import triton
import triton.language as tl

from attnbench.kernels.triton import tune
from attnbench.kernels.triton.common import (
    LOG2E,
    arch,
    bind_launches,
    exp2_,
    finish_lse,
    finish_o,
    fp8_to,
    kv_scale_args,
    load_tile,
    mma,
    soft_cap_scores,
    to_fp8,
)
from attnbench.kernels.triton.decode import merge_launch
from attnbench.kernels.triton.extend_plan import (
    ExtendConfig,
    ExtendPlan,
    extend_candidates,
    plan_extend,
)


@triton.jit
def _attend_range(
    b_acc, b_m, b_l, b_q, b_qb,
    k_src, v_src, k_desc, v_desc, p_pages, row0, new_start, n_lo, n_hi,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, i_hk,
    o_pos, m_rows, o_mask_row, custom_mask, seq_len, window,
    qk_scale, scale_over_cap, cap_log2e, k_inv, v_inv,
    DK: tl.constexpr, DV: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, BLOCK_DV: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, FROM_NEW: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_SOFTCAP: tl.constexpr, V_FROM_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PRECISE_EXP: tl.constexpr, KV_FP8: tl.constexpr, REQUANT: tl.constexpr, TMA: tl.constexpr = 0,
):  # fmt: skip
    """Online-softmax update of (acc, m, l) over keys [n_lo, n_hi) of one source.

    MASKED: apply bounds and visibility masks; else every key of every block is visible to every row
    (the caller guarantees it), so no mask is computed at all. KV_FP8: the source's K/V are fp8 values
    in stored units (converted to the query dtype, exactly); with REQUANT they are the new tokens in
    the query dtype, rounded here to what the cache stores (`x * inv` to fp8) before use.
    TMA: every block by tensor descriptor (`k_desc`/`v_desc` over `[rows, Hkv * D]`). A masked block's
    box may hold rows outside [n_lo, n_hi): past the request, the next request's rows (or zeros past
    the tensor's end); in the cache, blocks start at multiples of BLOCK_N (one page each: the page
    size is a multiple of BLOCK_N), so a range's first block may begin before n_lo, and slots past a
    sequence may hold NaN. Those rows' scores are masked like every masked key's and their values
    zeroed here, so nothing of them reaches P.V (0 x NaN would).
    """
    ALIGNED: tl.constexpr = TMA and not FROM_NEW  # cache blocks by descriptor: aligned, inside one page
    o_da = tl.arange(0, DA)
    o_dv = tl.arange(0, BLOCK_DV)
    m_da = o_da < DK
    m_dv = o_dv < DV
    if DB > 0:
        o_db = DA + tl.arange(0, DB)
        m_db = o_db < DK
    # paged keys: page indices are loaded one block ahead by hand, so the pipeliner overlaps the K/V
    # copies with the math (with the index load in the same iteration it does not)
    if ALIGNED:  # from the block holding n_lo (none where the range is empty)
        n_first = n_lo // BLOCK_N * BLOCK_N
        n_end = tl.where(n_lo < n_hi, n_hi, n_first)
    else:
        n_first = n_lo
        n_end = n_hi
    o_n = n_lo + tl.arange(0, BLOCK_N)
    if FROM_NEW or TMA:
        i_page_next = o_n  # unused
    else:
        i_page_next = tl.load(p_pages + o_n // PAGE_SIZE, mask=o_n < n_hi, other=0)
    for n0 in tl.range(n_first, n_end, BLOCK_N):
        o_n = n0 + tl.arange(0, BLOCK_N)
        if ALIGNED:
            m_n = (o_n >= n_lo) & (o_n < n_hi)
        else:
            m_n = o_n < n_hi
        if FROM_NEW:  # packed new tokens: row = first row of the request + (position - prefix)
            i_row = (row0 + o_n - new_start).to(tl.int64)
            p_k = k_src + i_row * stride_kp + i_hk * stride_kh
            p_v = v_src + i_row * stride_vp + i_hk * stride_vh
            i_box = row0 + n0 - new_start  # the block's first row (TMA)
        elif TMA:  # paged cache, an aligned block inside one page: its row of the cache as [rows, Hkv * D]
            i_box = tl.load(p_pages + n0 // PAGE_SIZE) * PAGE_SIZE + n0 % PAGE_SIZE
        else:  # paged cache
            i_page = i_page_next.to(tl.int64)
            o_next = o_n + BLOCK_N
            i_page_next = tl.load(p_pages + o_next // PAGE_SIZE, mask=o_next < n_hi, other=0)
            o_slot = o_n % PAGE_SIZE
            p_k = k_src + i_page * stride_kp + o_slot * stride_ks + i_hk * stride_kh
            p_v = v_src + i_page * stride_vp + o_slot * stride_vs + i_hk * stride_vh
        if TMA:
            b_k = k_desc.load([i_box, i_hk * DK])
        else:
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
        elif TMA:
            b_v = v_desc.load([i_box, i_hk * DV])
        else:
            b_v = load_tile(p_v[:, None] + o_dv[None, :], m_n, m_dv, MASKED, BLOCK_DV > DV)
        if TMA and MASKED:  # rows of the box outside the range (another request's, zeros, NaN slots) -> 0
            b_v = tl.where(m_n[:, None], b_v, 0.0)
        if not V_FROM_K:
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
    k_src, v_src, k_desc, v_desc, p_pages, row0, new_start, a, e, full_lo, full_hi,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, i_hk,
    o_pos, m_rows, o_mask_row, custom_mask, seq_len, window, qk_scale, scale_over_cap, cap_log2e,
    k_inv, v_inv,
    DK: tl.constexpr, DV: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, BLOCK_DV: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    FROM_NEW: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, V_FROM_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PRECISE_EXP: tl.constexpr, KV_FP8: tl.constexpr, REQUANT: tl.constexpr, TMA: tl.constexpr = 0,
):  # fmt: skip
    """Keys [a, e) of one source: masked blocks left of `full_lo`, whole unmasked blocks inside
    [full_lo, full_hi), masked blocks for the rest. TMA on the cache: the unmasked blocks start at a
    multiple of BLOCK_N (so each lies inside one page; the masked left loop takes the keys before)."""
    u0 = tl.minimum(tl.maximum(full_lo, a), tl.maximum(e, a))
    if TMA and not FROM_NEW:
        u0 = tl.minimum(tl.cdiv(u0, BLOCK_N) * BLOCK_N, tl.maximum(e, a))
    u1 = u0 + tl.maximum(tl.minimum(full_hi, e) - u0, 0) // BLOCK_N * BLOCK_N
    b_acc, b_m, b_l = _attend_range(
        b_acc, b_m, b_l, b_q, b_qb, k_src, v_src, k_desc, v_desc, p_pages, row0, new_start, a, u0,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, i_hk,
        o_pos, m_rows, o_mask_row, custom_mask, seq_len, window, qk_scale, scale_over_cap, cap_log2e,
        k_inv, v_inv, DK, DV, DA, DB, BLOCK_DV, PAGE_SIZE, BLOCK_M, BLOCK_N,
        True, FROM_NEW, IS_CAUSAL, HAS_WINDOW, HAS_MASK, HAS_SOFTCAP, V_FROM_K, DOT_PRECISION, PRECISE_EXP,
        KV_FP8, REQUANT, TMA,
    )  # fmt: skip
    b_acc, b_m, b_l = _attend_range(
        b_acc, b_m, b_l, b_q, b_qb, k_src, v_src, k_desc, v_desc, p_pages, row0, new_start, u0, u1,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, i_hk,
        o_pos, m_rows, o_mask_row, custom_mask, seq_len, window, qk_scale, scale_over_cap, cap_log2e,
        k_inv, v_inv, DK, DV, DA, DB, BLOCK_DV, PAGE_SIZE, BLOCK_M, BLOCK_N,
        False, FROM_NEW, IS_CAUSAL, HAS_WINDOW, HAS_MASK, HAS_SOFTCAP, V_FROM_K, DOT_PRECISION, PRECISE_EXP,
        KV_FP8, REQUANT, TMA,
    )  # fmt: skip
    b_acc, b_m, b_l = _attend_range(
        b_acc, b_m, b_l, b_q, b_qb, k_src, v_src, k_desc, v_desc, p_pages, row0, new_start, u1, e,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, i_hk,
        o_pos, m_rows, o_mask_row, custom_mask, seq_len, window, qk_scale, scale_over_cap, cap_log2e,
        k_inv, v_inv, DK, DV, DA, DB, BLOCK_DV, PAGE_SIZE, BLOCK_M, BLOCK_N,
        True, FROM_NEW, IS_CAUSAL, HAS_WINDOW, HAS_MASK, HAS_SOFTCAP, V_FROM_K, DOT_PRECISION, PRECISE_EXP,
        KV_FP8, REQUANT, TMA,
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
    # Opt-in variants (ExtendConfig.use_tma, .persistent): passed only where used (None: compiled out)
    k_new_desc=None, v_new_desc=None, k_cache_desc=None, v_cache_desc=None, n_items=None,
    TMA_NEW: tl.constexpr = 0, TMA_CACHE: tl.constexpr = 0, PERSISTENT: tl.constexpr = 0,
):  # fmt: skip
    """One work item (query tile x head or head group [x key split]) per program; PERSISTENT: a grid of
    about one program per SM, program p taking items p, p + grid, ... (`n_items` in all; the work list is
    ordered heaviest first, so each round of the grid takes the heaviest items left)."""
    if PERSISTENT:
        for pid in range(tl.program_id(0), n_items, tl.num_programs(0)):
            _extend_item(
                pid, q, k_cache, v_cache, k_new, v_new, kv_page_indices, kv_indptr, qo_indptr, seq_lens, tiles,
                custom_mask, mask_indptr, sinks, slot_mapping, k_scale, v_scale, o, lse, part_o, part_ml,
                qk_scale, scale_over_cap, cap_log2e, window, stride_qt, stride_qh, stride_kp, stride_ks,
                stride_kh, stride_vp, stride_vs, stride_vh, stride_knt, stride_knh, stride_vnt, stride_vnh,
                stride_ot, stride_oh, stride_lt, stride_pw, stride_ph, stride_mw, stride_ml, stride_ksc,
                stride_vsc, HQ, G, HEADS, DK, DV, DA, DB, BLOCK_DV, PAGE_SIZE, BLOCK_M, BLOCK_N, IS_CAUSAL,
                HAS_WINDOW, HAS_MASK, HAS_SOFTCAP, HAS_SINKS, NEW_FROM_CACHE, SAVE_KV, V_FROM_K, DOT_PRECISION,
                PRECISE_EXP, SPLIT, KV_FP8, k_new_desc, v_new_desc, k_cache_desc, v_cache_desc, TMA_NEW,
                TMA_CACHE,
            )  # fmt: skip
    else:
        _extend_item(
            tl.program_id(0), q, k_cache, v_cache, k_new, v_new, kv_page_indices, kv_indptr, qo_indptr,
            seq_lens, tiles, custom_mask, mask_indptr, sinks, slot_mapping, k_scale, v_scale, o, lse, part_o,
            part_ml, qk_scale, scale_over_cap, cap_log2e, window, stride_qt, stride_qh, stride_kp, stride_ks,
            stride_kh, stride_vp, stride_vs, stride_vh, stride_knt, stride_knh, stride_vnt, stride_vnh,
            stride_ot, stride_oh, stride_lt, stride_pw, stride_ph, stride_mw, stride_ml, stride_ksc, stride_vsc,
            HQ, G, HEADS, DK, DV, DA, DB, BLOCK_DV, PAGE_SIZE, BLOCK_M, BLOCK_N, IS_CAUSAL, HAS_WINDOW,
            HAS_MASK, HAS_SOFTCAP, HAS_SINKS, NEW_FROM_CACHE, SAVE_KV, V_FROM_K, DOT_PRECISION, PRECISE_EXP,
            SPLIT, KV_FP8, k_new_desc, v_new_desc, k_cache_desc, v_cache_desc, TMA_NEW, TMA_CACHE,
        )  # fmt: skip


@triton.jit
def _extend_item(
    pid,
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
    PRECISE_EXP: tl.constexpr, SPLIT: tl.constexpr, KV_FP8: tl.constexpr,
    k_new_desc, v_new_desc, k_cache_desc, v_cache_desc,
    TMA_NEW: tl.constexpr, TMA_CACHE: tl.constexpr,
):  # fmt: skip
    """Work item `pid` (unsplit: query tile pid // (HQ / HEADS), its heads pid % (HQ / HEADS))."""
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
        k_cache, v_cache, k_cache_desc, v_cache_desc, p_pages, row0, prefix, lo, tl.minimum(hi, prefix), full_lo, full_hi,
        stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, i_hk,
        o_pos, m_rows, o_mask_row, custom_mask, seq_len, window, qk_cache, cap_cache, cap_log2e, k_inv, v_inv,
        DK, DV, DA, DB, BLOCK_DV, PAGE_SIZE, BLOCK_M, BLOCK_N,
        False, IS_CAUSAL, HAS_WINDOW, HAS_MASK, HAS_SOFTCAP, V_FROM_K, DOT_PRECISION, PRECISE_EXP,
        KV_FP8, False, TMA_CACHE,
    )  # fmt: skip
    if KV_FP8 and not (SAVE_KV or NEW_FROM_CACHE):  # attend: the prefix's values to real units now
        b_acc = b_acc * v_sc
    if NEW_FROM_CACHE:  # shared (cross-layer) KV: the new tokens are in the cache too
        b_acc, b_m, b_l = _attend_source(
            b_acc, b_m, b_l, b_q, b_qb,
            k_cache, v_cache, k_cache_desc, v_cache_desc, p_pages, row0, prefix, tl.maximum(lo, prefix), hi,
            full_lo, full_hi,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, i_hk,
            o_pos, m_rows, o_mask_row, custom_mask, seq_len, window, qk_new, cap_new, cap_log2e, k_inv, v_inv,
            DK, DV, DA, DB, BLOCK_DV, PAGE_SIZE, BLOCK_M, BLOCK_N,
            False, IS_CAUSAL, HAS_WINDOW, HAS_MASK, HAS_SOFTCAP, V_FROM_K, DOT_PRECISION, PRECISE_EXP,
            KV_FP8, False, TMA_CACHE,
        )  # fmt: skip
    else:
        b_acc, b_m, b_l = _attend_source(
            b_acc, b_m, b_l, b_q, b_qb,
            k_new, v_new, k_new_desc, v_new_desc, p_pages, row0, prefix, tl.maximum(lo, prefix), hi, full_lo, full_hi,
            stride_knt, 0, stride_knh, stride_vnt, 0, stride_vnh, i_hk,
            o_pos, m_rows, o_mask_row, custom_mask, seq_len, window, qk_new, cap_new, cap_log2e, k_inv, v_inv,
            DK, DV, DA, DB, BLOCK_DV, PAGE_SIZE, BLOCK_M, BLOCK_N,
            True, IS_CAUSAL, HAS_WINDOW, HAS_MASK, HAS_SOFTCAP, V_FROM_K, DOT_PRECISION, PRECISE_EXP,
            KV_FP8 if SAVE_KV else 0, SAVE_KV, TMA_NEW,
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
    out = [(_extend_kernel, plan.grid, args, plan.meta | plan.extra)]
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
    return bind_launches(_launches(x, plan), {"o": x.o, "lse": x.lse})


def tuned_extend_config(x, use_tma: bool = False, persistent: bool = False) -> tuple[ExtendConfig | None, dict]:
    """On CUDA, for prefills of at least 1024 queries: the fastest of `extend_candidates` on `x`
    (timed now, cached per kernel variant and power-of-two bucket of the longest request: taller
    tiles pay only when there are enough of them); `use_tma`, `persistent`: among the candidates
    with that variant. Otherwise (None, {}): the heuristic stands."""
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
    if use_tma or persistent:  # absent otherwise: the default tuning's cache keys as before
        key += (use_tma, persistent)
    cands = extend_candidates(Dk, Dv, max(x.q_lens_host), arch(device), use_tma=use_tma, persistent=persistent)
    return tune.pick(key, cands, lambda cfg: bind_extend(x, plan_extend(x, config=cfg)))
