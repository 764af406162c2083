"""Our paged decode kernel in CuTe DSL: split-KV flash decoding with an LSE merge (SIMT).

Contract (attnbench.ops.attention, `decode`): q `[B, Hq, D]`, the canonical paged cache
`k_cache/v_cache [P, page_size, Hkv, D]` with a CSR page table (`kv_indptr [B+1]`,
`kv_page_indices`), `seq_lens`; outputs o `[B, Hq, D]` (case dtype) and lse `[B, Hq]` fp32 natural
log. GQA/MQA/MHA (q head h reads kv head h // (Hq / Hkv)), head dims 64 and 128, bf16/fp16, any
page size, sliding window (keys [L-1-W, L)), soft cap, sinks.

Schedule (host, `plan_splits` in decode_plan.py, pure Python): each request's visible keys are cut into splits so that
about `waves` waves of CTAs fill the GPU (`DecodeConfig`); a work item is (request, first key, end key, final flag).

Stage 1 (`decode_split_kernel`): one CTA of 128 threads (4 warps) per (work item, kv head, block of
HB query heads sharing that kv head). Each warp walks a contiguous quarter of the split's keys. A key
row of D elements is read by a lane group of D / (8 VPL) lanes, VPL 128-bit loads a lane (8 bf16/fp16
each), so a warp reads several keys per instruction (4 at D = 128 with VPL = 2); every lane group
takes U keys an iteration (`schedule`). The K/V rows stream through a cp.async ring of S stages a
warp in shared memory (S - 1 iterations in flight without holding registers; with S = 0 they are
loaded straight into registers, optionally double-buffered). Scores are partial dot products reduced
over the lane group by butterfly shuffles, in log2 units (`q * sm_scale * log2(e)`, or
`cap * log2(e) * tanh(q.k * sm_scale / cap)` with a soft cap), with an online softmax in fp32 that
rescales once per iteration for the U keys. Keys past the warp's range are clamped to its last key
(a valid row: the cache outside it may hold NaN) and masked by starting their dot products at NEG.
The lane groups of a warp merge by butterflies, the 4 warps through shared memory; a request with
one split writes o and lse (with the sink added), otherwise the split writes its normalised partial
output and its LSE (log2 units) to scratch. q, k_cache and v_cache must be 16-byte aligned with
strides in multiples of 8 elements (checked on the host); a contiguous cache is compiled with static
strides.

Stage 2 (`decode_merge_kernel`): one CTA of D threads per (split request, q head) merges the
partials by their LSEs, adds the sink, writes o and the natural-log lse.
"""

import torch

from attnbench.kernels.cute.common import cached_compile, check_rows_aligned, compact, dynamic, stream_of
from attnbench.kernels.cute.decode_plan import (
    DEFAULT,
    LAZY,
    LN2,
    LOG2E,
    NEG,
    THREADS,
    VEC,
    WARPS,
    DecodeConfig,
    heads_per_cta,
    make_plan,
    schedule,
    score_multipliers,
)


def _build(
    HB: int, G: int, D: int, PAGE: int, HKV: int, q_mul: float, post_mul: float, cap: bool, sinks: bool,
    U: int, PIPE: bool, MIN_CTAS: int, VPL: int, S: int,
):  # fmt: skip
    """Defines both kernels and their launchers for one static configuration (cutlass imported here)."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import cpasync

    F32 = cutlass.Float32
    NUM_HB = G // HB
    N_OUT = HB * D
    NE = VPL * VEC  # row elements a lane holds (VPL 128-bit loads of VEC elements)
    LPK = D // NE  # lanes per key row
    KPW = 32 // LPK  # keys a warp reads per instruction
    NBUF = 2 if PIPE and S == 0 else 1  # K/V register buffers
    NPH = NBUF  # iterations a trip of the main loop
    CH = U * 2 * VPL  # 16-byte chunks a lane copies an iteration (cp.async path)
    STEP = KPW * U  # keys a warp covers per loop iteration
    RED = [LPK >> (k + 1) for k in range(LPK.bit_length() - 1)]  # butterfly offsets inside a group
    GROUPS = [16 >> k for k in range(KPW.bit_length() - 1)]  # offsets across the groups of a warp

    @cute.kernel
    def decode_split_kernel(
        mQ: cute.Tensor,  # [B, Hq, D]
        mKc: cute.Tensor,  # [P, PAGE, Hkv, D]
        mVc: cute.Tensor,  # [P, PAGE, Hkv, D]
        mPages: cute.Tensor,  # [nnz] int32
        mIndptr: cute.Tensor,  # [B+1] int32
        mWork: cute.Tensor,  # [W, 4] int32
        mSinks: cute.Tensor,  # [Hq] fp32 (or a dummy)
        mO: cute.Tensor,  # [B, Hq, D]
        mLse: cute.Tensor,  # [B, Hq] fp32
        mPartO: cute.Tensor,  # [W, Hq, D] fp32
        mPartL: cute.Tensor,  # [W, Hq] fp32
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        lane = tidx % 32
        warp = tidx // 32
        i_kg = lane // LPK  # which key of the warp's instruction this lane's group reads
        i_li = lane % LPK  # which VEC-slice of the row this lane holds
        i_hk = bidy // NUM_HB
        h0 = i_hk * G + (bidy % NUM_HB) * HB  # first q head of this CTA

        b = mWork[bidx, 0]
        start = mWork[bidx, 1]
        end = mWork[bidx, 2]
        final = mWork[bidx, 3]
        page_base = mIndptr[b]

        smem = cutlass.utils.SmemAllocator()
        sM = smem.allocate_tensor(F32, cute.make_layout((WARPS * HB,)), 16)
        sL = smem.allocate_tensor(F32, cute.make_layout((WARPS * HB,)), 16)
        sAcc = smem.allocate_tensor(F32, cute.make_layout((WARPS * HB * D,)), 16)

        dt = mKc.element_type
        if cutlass.const_expr(S > 0):
            atom = cute.make_copy_atom(
                cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dt, num_bits_per_copy=128
            )
            sKV = smem.allocate_tensor(dt, cute.make_layout((S * WARPS * CH * 32 * VEC,)), 16)
        # index of a lane's 16-byte chunk in the ring: (stage, warp, key u, K or V, chunk v, lane)
        chunk = lambda st, u, kv, v: ((st * WARPS + warp) * CH + (u * 2 + kv) * VPL + v) * 32 + lane
        r_qb = cute.make_rmem_tensor(cute.make_layout((VEC,), stride=(1,)), mQ.element_type)
        vec = lambda: cute.make_rmem_tensor(cute.make_layout((VEC,), stride=(1,)), dt)
        r_kb = [[[vec() for _ in range(VPL)] for _ in range(U)] for _ in range(NBUF)]  # [buffer][key][chunk]
        r_vb = [[[vec() for _ in range(VPL)] for _ in range(U)] for _ in range(NBUF)]
        r_q = cute.make_rmem_tensor(cute.make_layout((HB * NE,), stride=(1,)), F32)
        r_acc = cute.make_rmem_tensor(cute.make_layout((HB * NE,), stride=(1,)), F32)
        r_kf = cute.make_rmem_tensor(cute.make_layout((NE,), stride=(1,)), F32)
        r_s = cute.make_rmem_tensor(cute.make_layout((U * HB,), stride=(1,)), F32)
        r_b = cute.make_rmem_tensor(cute.make_layout((U,), stride=(1,)), F32)
        r_m = cute.make_rmem_tensor(cute.make_layout((HB,), stride=(1,)), F32)
        r_l = cute.make_rmem_tensor(cute.make_layout((HB,), stride=(1,)), F32)
        r_a = cute.make_rmem_tensor(cute.make_layout((HB,), stride=(1,)), F32)
        r_f = cute.make_rmem_tensor(cute.make_layout((1,), stride=(1,)), F32)

        # lane element e = v * VEC + i of a row is dim (v * LPK + i_li) * VEC + i: chunk v of the
        # lane group's VPL 128-bit loads, each instruction reading LPK * 16 contiguous bytes
        for g in cutlass.range_constexpr(HB):
            r_m[g] = F32(NEG)
            r_l[g] = F32(0.0)
            for v in cutlass.range_constexpr(VPL):
                cute.autovec_copy(cute.local_tile(mQ[b, h0 + g, None], (VEC,), (v * LPK + i_li,)), r_qb)
                for i in cutlass.range_constexpr(VEC):
                    r_q[g * NE + v * VEC + i] = F32(r_qb[i]) * q_mul
                    r_acc[g * NE + v * VEC + i] = F32(0.0)

        # each warp walks a contiguous quarter of the split, STEP keys an iteration: key
        # lo + it * STEP + u * KPW + i_kg goes to lane group i_kg. Keys past hi are clamped to hi - 1 (a
        # valid row: the cache outside the sequence may hold NaN) and masked: their partial dot
        # products start at NEG, so their scores are below LPK * NEG and weigh exp2(< NEG - m) = 0.
        # With PIPE, the K/V rows of iteration it + 1 are loaded into the other register buffer
        # before iteration it is computed (two iterations per trip of the loop).
        per = (end - start + WARPS - 1) // WARPS
        lo = start + warp * per
        hi = cutlass.min(lo + per, end)
        n_it = (hi - lo + STEP - 1) // STEP
        if cutlass.const_expr(S > 0):
            # cp.async ring of S stages a warp in shared memory: iteration it lands in stage it % S;
            # each lane copies (and later reads back) its own 16-byte chunks, so no barrier is needed
            for st in cutlass.range_constexpr(S - 1):
                if st < n_it:
                    for u in cutlass.range_constexpr(U):
                        j_as = cutlass.min(lo + st * STEP + i_kg + u * KPW, hi - 1)
                        pg_as = cutlass.Int64(mPages[page_base + j_as // PAGE])
                        for v in cutlass.range_constexpr(VPL):
                            gk_as = cute.local_tile(mKc[pg_as, j_as % PAGE, i_hk, None], (VEC,), (v * LPK + i_li,))
                            gv_as = cute.local_tile(mVc[pg_as, j_as % PAGE, i_hk, None], (VEC,), (v * LPK + i_li,))
                            cute.copy(atom, gk_as, cute.local_tile(sKV, (VEC,), (chunk(st, u, 0, v),)))
                            cute.copy(atom, gv_as, cute.local_tile(sKV, (VEC,), (chunk(st, u, 1, v),)))
                cute.arch.cp_async_commit_group()
        if cutlass.const_expr(PIPE and S == 0):
            for u in cutlass.range_constexpr(U):
                j_pf = cutlass.min(lo + i_kg + u * KPW, hi - 1)
                pg_pf = cutlass.Int64(mPages[page_base + j_pf // PAGE])
                for v in cutlass.range_constexpr(VPL):
                    # the second buffer feeds the masked, all-padding half trip of an odd n_it before
                    # it was ever loaded: zeros, not stale registers (0 * NaN would poison the sums)
                    r_kb[1][u][v].fill(0.0)
                    r_vb[1][u][v].fill(0.0)
                    gk_pf = cute.local_tile(mKc[pg_pf, j_pf % PAGE, i_hk, None], (VEC,), (v * LPK + i_li,))
                    gv_pf = cute.local_tile(mVc[pg_pf, j_pf % PAGE, i_hk, None], (VEC,), (v * LPK + i_li,))
                    cute.autovec_copy(gk_pf, r_kb[0][u][v])
                    cute.autovec_copy(gv_pf, r_vb[0][u][v])
        for trip in cutlass.range(0, (n_it + NPH - 1) // NPH, unroll=1):
            for ph in cutlass.range_constexpr(NPH):
                it = trip * NPH + ph
                j0 = lo + it * STEP + i_kg
                cur = ph
                if cutlass.const_expr(S > 0):
                    nx = it + S - 1
                    if nx < n_it:
                        st_nx = nx % S
                        for u in cutlass.range_constexpr(U):
                            j_an = cutlass.min(j0 + (S - 1) * STEP + u * KPW, hi - 1)
                            pg_an = cutlass.Int64(mPages[page_base + j_an // PAGE])
                            for v in cutlass.range_constexpr(VPL):
                                gk_an = cute.local_tile(mKc[pg_an, j_an % PAGE, i_hk, None], (VEC,), (v * LPK + i_li,))
                                gv_an = cute.local_tile(mVc[pg_an, j_an % PAGE, i_hk, None], (VEC,), (v * LPK + i_li,))
                                cute.copy(atom, gk_an, cute.local_tile(sKV, (VEC,), (chunk(st_nx, u, 0, v),)))
                                cute.copy(atom, gv_an, cute.local_tile(sKV, (VEC,), (chunk(st_nx, u, 1, v),)))
                    cute.arch.cp_async_commit_group()
                    cute.arch.cp_async_wait_group(S - 1)
                    st_cur = it % S
                    for u in cutlass.range_constexpr(U):
                        for v in cutlass.range_constexpr(VPL):
                            cute.autovec_copy(cute.local_tile(sKV, (VEC,), (chunk(st_cur, u, 0, v),)), r_kb[0][u][v])
                            cute.autovec_copy(cute.local_tile(sKV, (VEC,), (chunk(st_cur, u, 1, v),)), r_vb[0][u][v])
                elif cutlass.const_expr(PIPE):
                    if it + 1 < n_it:
                        for u in cutlass.range_constexpr(U):
                            j_nx = cutlass.min(j0 + STEP + u * KPW, hi - 1)
                            pg_nx = cutlass.Int64(mPages[page_base + j_nx // PAGE])
                            for v in cutlass.range_constexpr(VPL):
                                gk_nx = cute.local_tile(mKc[pg_nx, j_nx % PAGE, i_hk, None], (VEC,), (v * LPK + i_li,))
                                gv_nx = cute.local_tile(mVc[pg_nx, j_nx % PAGE, i_hk, None], (VEC,), (v * LPK + i_li,))
                                cute.autovec_copy(gk_nx, r_kb[1 - ph][u][v])
                                cute.autovec_copy(gv_nx, r_vb[1 - ph][u][v])
                else:
                    for u in cutlass.range_constexpr(U):
                        j_now = cutlass.min(j0 + u * KPW, hi - 1)
                        pg_now = cutlass.Int64(mPages[page_base + j_now // PAGE])
                        for v in cutlass.range_constexpr(VPL):
                            gk_now = cute.local_tile(mKc[pg_now, j_now % PAGE, i_hk, None], (VEC,), (v * LPK + i_li,))
                            gv_now = cute.local_tile(mVc[pg_now, j_now % PAGE, i_hk, None], (VEC,), (v * LPK + i_li,))
                            cute.autovec_copy(gk_now, r_kb[0][u][v])
                            cute.autovec_copy(gv_now, r_vb[0][u][v])
                for u in cutlass.range_constexpr(U):
                    r_b[u] = F32(0.0)
                    if j0 + u * KPW >= hi:
                        r_b[u] = F32(NEG)
                for u in cutlass.range_constexpr(U):
                    for v in cutlass.range_constexpr(VPL):
                        for i in cutlass.range_constexpr(VEC):
                            r_kf[v * VEC + i] = F32(r_kb[cur][u][v][i])
                    for g in cutlass.range_constexpr(HB):
                        s = F32(0.0)
                        if cutlass.const_expr(not cap):
                            s = r_b[u]
                        for e in cutlass.range_constexpr(NE):
                            s += r_q[g * NE + e] * r_kf[e]
                        for off in RED:
                            s += cute.arch.shuffle_sync_bfly(s, offset=off, mask=-1, mask_and_clamp=31)
                        if cutlass.const_expr(cap):
                            s = cute.math.tanh(s, fastmath=False) * post_mul + r_b[u] * 2.0
                        r_s[u * HB + g] = s
                # online softmax over the U keys at once. Lazy rescaling: the running max a head's
                # weights are taken against (r_m) moves only when a score exceeds it by more than
                # LAZY (log2 units; weights stay below 2^LAZY), so the accumulators are rescaled in
                # the rare iterations where some head's max moved (a branch, not 64 multiplies)
                r_f[0] = F32(0.0)
                for g in cutlass.range_constexpr(HB):
                    m_c = r_m[g]
                    for u in cutlass.range_constexpr(U):
                        m_c = cute.arch.fmax(m_c, r_s[u * HB + g])
                    r_a[g] = F32(1.0)
                    if m_c > r_m[g] + LAZY:
                        r_a[g] = cute.math.exp2(r_m[g] - m_c, fastmath=True)
                        r_m[g] = m_c
                        r_f[0] = F32(1.0)
                if r_f[0] > 0.0:
                    for g in cutlass.range_constexpr(HB):
                        r_l[g] = r_l[g] * r_a[g]
                        for e in cutlass.range_constexpr(NE):
                            r_acc[g * NE + e] = r_acc[g * NE + e] * r_a[g]
                for g in cutlass.range_constexpr(HB):
                    l_new = r_l[g]
                    for u in cutlass.range_constexpr(U):
                        p = cute.math.exp2(r_s[u * HB + g] - r_m[g], fastmath=True)
                        r_s[u * HB + g] = p
                        l_new += p
                    r_l[g] = l_new
                for e in cutlass.range_constexpr(NE):
                    for u in cutlass.range_constexpr(U):
                        vv = F32(r_vb[cur][u][e // VEC][e % VEC])
                        for g in cutlass.range_constexpr(HB):
                            r_acc[g * NE + e] = r_acc[g * NE + e] + r_s[u * HB + g] * vv

        # merge the lane groups of each warp (butterflies across groups), then the 4 warps in smem
        for off in GROUPS:
            for g in cutlass.range_constexpr(HB):
                m_o = cute.arch.shuffle_sync_bfly(r_m[g], offset=off, mask=-1, mask_and_clamp=31)
                l_o = cute.arch.shuffle_sync_bfly(r_l[g], offset=off, mask=-1, mask_and_clamp=31)
                m_n = cute.arch.fmax(r_m[g], m_o)
                c_me = cute.math.exp2(r_m[g] - m_n, fastmath=True)
                c_o = cute.math.exp2(m_o - m_n, fastmath=True)
                r_l[g] = r_l[g] * c_me + l_o * c_o
                r_m[g] = m_n
                for e in cutlass.range_constexpr(NE):
                    a_o = cute.arch.shuffle_sync_bfly(r_acc[g * NE + e], offset=off, mask=-1, mask_and_clamp=31)
                    r_acc[g * NE + e] = r_acc[g * NE + e] * c_me + a_o * c_o
        if i_kg == 0:
            for g in cutlass.range_constexpr(HB):
                if i_li == 0:
                    sM[warp * HB + g] = r_m[g]
                    sL[warp * HB + g] = r_l[g]
                for v in cutlass.range_constexpr(VPL):
                    for i in cutlass.range_constexpr(VEC):
                        sAcc[(warp * HB + g) * D + (v * LPK + i_li) * VEC + i] = r_acc[g * NE + v * VEC + i]
        cute.arch.barrier()

        for t in cutlass.range_constexpr((N_OUT + THREADS - 1) // THREADS):
            e = tidx + THREADS * t
            if e < N_OUT:
                g = e // D
                d = e % D
                mx = F32(NEG)
                for w in cutlass.range_constexpr(WARPS):
                    mx = cute.arch.fmax(mx, sM[w * HB + g])
                tot_l = F32(0.0)
                tot_o = F32(0.0)
                for w in cutlass.range_constexpr(WARPS):
                    wgt = cute.math.exp2(sM[w * HB + g] - mx, fastmath=True)
                    tot_l += sL[w * HB + g] * wgt
                    tot_o += sAcc[(w * HB + g) * D + d] * wgt
                h = h0 + g
                if final != 0:
                    if cutlass.const_expr(sinks):
                        sk = mSinks[h] * LOG2E
                        mx2 = cute.arch.fmax(mx, sk)
                        c = cute.math.exp2(mx - mx2, fastmath=True)
                        l2 = tot_l * c + cute.math.exp2(sk - mx2, fastmath=True)
                        mO[b, h, d] = (tot_o * c / l2).to(mO.element_type)
                        if d == 0:
                            mLse[b, h] = (mx2 + cute.math.log2(l2, fastmath=False)) * LN2
                    else:
                        mO[b, h, d] = (tot_o / tot_l).to(mO.element_type)
                        if d == 0:
                            mLse[b, h] = (mx + cute.math.log2(tot_l, fastmath=False)) * LN2
                else:
                    mPartO[bidx, h, d] = tot_o / tot_l
                    if d == 0:
                        mPartL[bidx, h] = mx + cute.math.log2(tot_l, fastmath=False)

    @cute.kernel
    def decode_merge_kernel(
        mMerge: cute.Tensor,  # [M, 3] int32
        mSinks: cute.Tensor,
        mPartO: cute.Tensor,
        mPartL: cute.Tensor,
        mO: cute.Tensor,
        mLse: cute.Tensor,
    ):
        d, _, _ = cute.arch.thread_idx()
        r, h, _ = cute.arch.block_idx()
        b = mMerge[r, 0]
        w_start = mMerge[r, 1]
        w_end = mMerge[r, 2]
        r_s = cute.make_rmem_tensor(cute.make_layout((3,), stride=(1,)), F32)
        r_s[0] = F32(NEG)
        r_s[1] = F32(0.0)
        r_s[2] = F32(0.0)
        for w in cutlass.range(w_start, w_end, unroll=1):
            r_s[0] = cute.arch.fmax(r_s[0], mPartL[w, h])
        if cutlass.const_expr(sinks):
            r_s[0] = cute.arch.fmax(r_s[0], mSinks[h] * LOG2E)
        for w in cutlass.range(w_start, w_end, unroll=1):
            wgt = cute.math.exp2(mPartL[w, h] - r_s[0], fastmath=True)
            r_s[1] = r_s[1] + wgt
            r_s[2] = r_s[2] + wgt * mPartO[w, h, d]
        if cutlass.const_expr(sinks):
            r_s[1] = r_s[1] + cute.math.exp2(mSinks[h] * LOG2E - r_s[0], fastmath=True)
        mO[b, h, d] = (r_s[2] / r_s[1]).to(mO.element_type)
        if d == 0:
            mLse[b, h] = (r_s[0] + cute.math.log2(r_s[1], fastmath=False)) * LN2

    def aligned_rows(t):
        """`t` with every stride but the last declared a multiple of 16 bytes (128-bit row slices)."""
        per16 = 128 // t.element_type.width
        stride = tuple(st if isinstance(st, int) else cute.assume(st, divby=per16) for st in t.stride[:-1])
        stride = stride + (t.stride[-1],)
        return cute.make_tensor(t.iterator, cute.make_layout(t.shape, stride=stride))

    @cute.jit
    def split_launch(
        mQ: cute.Tensor,
        mKc: cute.Tensor,
        mVc: cute.Tensor,
        mPages: cute.Tensor,
        mIndptr: cute.Tensor,
        mWork: cute.Tensor,
        mSinks: cute.Tensor,
        mO: cute.Tensor,
        mLse: cute.Tensor,
        mPartO: cute.Tensor,
        mPartL: cute.Tensor,
        stream: cuda.CUstream,
    ):
        W = cute.size(mWork, mode=[0])
        mQ, mKc, mVc = [aligned_rows(t) for t in (mQ, mKc, mVc)]
        bounds = dict(min_blocks_per_mp=MIN_CTAS, max_number_threads=[THREADS, 1, 1]) if MIN_CTAS else {}
        decode_split_kernel(mQ, mKc, mVc, mPages, mIndptr, mWork, mSinks, mO, mLse, mPartO, mPartL).launch(
            grid=[W, HKV * NUM_HB, 1], block=[THREADS, 1, 1], stream=stream, **bounds
        )

    @cute.jit
    def merge_launch(
        mMerge: cute.Tensor,
        mSinks: cute.Tensor,
        mPartO: cute.Tensor,
        mPartL: cute.Tensor,
        mO: cute.Tensor,
        mLse: cute.Tensor,
        stream: cuda.CUstream,
    ):
        M = cute.size(mMerge, mode=[0])
        Hq = cute.size(mO, mode=[1])
        decode_merge_kernel(mMerge, mSinks, mPartO, mPartL, mO, mLse).launch(
            grid=[M, Hq, 1], block=[D, 1, 1], stream=stream
        )

    return split_launch, merge_launch


def prepare(case, x, config: DecodeConfig | None = None):
    """The timed closure of our CuTe decode on `x` with the schedule `config` (None: DEFAULT): plan,
    scratch and compilation happen here."""
    import cutlass.cute as cute

    config = config or DEFAULT

    device = x.q.device
    B, Hq, D = x.q.shape
    if any(n != 1 for n in x.q_lens_host) or B != len(x.seq_lens_host):
        raise ValueError("decode takes exactly one query per request")
    Hkv, PAGE = x.k_cache.shape[2], x.k_cache.shape[1]
    G = Hq // Hkv
    HB = heads_per_cta(G)
    plan = make_plan(x, torch.cuda.get_device_properties(device).multi_processor_count, config)
    q_mul, post_mul = score_multipliers(x.sm_scale, x.soft_cap)
    has_sinks = x.sinks is not None
    sinks = x.sinks if has_sinks else torch.zeros(1, dtype=torch.float32, device=device)
    vpl, U, pipe, stages = schedule(HB, config)
    static = (HB, G, D, PAGE, Hkv, q_mul, post_mul, x.soft_cap > 0, has_sinks, U, pipe, config.min_ctas, vpl, stages)
    cache_compact = x.k_cache.is_contiguous() and x.v_cache.is_contiguous()
    key = ("decode", x.q.dtype, cache_compact, *static)
    stream = stream_of(device)
    split_args = (
        x.q, x.k_cache, x.v_cache, x.kv_page_indices, x.kv_indptr, plan.work, sinks, x.o, x.lse,
        plan.part_o, plan.part_lse,
    )  # fmt: skip

    def marked(i, t):
        """q aligned; a contiguous cache with static strides (only the page count dynamic)."""
        if i in (1, 2) and cache_compact:
            return compact(t, 16)
        return dynamic(t, 16) if i < 3 else dynamic(t)

    def build():
        split_launch, merge_launch = _build(*static)
        split = cute.compile(
            split_launch, *[marked(i, t) for i, t in enumerate(split_args)], stream,
            options="--enable-tvm-ffi",
        )  # fmt: skip
        merge_args = (plan.merge if plan.merge is not None else plan.work[:1, :3].contiguous(),
                      sinks, plan.part_o, plan.part_lse, x.o, x.lse)  # fmt: skip
        merge = cute.compile(merge_launch, *[dynamic(t) for t in merge_args], stream, options="--enable-tvm-ffi")
        return split, merge

    for t in split_args[:3]:  # every call, not only the compiling one: the kernel loads 128-bit rows
        check_rows_aligned(t, 16)
    (split_fn, merge_fn), compile_s, compiled_how = cached_compile(key, build)
    merge_args = (plan.merge, sinks, plan.part_o, plan.part_lse, x.o, x.lse) if plan.merge is not None else None
    out = {"o": x.o, "lse": x.lse}

    def run():
        s = stream_of(device)
        split_fn(*split_args, s)
        if merge_args is not None:
            merge_fn(*merge_args, s)
        return out

    run.info = {
        "compile_s": compile_s,
        "jit_s": compile_s,
        "compile": compiled_how,
        "work_items": int(plan.work.shape[0]),
        "max_splits": plan.splits,
        "heads_per_cta": HB,
        "variant": f"SIMT split-KV, 128-bit rows: CTA per (split, kv head, {HB} q heads), "
        f"{vpl} 128-bit loads a lane per row, {U} keys a lane group an iteration"
        + (", double-buffered" if pipe else "")
        + (f", {stages}-stage cp.async ring" if stages else "")
        + (" + LSE merge" if merge_args is not None else ""),
    }
    return run
