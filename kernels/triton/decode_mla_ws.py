"""Absorbed-MLA paged decode on Hopper, warp-specialized (Gluon): one warpgroup scores, one shares P V.

The schedule, inputs and outputs are decode_mla_gluon.py's (work items of decode_mla.py's plan, 64 query
heads by 64-key blocks, partials merged by decode.py's merge kernel); the work is split by role so that
the softmax of one warpgroup runs while the tensor cores serve the other:

- **scorer** (the default partition, 4 warps): `S = Q K^T` for the whole `[64 heads, 64 keys]` block
  (one m64n64 MMA per 16 of the 576 dims, both operands in shared memory: each operand byte read once
  per MMA), the online softmax inside its own warps (a row lives in one warp: no barrier), then
  `O[:, :256] += P V[:, :256]` with P from its registers; it writes P and the rescale factor to shared
  memory for
- **pv** (4 warps): `O[:, 256:] += P V[:, 256:]`, overlapping the scorer's next block;
- **loader** (1 warp): each block into a two-stage ring, whole blocks by TMA, a block that a key
  range starts or ends inside by masked `cp.async` (rows outside the range zero-filled, so the NaN of a
  slot past a sequence never reaches `P V`).

mbarriers only: `full[s]` (stage loaded), `empty[s]` (both consumers done with the stage), `p_full` /
`p_empty` (P and the rescale factor handed to pv, and released). Shared memory is decode_mla_gluon.py's:
Q 72 KB, two stages of 72 KB, P 8 KB; at the end each consumer stages its `[64, 256]` fp32 half of the
output in one K stage for coalesced stores.

Numerics are the Triton MLA kernel's (scores in log2 units, P rounded to the cache dtype before `P V`,
fp32 accumulation and row sums of unrounded P, the LSE in fp64). Same limits as decode_mla_gluon.py.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from attnbench.kernels.triton.decode_mla_gluon import _LN2, gluon_launches

NUM_WARPS = 4  # the scorer; pv 4 and the loader 1 more


@gluon.jit
def _masked(j, nb, n_start, n_end, blk0, BN: gl.constexpr):
    """Whether block `j` of `nb` (keys `[blk0 + j BN, + BN)`) holds keys outside `[n_start, n_end)`."""
    return ((j == 0) & (n_start > blk0)) | ((j == nb - 1) & (n_end < blk0 + (j + 1) * BN))


@gluon.jit
def _loader(kv, kv_desc, rope_desc, p_pages, k_bufs, kr_bufs, full, empty, n_start, n_end, blk0, nb,
            stride_kvp, stride_kvs, PAGE_SIZE: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr = 2):  # fmt: skip
    """Blocks `0 .. nb - 1` into a ring of `STAGES` stages: a stage is refilled once `empty` says its
    consumers are done with it; `full` completes when it is loaded."""
    CP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])  # [8, 64] 16-bit, 16 B a copy
    for j in range(nb):
        s = j % STAGES
        if j >= STAGES:
            mbarrier.wait(empty.index(s), ((j // STAGES) - 1) & 1)
        n0 = blk0 + j * BN
        if _masked(j, nb, n_start, n_end, blk0, BN):
            pg = gl.load(p_pages + n0 // PAGE_SIZE).to(gl.int64)
            o_d = gl.arange(0, 64, layout=gl.SliceLayout(0, CP))
            for r in gl.static_range(BN // 8):  # 8 rows at a time: 2 copies of 16 B a lane
                o_n = n0 + r * 8 + gl.arange(0, 8, layout=gl.SliceLayout(1, CP))
                m_n = ((o_n >= n_start) & (o_n < n_end))[:, None]
                p_row = (kv + pg * stride_kvp + (o_n % PAGE_SIZE) * stride_kvs)[:, None]
                k_rows = k_bufs.index(s).slice(r * 8, 8, dim=0)
                for c in gl.static_range(512 // 64):
                    async_copy.async_copy_global_to_shared(
                        k_rows.slice(c * 64, 64, dim=1), p_row + (c * 64 + o_d)[None, :], mask=m_n
                    )
                async_copy.async_copy_global_to_shared(
                    kr_bufs.index(s).slice(r * 8, 8, dim=0), p_row + (512 + o_d)[None, :], mask=m_n
                )
            async_copy.commit_group()
            async_copy.wait_group(0)
            fence_async_shared()
            mbarrier.arrive(full.index(s))
        else:
            i_page = gl.load(p_pages + n0 // PAGE_SIZE)
            row = i_page * PAGE_SIZE + n0 % PAGE_SIZE
            mbarrier.expect(full.index(s), BN * (512 + 64) * 2)
            tma.async_copy_global_to_shared(kv_desc, [row, 0], full.index(s), k_bufs.index(s))
            tma.async_copy_global_to_shared(rope_desc, [row, 512], full.index(s), kr_bufs.index(s))


@gluon.jit
def _stage_out(acc, buf, dst, stride_row, col0, is_final, BH: gl.constexpr):
    """Store `acc [BH, 256]` fp32 (already normalised) at `dst + row * stride_row + col0 + col` through
    `buf` (a free K stage): bf16/fp16 when `is_final` (dst's dtype), else fp32."""
    FLAT: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
    stage = buf._reinterpret(gl.float32, [BH, 256], FLAT)
    stage.store(acc)
    gl.thread_barrier()
    ST: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])  # [8, 256] over 4 warps
    o_c = col0 + gl.arange(0, 256, layout=gl.SliceLayout(0, ST))
    o_r = gl.arange(0, 8, layout=gl.SliceLayout(1, ST))
    for r in gl.static_range(BH // 8):
        b = stage.slice(r * 8, 8, dim=0).load(ST)
        gl.store(dst + (r * 8 + o_r)[:, None] * stride_row + o_c[None, :], b.to(dst.dtype.element_ty))


@gluon.jit
def _release_all(empty, nb, STAGES: gl.constexpr = 2):
    """Wait until every stage's last use is released by its consumers (the stages are then free)."""
    for s in gl.static_range(STAGES):
        uses = (nb - s + STAGES - 1) // STAGES  # blocks s, s + STAGES, ...
        if uses > 0:
            mbarrier.wait(empty.index(s), (uses - 1) & 1)


@gluon.jit
def _pv(k_bufs, p_buf, a_buf, full_p, empty_p, empty, o_dst, part_dst, stride_o, stride_p, nb, is_final,
        BH: gl.constexpr):  # fmt: skip
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    b_acc = gl.zeros([BH, 256], gl.float32, O_L)
    for j in range(nb):
        s = j % 2
        mbarrier.wait(full_p, j & 1)
        b_acc = b_acc * a_buf.load(gl.SliceLayout(1, O_L))[:, None]
        b_acc = warpgroup_mma(p_buf, k_bufs.index(s).slice(256, 256, dim=1), b_acc)
        mbarrier.arrive(empty_p)
        mbarrier.arrive(empty.index(s))
    mbarrier.wait(full_p, nb & 1)  # the scorer's row sums
    b_l = a_buf.load(gl.SliceLayout(1, O_L))
    b_acc = b_acc * gl.where(b_l > 0, 1.0 / gl.where(b_l > 0, b_l, 1.0), 0.0)[:, None]
    _release_all(empty, nb)
    if is_final != 0:
        _stage_out(b_acc, k_bufs.index(1), o_dst, stride_o, 256, is_final, BH)
    else:
        _stage_out(b_acc, k_bufs.index(1), part_dst, stride_p, 256, is_final, BH)


@gluon.jit
def _scorer(q_buf, qr_buf, k_bufs, kr_bufs, p_buf, a_buf, full, empty, full_p, empty_p,
            o_dst, part_dst, lse_dst, ml_dst, stride_o, stride_p, stride_ml,
            qk_scale, n_start, n_end, blk0, nb, is_final, BH: gl.constexpr, BN: gl.constexpr):  # fmt: skip
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    P_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    R: gl.constexpr = gl.SliceLayout(1, S_L)
    b_m = gl.full([BH], float("-inf"), gl.float32, R)
    b_l = gl.zeros([BH], gl.float32, R)
    b_acc = gl.zeros([BH, 256], gl.float32, O_L)
    for j in range(nb):
        s = j % 2
        mbarrier.wait(full.index(s), (j // 2) & 1)
        b_s = warpgroup_mma(q_buf, k_bufs.index(s).permute((1, 0)), gl.zeros([BH, BN], gl.float32, S_L),
                            use_acc=False, is_async=True)  # fmt: skip
        b_s = warpgroup_mma(qr_buf, kr_bufs.index(s).permute((1, 0)), b_s, is_async=True)
        b_s = warpgroup_mma_wait(0, deps=[b_s])
        b_s = b_s * qk_scale
        if _masked(j, nb, n_start, n_end, blk0, BN):
            o_n = blk0 + j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, S_L))
            b_s = gl.where(((o_n >= n_start) & (o_n < n_end))[None, :], b_s, float("-inf"))
        b_mn = gl.maximum(b_m, gl.max(b_s, 1))  # a row is one warp's: no barrier; finite: a key in range
        b_alpha = gl.exp2(b_m - b_mn)
        b_p = gl.exp2(b_s - b_mn[:, None])
        b_l = b_l * b_alpha + gl.sum(b_p, 1)
        b_m = b_mn
        b_pc = b_p.to(p_buf.dtype)
        if j > 0:
            mbarrier.wait(empty_p, (j - 1) & 1)  # pv has read P and the factor of block j - 1
        p_buf.store(b_pc)
        a_buf.store(b_alpha)
        fence_async_shared()
        mbarrier.arrive(full_p)
        b_acc = b_acc * gl.convert_layout(b_alpha, gl.SliceLayout(1, O_L))[:, None]
        b_acc = warpgroup_mma(gl.convert_layout(b_pc, P_A), k_bufs.index(s).slice(0, 256, dim=1), b_acc)
        mbarrier.arrive(empty.index(s))  # done with the stage: the loader may refill it now
    if nb > 0:
        mbarrier.wait(empty_p, (nb - 1) & 1)
    a_buf.store(b_l)  # the row sums, for pv
    mbarrier.arrive(full_p)
    b_lo = gl.convert_layout(b_l, gl.SliceLayout(1, O_L))
    b_acc = b_acc * gl.where(b_lo > 0, 1.0 / gl.where(b_lo > 0, b_lo, 1.0), 0.0)[:, None]
    _release_all(empty, nb)
    o_h = gl.arange(0, BH, layout=R)
    if is_final != 0:
        _stage_out(b_acc, k_bufs.index(0), o_dst, stride_o, 0, is_final, BH)
        lse_v = gl.where(b_l > 0, b_m.to(gl.float64) * _LN2 + gl.log(gl.where(b_l > 0, b_l, 1.0).to(gl.float64)),
                         float("-inf"))  # fmt: skip
        gl.store(lse_dst + o_h, lse_v.to(gl.float32))
    else:
        _stage_out(b_acc, k_bufs.index(0), part_dst, stride_p, 0, is_final, BH)
        gl.store(ml_dst + o_h, b_m)
        gl.store(ml_dst + stride_ml + o_h, b_l)


@gluon.jit
def mla_decode_ws_kernel(
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
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])  # [64, 64] 16-bit over 4 warps
    SW: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    dtype: gl.constexpr = kv.dtype.element_ty

    i_hb = gl.program_id(0)
    i_w = gl.program_id(1)
    i_b = gl.load(work + i_w * 4)
    n_start = gl.load(work + i_w * 4 + 1)
    n_end = gl.load(work + i_w * 4 + 2)
    is_final = gl.load(work + i_w * 4 + 3)
    blk0 = (n_start // BN) * BN
    nb = gl.cdiv(n_end - blk0, BN)

    q_buf = gl.allocate_shared_memory(dtype, [BH, 512], SW)
    qr_buf = gl.allocate_shared_memory(dtype, [BH, 64], SW)
    k_bufs = gl.allocate_shared_memory(dtype, [2, BN, 512], SW)
    kr_bufs = gl.allocate_shared_memory(dtype, [2, BN, 64], SW)
    p_buf = gl.allocate_shared_memory(dtype, [BH, BN], SW)
    a_buf = gl.allocate_shared_memory(gl.float32, [BH], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    full_p = p_bars.index(0)
    empty_p = p_bars.index(1)
    mbarrier.init(full.index(0), count=1)
    mbarrier.init(full.index(1), count=1)
    mbarrier.init(empty.index(0), count=2)  # the scorer and pv
    mbarrier.init(empty.index(1), count=2)
    mbarrier.init(full_p, count=1)
    mbarrier.init(empty_p, count=1)

    o_h = i_hb * BH + gl.arange(0, BH, layout=gl.SliceLayout(1, LD))
    o_d = gl.arange(0, 64, layout=gl.SliceLayout(0, LD))
    p_q = q + i_b * stride_qt + o_h[:, None] * stride_qh
    for c in gl.static_range(512 // 64):
        q_buf.slice(c * 64, 64, dim=1).store(gl.load(p_q + (c * 64 + o_d)[None, :]))
    qr_buf.store(gl.load(p_q + (512 + o_d)[None, :]))
    fence_async_shared()
    gl.thread_barrier()

    p_pages = kv_page_indices + gl.load(kv_indptr + i_b)
    o_dst = o + i_b * stride_ot + i_hb * BH * stride_oh
    part_dst = part_o + i_w * stride_pw + i_hb * BH * stride_ph
    lse_dst = lse + i_b * stride_lt + i_hb * BH
    ml_dst = part_ml + i_w * stride_mw + i_hb * BH
    gl.warp_specialize(
        [
            (_scorer, (q_buf, qr_buf, k_bufs, kr_bufs, p_buf, a_buf, full, empty, full_p, empty_p,
                       o_dst, part_dst, lse_dst, ml_dst, stride_oh, stride_ph, stride_ml,
                       qk_scale, n_start, n_end, blk0, nb, is_final, BH, BN)),
            (_pv, (k_bufs, p_buf, a_buf, full_p, empty_p, empty, o_dst, part_dst, stride_oh, stride_ph, nb,
                   is_final, BH)),
            (_loader, (kv, kv_desc, rope_desc, p_pages, k_bufs, kr_bufs, full, empty, n_start, n_end, blk0, nb,
                       stride_kvp, stride_kvs, PAGE_SIZE, BN)),
        ],
        [4, 1],
        [168, 56],
    )  # fmt: skip


def ws_launches(x, plan) -> list[tuple]:
    """decode_mla_gluon.gluon_launches with this file's kernel (same signature, 4 warps of the scorer)."""
    return gluon_launches(x, plan, mla_decode_ws_kernel, NUM_WARPS)
