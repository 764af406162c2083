"""Our GDN decode kernel in CuTe DSL: one recurrent step per request over the fp32 state pool.

Contract (attnbench.ops.gdn, `gdn_decode`): q, k `[B, H, K]`, v `[B, HV, V]` (case dtype, any row
strides: packed decode passes views of mixed_qkv), raw gates a, b `[B, HV]`, A_log `[HV]` fp32,
dt_bias `[HV]`, pool `[N, HV, K, V]` fp32 updated in place at `state_indices [B]` (negative =
padding: the pool is neither read nor written and the output rows are zeros), o `[B, HV, V]`.

Kernel (SIMT): one CTA per (block of BV value columns, request, v-head), the column blocks of one
head launched side by side. A thread holds RPT = 8 contiguous state rows x VEC = 4 columns (one
128-bit load and store a row), BV / 4 lanes cover a row segment, so a CTA of K * BV / 32 threads
(128 at BV = 32) holds its K x BV slice of the state in registers (32 values a thread). The state
loads are issued first, before q/k/v and the gates are read. q and k go through shared memory; every
warp reduces the L2 norms itself (butterfly shuffles) and every thread computes the gates itself:

    g = -exp(A_log) * softplus(a + dt_bias)   softplus = log(1 + exp(x)), x itself above 20
    beta = sigmoid(b)
    S = exp(g) S;  u = beta (v - S^T k^);  S = S + k^ u^T;  o = S^T (q^ * scale)

The two column sums (S^T k^ and S^T q^) are reduced over the rows of a warp by butterflies, then over
the warps through shared memory. The pool must be 16-byte aligned with strides in multiples of 4
(checked on the host); q/k/v are read with scalar loads (any strides).
"""

import torch

from attnbench.kernels.cute.common import cached_compile, check_rows_aligned, dynamic, stream_of

BV = 32  # value columns per CTA
VEC = 4  # fp32 state values per 128-bit load/store
RPT = 8  # contiguous state rows per thread
K_ROWS = 128  # state rows (K)
L2_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0
SUPPORTED_DIMS = (128, 128)  # (K, V)


# ---- pure-PyTorch twin of the in-kernel math (CPU-testable) ----------------------------------------
def gates_twin(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor):
    """(decay exp(g), beta) in float32 exactly as the kernel forms them (log(1 + exp(x)), threshold 20)."""
    x = a.float() + dt_bias.float()
    sp = torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log(1.0 + torch.exp(torch.clamp(x, max=SOFTPLUS_THRESHOLD))))
    g = -torch.exp(A_log.float()) * sp
    return torch.exp(g), 1.0 / (1.0 + torch.exp(-b.float()))


def grid(batch: int, heads_v: int, head_dim_v: int, bv: int = BV) -> tuple[int, int, int]:
    """CTAs: one per block of `bv` value columns along x (a head's blocks launch together), one per
    (request, v-head) along y."""
    return (head_dim_v // bv, batch * heads_v, 1)


def threads(bv: int = BV) -> int:
    """Threads a CTA: every thread holds RPT rows x VEC columns of the K x bv slice."""
    return K_ROWS * bv // (RPT * VEC)


def case_reason(case) -> str | None:
    """Why our CuTe GDN decode cannot run `case` (None: it can)."""
    p = case.params
    if case.dtype not in ("bf16", "fp16"):
        return f"our CuTe GDN decode takes bf16/fp16 q/k/v (fp32 state); not {case.dtype}"
    if (p.head_dim_k, p.head_dim_v) != SUPPORTED_DIMS:
        return (
            f"our CuTe GDN decode is written for K = V = 128 (one thread per state row block of 128 threads); "
            f"got K = {p.head_dim_k}, V = {p.head_dim_v}"
        )
    return None


# ---- the kernel ----------------------------------------------------------------------------------
def _build(BV: int = BV):
    """Defines the kernel and its launcher for BV columns a CTA (cutlass imported here, never at import)."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute

    F32 = cutlass.Float32
    LPR = BV // VEC  # lanes per state row segment (each lane: VEC columns, one 128-bit load)
    RPW = 32 // LPR  # state rows a warp reads per instruction
    NW = K_ROWS // (RPW * RPT)  # warps
    NT = 32 * NW  # threads
    ROW_RED = [16 >> k for k in range(RPW.bit_length() - 1)]  # butterflies across the rows of a warp

    @cute.kernel
    def gdn_decode_kernel(
        mQ: cute.Tensor,  # [B, H, K]
        mK: cute.Tensor,  # [B, H, K]
        mV: cute.Tensor,  # [B, HV, V]
        mA: cute.Tensor,  # [B, HV] raw a
        mB: cute.Tensor,  # [B, HV] raw b
        mAlog: cute.Tensor,  # [HV] fp32
        mDt: cute.Tensor,  # [HV]
        mPool: cute.Tensor,  # [N, HV, K, V] fp32
        mIdx: cute.Tensor,  # [B] int32
        mO: cute.Tensor,  # [B, HV, V]
        scale: cutlass.Constexpr[float],
        H: cutlass.Constexpr[int],
        HV: cutlass.Constexpr[int],
        K: cutlass.Constexpr[int],
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        lane = tidx % 32
        warp = tidx // 32
        i_lc = lane % LPR  # which VEC columns of the block
        i_lr = lane // LPR  # which row of the warp's instruction
        r0 = (warp * RPW + i_lr) * RPT  # this thread's RPT contiguous state rows
        i_n = bidy // HV
        i_hv = bidy % HV
        i_h = i_hv // (HV // H)
        i_vec = bidx * LPR + i_lc  # VEC-column index in the row
        col0 = i_vec * VEC

        smem = cutlass.utils.SmemAllocator()
        sQ = smem.allocate_tensor(F32, cute.make_layout((K,)), 16)
        sK = smem.allocate_tensor(F32, cute.make_layout((K,)), 16)
        sRed = smem.allocate_tensor(F32, cute.make_layout((NW * BV,)), 16)
        sRed2 = smem.allocate_tensor(F32, cute.make_layout((NW * BV,)), 16)
        r_h = [cute.make_rmem_tensor(cute.make_layout((VEC,), stride=(1,)), F32) for _ in range(RPT)]
        r_t = cute.make_rmem_tensor(cute.make_layout((VEC,), stride=(1,)), F32)
        r_u = cute.make_rmem_tensor(cute.make_layout((VEC,), stride=(1,)), F32)
        r_kk = cute.make_rmem_tensor(cute.make_layout((RPT,), stride=(1,)), F32)

        slot = cutlass.Int64(mIdx[i_n])
        if slot >= 0:
            # the state rows first (128-bit loads, all in flight while q/k/gates are formed)
            for i in cutlass.range_constexpr(RPT):
                cute.autovec_copy(cute.local_tile(mPool[slot, i_hv, r0 + i, None], (VEC,), (i_vec,)), r_h[i])
            # q, k rows into shared memory (fp32), one element a thread
            if tidx < K:
                sQ[tidx] = F32(mQ[i_n, i_h, tidx])
                sK[tidx] = F32(mK[i_n, i_h, tidx])

            # gates, computed by every thread (scalars)
            x = F32(mA[i_n, i_hv]) + F32(mDt[i_hv])
            sp = x
            if x <= SOFTPLUS_THRESHOLD:
                # the log in full precision: the fast one's absolute error (~1e-7 near 1), times A up to
                # ~16, moved the decay 27 ulp and one state element past its bound (FlashInfer's kernel
                # does the same: docs/findings/reports/gdn_decode_replay_state_edge.md)
                sp = cute.math.log(1.0 + cute.math.exp(x, fastmath=True))
            g = -cute.math.exp(F32(mAlog[i_hv]), fastmath=True) * sp
            decay = cute.math.exp(g, fastmath=True)
            beta = 1.0 / (1.0 + cute.math.exp(-F32(mB[i_n, i_hv]), fastmath=True))
            for c in cutlass.range_constexpr(VEC):
                r_u[c] = F32(mV[i_n, i_hv, col0 + c])
            cute.arch.barrier()

            # L2 norms: every warp reduces both vectors itself
            ssq = F32(0.0)
            ssk = F32(0.0)
            for i in cutlass.range_constexpr(K // 32):
                xq = sQ[lane + 32 * i]
                xk = sK[lane + 32 * i]
                ssq += xq * xq
                ssk += xk * xk
            for off in [16, 8, 4, 2, 1]:
                ssq += cute.arch.shuffle_sync_bfly(ssq, offset=off, mask=-1, mask_and_clamp=31)
                ssk += cute.arch.shuffle_sync_bfly(ssk, offset=off, mask=-1, mask_and_clamp=31)
            inv_k = cute.math.rsqrt(ssk + L2_EPS, fastmath=True)
            q_mul = cute.math.rsqrt(ssq + L2_EPS, fastmath=True) * scale

            # decay, then S^T k^ for these VEC columns (partial over this thread's rows)
            for i in cutlass.range_constexpr(RPT):
                r_kk[i] = sK[r0 + i] * inv_k
            for c in cutlass.range_constexpr(VEC):
                r_t[c] = F32(0.0)
            for i in cutlass.range_constexpr(RPT):
                for c in cutlass.range_constexpr(VEC):
                    hval = r_h[i][c] * decay
                    r_h[i][c] = hval
                    r_t[c] = r_t[c] + hval * r_kk[i]
            for c in cutlass.range_constexpr(VEC):
                for off in ROW_RED:
                    r_t[c] = r_t[c] + cute.arch.shuffle_sync_bfly(r_t[c], offset=off, mask=-1, mask_and_clamp=31)
            if i_lr == 0:
                for c in cutlass.range_constexpr(VEC):
                    sRed[warp * BV + i_lc * VEC + c] = r_t[c]
            cute.arch.barrier()
            for c in cutlass.range_constexpr(VEC):
                tot = F32(0.0)
                for w in cutlass.range_constexpr(NW):
                    tot += sRed[w * BV + i_lc * VEC + c]
                r_u[c] = beta * (r_u[c] - tot)

            # rank-1 update, write back (128-bit stores), o = S^T q^
            for c in cutlass.range_constexpr(VEC):
                r_t[c] = F32(0.0)
            for i in cutlass.range_constexpr(RPT):
                qq = sQ[r0 + i]
                for c in cutlass.range_constexpr(VEC):
                    hnew = r_h[i][c] + r_kk[i] * r_u[c]
                    r_h[i][c] = hnew
                    r_t[c] = r_t[c] + hnew * qq
                cute.autovec_copy(r_h[i], cute.local_tile(mPool[slot, i_hv, r0 + i, None], (VEC,), (i_vec,)))
            for c in cutlass.range_constexpr(VEC):
                for off in ROW_RED:
                    r_t[c] = r_t[c] + cute.arch.shuffle_sync_bfly(r_t[c], offset=off, mask=-1, mask_and_clamp=31)
            if i_lr == 0:
                for c in cutlass.range_constexpr(VEC):
                    sRed2[warp * BV + i_lc * VEC + c] = r_t[c]
            cute.arch.barrier()
            if tidx < LPR:
                for c in cutlass.range_constexpr(VEC):
                    out = F32(0.0)
                    for w in cutlass.range_constexpr(NW):
                        out += sRed2[w * BV + i_lc * VEC + c]
                    mO[i_n, i_hv, col0 + c] = (out * q_mul).to(mO.element_type)
        else:
            if tidx < LPR:
                for c in cutlass.range_constexpr(VEC):
                    mO[i_n, i_hv, col0 + c] = F32(0.0).to(mO.element_type)

    @cute.jit
    def gdn_decode_launch(
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mAlog: cute.Tensor,
        mDt: cute.Tensor,
        mPool: cute.Tensor,
        mIdx: cute.Tensor,
        mO: cute.Tensor,
        scale: cutlass.Constexpr[float],
        H: cutlass.Constexpr[int],
        HV: cutlass.Constexpr[int],
        K: cutlass.Constexpr[int],
        V: cutlass.Constexpr[int],
        stream: cuda.CUstream,
    ):
        B = cute.size(mIdx, mode=[0])
        # pool strides are multiples of VEC (16 bytes; checked on the host): 128-bit row slices
        stride = tuple(cute.assume(st, divby=VEC) for st in mPool.stride[:-1]) + (mPool.stride[-1],)
        mPool = cute.make_tensor(mPool.iterator, cute.make_layout(mPool.shape, stride=stride))
        gdn_decode_kernel(mQ, mK, mV, mA, mB, mAlog, mDt, mPool, mIdx, mO, scale, H, HV, K).launch(
            grid=[V // BV, B * HV, 1], block=[NT, 1, 1], stream=stream
        )

    return gdn_decode_launch


def compile_gdn_decode(x, bv: int = BV):
    """(compiled function, compile seconds, how) for the static configuration of `x` and `bv` value
    columns a CTA (cached in-process and on disk: common.cached_compile)."""
    H, K = x.q.shape[1], x.q.shape[2]
    HV, V = x.v.shape[1], x.v.shape[2]
    key = ("gdn_decode", x.q.dtype, x.a.dtype, x.dt_bias.dtype, x.o.dtype, float(x.scale), H, HV, K, V, bv)
    check_rows_aligned(x.state_pool, 16)

    def build():
        import cutlass.cute as cute

        launch = _build(bv)
        args = [x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, x.state_pool, x.state_indices, x.o]
        return cute.compile(
            launch, *[dynamic(t, 16) if t is x.state_pool else dynamic(t) for t in args],
            scale=float(x.scale), H=H, HV=HV, K=K, V=V, stream=stream_of(x.q.device),
            options="--enable-tvm-ffi",
        )  # fmt: skip

    return cached_compile(key, build)


def prepare(case, x, bv: int = BV):
    """The timed closure of our CuTe GDN decode on `x` with `bv` value columns a CTA (a divisor of V;
    variants are plugin backends); compiles in here, timed as compile_s."""
    fn, compile_s, compiled_how = compile_gdn_decode(x, bv)
    args = (x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, x.state_pool, x.state_indices, x.o)
    device = x.q.device
    out = {"o": x.o}

    def run():
        fn(*args, stream_of(device))
        return out

    run.info = {
        "compile_s": compile_s,
        "jit_s": compile_s,
        "compile": compiled_how,
        "variant": f"SIMT, 128-bit state rows: CTA per ({bv} columns, request, v-head), state slice in registers"
        + (" (q/k/v read in place from mixed_qkv)" if x.mixed_qkv is not None else ""),
    }
    return run
