"""Absorbed-MLA paged decode on Hopper's warpgroup MMA, written in Gluon (Triton's explicit-layout dialect).

The same schedule and outputs as decode_mla.py's `_mla_decode_kernel` (work items `(request, first key,
end key, final?)`, partials merged by decode.py's merge kernel), with the layout that `tl.dot` cannot
be told to use. A program takes 64 query heads of one request (M of every MMA) and 8 warps, two
warpgroups; both MMAs put the warpgroups side by side along N:

- `S = Q_lat K_lat^T + Q_rope K_rope^T` (`[64 heads, 64 keys]`): each warpgroup computes 32 of the 64
  keys' scores. `tl.dot` lays this 64-row product out as `[8, 1]` warps, so both warpgroups computed
  all of it (kernels/triton/NOTES.md, "Absorbed-MLA decode"); here no score is computed twice.
- `O += P V` (`[64, 512]` fp32): each warpgroup owns 256 of the 512 value columns (one m64n256k16 MMA
  per 16 keys), reading the whole `P` from shared memory, where each warpgroup wrote its half.

A block costs two CTA barriers: each warpgroup's row maxima (over its 32 keys, reduced inside its
warps) meet the other's in shared memory; then P and the rescale factor. The row sums stay per
warpgroup and are added once at the end. (The compiler's own cross-warp reductions and layout
conversion cost 11 barriers a block; on an H100 the two versions ran within 5% of each other.)

Key blocks are 64 consecutive rows of one page (page size a multiple of 64): whole blocks arrive by
TMA into a two-stage ring (the next block's copy in flight while this one is computed); a block that a
range starts or ends inside (window start, partial last page) is loaded with row masks, invalid rows 0,
so the NaN of a slot past a sequence never reaches `P V`. Q (`[64, 576]` bf16, 72 KB), two K stages
(2 x 72 KB) and P (8 KB) take 224 KB of the 227 KB of shared memory; the epilogue reuses the K stages
as the `[64, 512]` fp32 staging buffer of the output's coalesced stores.

Numerics are the Triton MLA kernel's: scores scaled to log2 units, probabilities rounded to the cache
dtype before `P V`, fp32 accumulation; the final LSE is summed and logged in fp64. No soft cap, no
sinks, 16-bit caches only, `G % 64 == 0` query heads (`gluon_unsupported` says why otherwise; the
Triton MLA kernel runs those).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

D_LATENT, D_ROPE = 512, 64
BLOCK_H, BLOCK_N, NUM_WARPS = 64, 64, 8
_LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _issue(kv_desc, rope_desc, p_pages, n0, bar, k_buf, kr_buf, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):
    """Start the TMA copies of the whole block of keys `[n0, n0 + BLOCK_N)` (one page's rows) into a stage."""
    i_page = gl.load(p_pages + n0 // PAGE_SIZE)
    row = i_page * PAGE_SIZE + n0 % PAGE_SIZE
    mbarrier.expect(bar, BLOCK_N * (512 + 64) * 2)
    tma.async_copy_global_to_shared(kv_desc, [row, 0], bar, k_buf)
    tma.async_copy_global_to_shared(rope_desc, [row, 512], bar, kr_buf)


@gluon.jit
def _load_masked(kv, p_pages, n0, n_start, n_end, stride_kvp, stride_kvs, k_buf, kr_buf,
                 PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, LD: gl.constexpr):  # fmt: skip
    """The block `[n0, n0 + BLOCK_N)` into a stage by plain loads, rows outside `[n_start, n_end)` 0
    (after a barrier: every warp is done reading the stage)."""
    gl.thread_barrier()
    o_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LD))
    m_n = (o_n >= n_start) & (o_n < n_end)
    i_page = gl.load(p_pages + n0 // PAGE_SIZE).to(gl.int64)
    p_row = kv + i_page * stride_kvp + (o_n % PAGE_SIZE) * stride_kvs
    o_d = gl.arange(0, 64, layout=gl.SliceLayout(0, LD))
    for j in gl.static_range(512 // 64):  # 64 columns at a time: 16 values a thread
        b = gl.load(p_row[:, None] + (j * 64 + o_d)[None, :], mask=m_n[:, None], other=0.0)
        k_buf.slice(j * 64, 64, dim=1).store(b)
    b = gl.load(p_row[:, None] + (512 + o_d)[None, :], mask=m_n[:, None], other=0.0)
    kr_buf.store(b)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _scores(q_buf, qr_buf, k_buf, kr_buf, m_buf, b_m, n0, n_start, n_end, qk_scale,
            BH: gl.constexpr, BN: gl.constexpr, MASKED: gl.constexpr, S_L: gl.constexpr, M2: gl.constexpr):  # fmt: skip
    """A key block's scores (log2 units) and the new row maxima: each warpgroup's over its half of the
    keys (no cross-warp step), the two exchanged through `m_buf` at the block's first CTA barrier."""
    b_s = gl.zeros([BH, BN], gl.float32, S_L)
    b_s = warpgroup_mma(q_buf, k_buf.permute((1, 0)), b_s, use_acc=False)
    b_s = warpgroup_mma(qr_buf, kr_buf.permute((1, 0)), b_s)
    b_s = b_s * qk_scale
    if MASKED:
        o_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, S_L))
        m_n = (o_n >= n_start) & (o_n < n_end)
        b_s = gl.where(m_n[None, :], b_s, float("-inf"))
    m_buf.store(gl.max(gl.reshape(b_s, [BH, 2, BN // 2]), 2))
    gl.thread_barrier()
    b_both = gl.max(m_buf.load(M2), 1)  # M2: both halves of a row in one thread's registers
    b_mn = gl.maximum(b_m, gl.convert_layout(b_both, gl.SliceLayout(1, S_L), assert_trivial=True))
    return b_s, b_mn  # finite: every block holds a key of the range


@gluon.jit
def _update(k_buf, p_buf, a_buf, b_s, b_m, b_mn, b_lacc, b_acc, O_L: gl.constexpr):
    """Online softmax and `acc += P V` (V = K_lat) of a block whose scores `_scores` gave. One barrier:
    P (each warpgroup wrote its half) and the rescale factor meet in `p_buf` and `a_buf`. The row sums
    stay per thread (`b_lacc`, the scores' shape), summed once after the last block."""
    b_alpha = gl.exp2(b_m - b_mn)
    b_p = gl.exp2(b_s - b_mn[:, None])
    b_half = gl.sum(gl.reshape(b_p, [b_p.shape[0], 2, b_p.shape[1] // 2]), 2)  # per warpgroup: no cross-warp step
    b_lacc = b_lacc * gl.convert_layout(b_alpha, gl.SliceLayout(1, b_half.type.layout))[:, None] + b_half
    p_buf.store(b_p.to(p_buf.dtype))
    a_buf.store(b_alpha)
    fence_async_shared()
    gl.thread_barrier()
    b_acc = b_acc * a_buf.load(gl.SliceLayout(1, O_L))[:, None]
    b_acc = warpgroup_mma(p_buf, k_buf, b_acc)
    return b_lacc, b_acc


@gluon.jit
def _block(q_buf, qr_buf, k_buf, kr_buf, p_buf, a_buf, m_buf, b_m, b_lacc, b_acc, n0, n_start, n_end, qk_scale,
           BH: gl.constexpr, BN: gl.constexpr, MASKED: gl.constexpr, S_L: gl.constexpr, O_L: gl.constexpr,
           M2: gl.constexpr):  # fmt: skip
    """`_scores` then `_update` of one block."""
    b_s, b_mn = _scores(q_buf, qr_buf, k_buf, kr_buf, m_buf, b_m, n0, n_start, n_end, qk_scale, BH, BN, MASKED, S_L, M2)
    b_lacc, b_acc = _update(k_buf, p_buf, a_buf, b_s, b_m, b_mn, b_lacc, b_acc, O_L)
    return b_mn, b_lacc, b_acc


@gluon.jit
def mla_decode_gluon_kernel(
    q, kv, kv_desc, rope_desc, kv_page_indices, kv_indptr, work,
    o, lse, part_o, part_ml,
    qk_scale,
    stride_qt, stride_qh, stride_kvp, stride_kvs,
    stride_ot, stride_oh, stride_lt, stride_pw, stride_ph, stride_mw, stride_ml,
    PAGE_SIZE: gl.constexpr,
):  # fmt: skip
    """Grid `(G // 64, W)`: heads `[64 i, 64 i + 64)` of work item `w` (module docstring)."""
    BH: gl.constexpr = 64
    BN: gl.constexpr = 64
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [8, 1], [1, 0])  # [64, 64] 16-bit tiles, 16 B a load
    # [BH, 2] row maxima of the two warpgroups, both in the registers of each thread that holds the row
    # in S_L (8 warps [4, 2], m64n32 tiles): rows as in S_L, the pair in registers
    M2: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [8, 0]],
        lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0], [0, 0]],
        block_bases=[],
        shape=[BH, 2],
    )
    SW: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    dtype: gl.constexpr = kv.dtype.element_ty

    i_hb = gl.program_id(0)
    i_w = gl.program_id(1)
    i_b = gl.load(work + i_w * 4)
    n_start = gl.load(work + i_w * 4 + 1)
    n_end = gl.load(work + i_w * 4 + 2)
    is_final = gl.load(work + i_w * 4 + 3)

    q_buf = gl.allocate_shared_memory(dtype, [BH, 512], SW)
    qr_buf = gl.allocate_shared_memory(dtype, [BH, 64], SW)
    k_bufs = gl.allocate_shared_memory(dtype, [2, BN, 512], SW)
    kr_bufs = gl.allocate_shared_memory(dtype, [2, BN, 64], SW)
    p_buf = gl.allocate_shared_memory(dtype, [BH, BN], SW)
    VEC: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    a_buf = gl.allocate_shared_memory(gl.float32, [BH], VEC)  # the rescale factor, for the P V layout
    m_buf = gl.allocate_shared_memory(gl.float32, [BH, 2], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
    bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bars.index(0), count=1)
    mbarrier.init(bars.index(1), count=1)

    # the queries of this program's heads, once
    o_h = i_hb * BH + gl.arange(0, BH, layout=gl.SliceLayout(1, LD))
    o_d = gl.arange(0, 64, layout=gl.SliceLayout(0, LD))
    p_q = q + i_b * stride_qt + o_h[:, None] * stride_qh
    for j in gl.static_range(512 // 64):
        q_buf.slice(j * 64, 64, dim=1).store(gl.load(p_q + (j * 64 + o_d)[None, :]))
    qr_buf.store(gl.load(p_q + (512 + o_d)[None, :]))
    fence_async_shared()
    gl.thread_barrier()

    p_pages = kv_page_indices + gl.load(kv_indptr + i_b)
    b_m = gl.full([BH], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))
    b_lacc = gl.sum(gl.reshape(gl.zeros([BH, BN], gl.float32, S_L), [BH, 2, BN // 2]), 2)  # [BH, 2]
    b_acc = gl.zeros([BH, 512], gl.float32, O_L)

    # blocks aligned to BN: a masked head block (window start inside it), whole blocks by TMA, a masked tail
    body_lo = gl.cdiv(n_start, BN) * BN
    body_hi = gl.maximum(body_lo, (n_end // BN) * BN)
    if n_start != body_lo:
        _load_masked(kv, p_pages, body_lo - BN, n_start, n_end, stride_kvp, stride_kvs,
                     k_bufs.index(0), kr_bufs.index(0), PAGE_SIZE, BN, LD)  # fmt: skip
        b_m, b_lacc, b_acc = _block(q_buf, qr_buf, k_bufs.index(0), kr_bufs.index(0), p_buf, a_buf, m_buf, b_m, b_lacc, b_acc,
                                 body_lo - BN, n_start, n_end, qk_scale, BH, BN, True, S_L, O_L, M2)  # fmt: skip
    n_blocks = (body_hi - body_lo) // BN
    gl.thread_barrier()  # a head block's P V is read by every warp before stage 0 is refilled
    if n_blocks > 0:
        _issue(kv_desc, rope_desc, p_pages, body_lo, bars.index(0), k_bufs.index(0), kr_bufs.index(0), PAGE_SIZE, BN)
    for i in range(n_blocks):
        s = i % 2
        mbarrier.wait(bars.index(s), (i // 2) & 1)
        b_s, b_mn = _scores(q_buf, qr_buf, k_bufs.index(s), kr_bufs.index(s), m_buf, b_m, 0, 0, 0, qk_scale,
                            BH, BN, False, S_L, M2)  # fmt: skip
        if i + 1 < n_blocks:  # past the maxima's barrier, every warp is done with block i - 1's stage
            _issue(kv_desc, rope_desc, p_pages, body_lo + (i + 1) * BN, bars.index(1 - s),
                   k_bufs.index(1 - s), kr_bufs.index(1 - s), PAGE_SIZE, BN)  # fmt: skip
        b_lacc, b_acc = _update(k_bufs.index(s), p_buf, a_buf, b_s, b_m, b_mn, b_lacc, b_acc, O_L)
        b_m = b_mn
    if n_end > body_hi:  # never the head block: that one ends at body_lo <= body_hi
        _load_masked(kv, p_pages, body_hi, n_start, n_end, stride_kvp, stride_kvs,
                     k_bufs.index(0), kr_bufs.index(0), PAGE_SIZE, BN, LD)  # fmt: skip
        b_m, b_lacc, b_acc = _block(q_buf, qr_buf, k_bufs.index(0), kr_bufs.index(0), p_buf, a_buf, m_buf, b_m, b_lacc, b_acc,
                                 body_hi, n_start, n_end, qk_scale, BH, BN, True, S_L, O_L, M2)  # fmt: skip
    mbarrier.invalidate(bars.index(0))
    mbarrier.invalidate(bars.index(1))

    # epilogue: acc / l through shared memory (the K stages, 128 KB = 64 x 512 fp32) to coalesced stores
    b_l = gl.convert_layout(gl.sum(b_lacc, 1), gl.SliceLayout(1, S_L))
    b_lo = gl.convert_layout(b_l, gl.SliceLayout(1, O_L))
    b_acc = b_acc * gl.where(b_lo > 0, 1.0 / gl.where(b_lo > 0, b_lo, 1.0), 0.0)[:, None]
    FLAT: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
    stage = k_bufs._reinterpret(gl.float32, [BH, 512], FLAT)
    gl.thread_barrier()  # every warp's last P V has read the stages
    stage.store(b_acc)
    gl.thread_barrier()
    ST: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [8, 1], [1, 0])  # [8, 512]: 16 B a store
    o_c = gl.arange(0, 512, layout=gl.SliceLayout(0, ST))
    o_r = gl.arange(0, 8, layout=gl.SliceLayout(1, ST))
    o_hv = i_hb * BH + gl.arange(0, BH, layout=gl.SliceLayout(1, S_L))
    if is_final != 0:
        for r in gl.static_range(BH // 8):
            b = stage.slice(r * 8, 8, dim=0).load(ST)
            p_o = o + i_b * stride_ot + (i_hb * BH + r * 8 + o_r)[:, None] * stride_oh + o_c[None, :]
            gl.store(p_o, b.to(o.dtype.element_ty))
        m64 = b_m.to(gl.float64) * _LN2
        lse_v = gl.where(b_l > 0, m64 + gl.log(gl.where(b_l > 0, b_l, 1.0).to(gl.float64)), float("-inf"))
        gl.store(lse + i_b * stride_lt + o_hv, lse_v.to(gl.float32))
    else:
        for r in gl.static_range(BH // 8):
            b = stage.slice(r * 8, 8, dim=0).load(ST)
            p_p = part_o + i_w * stride_pw + (i_hb * BH + r * 8 + o_r)[:, None] * stride_ph + o_c[None, :]
            gl.store(p_p, b)
        gl.store(part_ml + i_w * stride_mw + o_hv, b_m)
        gl.store(part_ml + i_w * stride_mw + stride_ml + o_hv, b_l)


def gluon_unsupported(x) -> str | None:
    """Why `x` (already fit for decode_mla.py's kernel) cannot take this one (None: it can)."""
    G, page = x.q.shape[1], x.k_cache.shape[1]
    if G % BLOCK_H:
        return f"{G} query heads (programs of {BLOCK_H})"
    if page % BLOCK_N:
        return f"page size {page} (blocks of {BLOCK_N} keys from one page)"
    if x.soft_cap > 0 or x.sinks is not None:
        return "soft cap or sinks"
    if x.k_cache.data_ptr() % 16 or (x.k_cache.stride(0) * x.k_cache.element_size()) % 16:
        return "cache not 16-byte aligned for TMA"
    return None


def make_gluon_descriptors(x) -> tuple:
    """TMA descriptors over the cache as `[pages * page_size, 576]` rows: `[64, 512]` latent and
    `[64, 64]` rope boxes (128-byte swizzle, the layout the MMAs read)."""
    k = x.k_cache
    rows = k.shape[0] * k.shape[1]
    flat = k.as_strided((rows, D_LATENT + D_ROPE), (k.stride(1), 1))
    bits = k.element_size() * 8
    sw = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=bits, rank=2)
    shape, strides = [rows, D_LATENT + D_ROPE], [k.stride(1), 1]
    return (
        TensorDescriptor(flat, shape, strides, [BLOCK_N, D_LATENT], sw),
        TensorDescriptor(flat, shape, strides, [BLOCK_N, D_ROPE], sw),
    )


def gluon_launches(x, plan, kernel=None, num_warps: int = NUM_WARPS) -> list[tuple]:
    """(kernel, grid, args, kwargs) of the attention launch and, when a request is split, the merge,
    for a decode_mla.py plan (`plan_mla_decode`) whose tiling is 64 heads by 64 keys. `kernel`: this
    file's (default) or another with its signature (decode_mla_ws.py's), launched with `num_warps`."""
    from attnbench.kernels.triton.common import LOG2E
    from attnbench.kernels.triton.decode import merge_launch

    q, k, o, lse = x.q, x.k_cache, x.o, x.lse
    lat, rope = make_gluon_descriptors(x)
    args = (
        q, k, lat, rope, x.kv_page_indices, x.kv_indptr, plan.work,
        o, lse, plan.part_o, plan.part_ml,
        x.sm_scale * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        o.stride(0), o.stride(1), lse.stride(0),
        plan.part_o.stride(0), plan.part_o.stride(1), plan.part_ml.stride(0), plan.part_ml.stride(1),
    )  # fmt: skip
    kernel = kernel or mla_decode_gluon_kernel
    out = [(kernel, plan.grid, args, dict(PAGE_SIZE=k.shape[1], num_warps=num_warps))]
    if plan.merge is not None:
        out.append(merge_launch(x.qo_indptr, plan, lse, o, lse))
    return out
