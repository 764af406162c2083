"""Prefill (extend with no cached prefix) on Hopper, warp-specialized (Gluon): a loader warp feeds two
consumer warpgroups.

Contract: the extend op's, for requests whose keys are exactly their new tokens (every prefix 0, K/V in
`k_new`/`v_new` `[T, Hkv, D]`; saved into a cache of the same dtype by the caller first, as the backend
does), causal or not, no window, soft cap, sinks or
custom mask, 16-bit q/k/v of one dtype, head dim 64 or 128 (`prefill_unsupported` says why otherwise;
extend.py's kernel runs those). Outputs `o [T, Hq, D]`, `lse [T, Hq]` (natural log, fp32).

A program takes 128 query rows of one request and one query head (a tile; the tiles of all requests in
one list, the heaviest first) and 9 warps:

- **loader** (1 warp): the tile's Q by TMA once, then K and V blocks of 128 keys into a ring of stages
  (TMA over `[T, Hkv * D]`); a stage is refilled when both consumers have released it.
- **two consumers** (4 warps each, the default partition and a worker): rows 0-63 and 64-127 of the
  tile. For each key block, `S = Q K^T` (m64n128 MMAs, both operands in shared memory), the online
  softmax inside the warpgroup's own warps (a row is one warp's: no barrier), `O += P V` with P from
  registers (the accumulator `[64, D]` fp32). Causal tiles stop at their last row's key; only blocks
  that cross the diagonal or the sequence end are masked.

Numerics are extend.py's: scores in log2 units, P rounded to the input dtype before `P V`, fp32
accumulation and row sums of unrounded P, the LSE in fp64. Rows of a tile past its request's last token
are computed on whatever follows (another request's tokens, or TMA's zero fill) and never stored.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

BLOCK_M, BLOCK_N, STAGES = 128, 128, 2
_LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_buf, k_bufs, v_bufs, q_bar, full, empty, q_row, kv_row, h, h_kv, nb,
            BM: gl.constexpr, D: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    mbarrier.expect(q_bar, BM * D * 2)
    tma.async_copy_global_to_shared(q_desc, [q_row, h * D], q_bar, q_buf)
    for j in range(nb):
        s = j % STAGES
        if j >= STAGES:
            mbarrier.wait(empty.index(s), ((j // STAGES) - 1) & 1)
        mbarrier.expect(full.index(s), 2 * BN * D * 2)
        tma.async_copy_global_to_shared(k_desc, [kv_row + j * BN, h_kv * D], full.index(s), k_bufs.index(s))
        tma.async_copy_global_to_shared(v_desc, [kv_row + j * BN, h_kv * D], full.index(s), v_bufs.index(s))


@gluon.jit
def _consumer(q_buf, k_bufs, v_bufs, q_bar, full, empty, o_ptr, lse_ptr, stride_ot, stride_lt, qk_scale,
              q0, q_end, nb, ROW0: gl.constexpr, D: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr,
              STAGES: gl.constexpr):  # fmt: skip
    """Rows `[ROW0, ROW0 + 64)` of the tile whose first query is token `q0` of its request (`q_end`:
    the request's token count, which is also its key count)."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    P_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    R: gl.constexpr = gl.SliceLayout(1, S_L)
    q_rows = q_buf.slice(ROW0, 64, dim=0)
    o_m = q0 + ROW0 + gl.arange(0, 64, layout=R)  # query positions (= their causal key limit)
    b_m = gl.full([64], float("-inf"), gl.float32, R)
    b_l = gl.zeros([64], gl.float32, R)
    b_acc = gl.zeros([64, D], gl.float32, O_L)
    mbarrier.wait(q_bar, 0)
    # blocks every row sees whole: keys below the tile's first row (causal) and below the sequence end
    if CAUSAL:
        full_blocks = gl.minimum(q0 + ROW0 + 1, q_end) // BN
    else:
        full_blocks = q_end // BN
    for j in range(nb):
        s = j % STAGES
        mbarrier.wait(full.index(s), (j // STAGES) & 1)
        b_s = warpgroup_mma(q_rows, k_bufs.index(s).permute((1, 0)), gl.zeros([64, BN], gl.float32, S_L),
                            use_acc=False)  # fmt: skip
        b_s = b_s * qk_scale
        if j >= full_blocks:
            o_n = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, S_L))
            keep = o_n[None, :] < q_end
            if CAUSAL:
                keep = keep & (o_n[None, :] <= o_m[:, None])
            b_s = gl.where(keep, b_s, float("-inf"))
        b_mn = gl.maximum(b_m, gl.max(b_s, 1))  # finite: key 0 (block 0) is every row's
        b_alpha = gl.exp2(b_m - b_mn)
        b_p = gl.exp2(b_s - b_mn[:, None])
        b_l = b_l * b_alpha + gl.sum(b_p, 1)
        b_m = b_mn
        b_acc = b_acc * gl.convert_layout(b_alpha, gl.SliceLayout(1, O_L))[:, None]
        b_acc = warpgroup_mma(gl.convert_layout(b_p.to(k_bufs.dtype), P_A), v_bufs.index(s), b_acc)
        mbarrier.arrive(empty.index(s))
    b_lo = gl.convert_layout(b_l, gl.SliceLayout(1, O_L))
    b_acc = b_acc * gl.where(b_lo > 0, 1.0 / gl.where(b_lo > 0, b_lo, 1.0), 0.0)[:, None]
    # the output through this warpgroup's rows of the Q buffer (its last MMA has read them)
    q_rows.store(b_acc.to(q_buf.dtype))
    gl.thread_barrier()
    ST: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [4, 1], [1, 0])
    o_r = gl.arange(0, 64, layout=gl.SliceLayout(1, ST))
    o_c = gl.arange(0, D, layout=gl.SliceLayout(0, ST))
    rows = q0 + ROW0 + o_r
    b_o = q_rows.load(ST)
    gl.store(o_ptr + rows[:, None] * stride_ot + o_c[None, :], b_o, mask=(rows < q_end)[:, None])
    lse_v = gl.where(b_l > 0, b_m.to(gl.float64) * _LN2 + gl.log(gl.where(b_l > 0, b_l, 1.0).to(gl.float64)),
                     float("-inf"))  # fmt: skip
    gl.store(lse_ptr + o_m * stride_lt, lse_v.to(gl.float32), mask=o_m < q_end)


@gluon.jit
def prefill_ws_kernel(
    q_desc, k_desc, v_desc, tiles, qo_indptr, o, lse, qk_scale,
    stride_ot, stride_oh, stride_lt,
    G: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr,
):  # fmt: skip
    """Grid `(tiles, Hq)`: tile `tiles[i] = (request, first query)`, query head `program_id(1)`."""
    BM: gl.constexpr = 128
    BN: gl.constexpr = 128
    STAGES: gl.constexpr = 2
    SW: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    i_t = gl.program_id(0)
    h = gl.program_id(1)
    i_b = gl.load(tiles + 2 * i_t)
    q0 = gl.load(tiles + 2 * i_t + 1)
    row0 = gl.load(qo_indptr + i_b)
    q_end = gl.load(qo_indptr + i_b + 1) - row0
    last = gl.minimum(q0 + BM, q_end)  # keys a tile needs: up to its last row (causal) or all
    nb = gl.cdiv(last if CAUSAL else q_end, BN)

    dtype: gl.constexpr = q_desc.dtype
    q_buf = gl.allocate_shared_memory(dtype, [BM, D], SW)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, D], SW)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, D], SW)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(full.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both consumers
    fence_async_shared()

    o_ptr = o + row0 * stride_ot + h * stride_oh
    lse_ptr = lse + row0 * stride_lt + h
    gl.warp_specialize(
        [
            (_consumer, (q_buf, k_bufs, v_bufs, q_bar, full, empty, o_ptr, lse_ptr, stride_ot, stride_lt, qk_scale,
                         q0, q_end, nb, 0, D, BN, CAUSAL, STAGES)),
            (_consumer, (q_buf, k_bufs, v_bufs, q_bar, full, empty, o_ptr, lse_ptr, stride_ot, stride_lt, qk_scale,
                         q0, q_end, nb, 64, D, BN, CAUSAL, STAGES)),
            (_loader, (q_desc, k_desc, v_desc, q_buf, k_bufs, v_bufs, q_bar, full, empty, row0 + q0, row0,
                       h, h // G, nb, BM, D, BN, STAGES)),
        ],
        [4, 1],
        [232, 40],
    )  # fmt: skip


def prefill_unsupported(x) -> str | None:
    """Why extend `x` cannot take this kernel (None: it can)."""
    T, Hq, D = x.q.shape
    if any(L != n for L, n in zip(x.seq_lens_host, x.q_lens_host)):
        return "a cached prefix (this kernel reads only the new tokens' K/V)"
    if x.k_new is None or x.v_new is None:
        return "keys not in k_new/v_new"
    if x.save_kv and (x.k_cache.dtype != x.q.dtype or x.v_cache.dtype != x.q.dtype):
        return f"saved into a {x.k_cache.dtype} cache (attended as stored: extend.py's kernel)"
    if x.window >= 0 or x.soft_cap > 0 or x.sinks is not None or x.custom_mask is not None:
        return "window, soft cap, sinks or a custom mask"
    if D not in (64, 128) or x.v_new.shape[-1] != D:
        return f"head dims {D}/{x.v_new.shape[-1]} (64 or 128, equal)"
    if x.q.dtype not in (torch.bfloat16, torch.float16) or x.k_new.dtype != x.q.dtype or x.v_new.dtype != x.q.dtype:
        return "q/k/v not all bf16 or all fp16"
    for t in (x.q, x.k_new, x.v_new):
        if t.stride(-1) != 1 or t.stride(1) != D or t.stride(0) != t.shape[1] * D or t.data_ptr() % 16:
            return "q/k/v not contiguous [T, H, D]"
    return None


def plan_prefill(x) -> torch.Tensor:
    """The tile list `[n, 2]` int32 (request, first query), on the device: the heaviest tiles first."""
    tiles = [(b, q0) for b, n in enumerate(x.q_lens_host) for q0 in range(0, n, BLOCK_M)]
    if x.causal:
        tiles.sort(key=lambda t: -(min(t[1] + BLOCK_M, x.q_lens_host[t[0]])))
    else:
        tiles.sort(key=lambda t: -x.q_lens_host[t[0]])
    return torch.tensor(tiles, dtype=torch.int32).reshape(-1, 2).to(x.q.device)


def prefill_launches(x, tiles: torch.Tensor) -> list[tuple]:
    """(kernel, grid, args, kwargs) of the prefill of `x` over `tiles` (`plan_prefill`)."""
    from attnbench.kernels.triton.common import LOG2E

    T, Hq, D = x.q.shape
    Hkv = x.k_new.shape[1]
    sw = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q2, k2, v2 = x.q.view(T, Hq * D), x.k_new.view(T, Hkv * D), x.v_new.view(T, Hkv * D)
    descs = [
        TensorDescriptor(t, list(t.shape), list(t.stride()), [BLOCK_M if t is q2 else BLOCK_N, D], sw)
        for t in (q2, k2, v2)
    ]
    args = (*descs, tiles, x.qo_indptr, x.o, x.lse, x.sm_scale * LOG2E, x.o.stride(0), x.o.stride(1), x.lse.stride(0))
    meta = dict(G=Hq // Hkv, D=D, CAUSAL=bool(x.causal), num_warps=4)
    return [(prefill_ws_kernel, (tiles.shape[0], Hq), args, meta)]
