"""Prefill and extend over a paged prefix on Hopper, warp-specialized (Gluon): a loader warp feeds two
consumer warpgroups.

Contract: the extend op's, for causal or non-causal extends with no window, soft cap, sinks or custom
mask, 16-bit q/k/v of one dtype (the cache's too), head dim 64 or 128, new keys in `k_new`/`v_new`
`[T, Hkv, D]` (saved into the cache by the caller first, as the backend does) and each request's cached
prefix (`seq_lens - q_lens` keys, possibly 0) in `k_cache`/`v_cache` `[P, page, Hkv, D]` through
`kv_page_indices` (`prefill_unsupported` says why a case cannot; extend.py's kernel runs those).
Outputs `o [T, Hq, D]`, `lse [T, Hq]` (natural log, fp32).

A work item is 128 query rows of one request (a tile; the tiles of all requests in one list, the
heaviest first) and one query head; a program takes one item, or (persistent) one program per SM walks
the items, its loader running on into the next item's blocks while the consumers write this one's
output. A program has 9 warps (12 when some request has a prefix: four loader warps share the gathers):

- **loader** (1 warp): the item's Q by TMA (once both consumers are done with the last item's), then blocks of 128 keys into a ring of stages: first
  the prefix's blocks from the cache — a block of whole pages by TMA (one box per page, or one box when a
  page holds the block), a block that the prefix ends inside (or any block where pages are not 8-row
  multiples) by masked `cp.async` gathers with keys past the prefix zero-filled, so the NaN of a poisoned
  slot never reaches `P V` — then the new tokens' blocks by TMA over `[T, Hkv * D]`. A stage is refilled
  when both consumers have released it.
- **two consumers** (4 warps each, the default partition and a worker): rows 0-63 and 64-127 of the
  tile. For each key block, `S = Q K^T` (m64n128 MMAs, both operands in shared memory), the online
  softmax inside the warpgroup's own warps (a row is one warp's: no barrier), `O += P V` with P from
  registers (the accumulator `[64, D]` fp32). Every query sees the whole prefix (only the prefix's last
  block is masked, at its end); over the new tokens, causal tiles stop at their last row's key and only
  blocks that cross the diagonal or the sequence end are masked.

Numerics are extend.py's: scores in log2 units, P rounded to the input dtype before `P V`, fp32
accumulation and row sums of unrounded P, the LSE in fp64; keys in order (prefix, then new tokens) in
blocks of 128, whatever the batch (batch-invariant). Rows of a tile past its request's last token are
computed on whatever follows (another request's tokens, or TMA's zero fill) and never stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

BLOCK_M, BLOCK_N = 128, 128
STAGES = (2, 3)  # K/V ring stages allowed (shared memory: 3 fit with head dim 128, 227 KB)
_LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _gather(buf, rows_ptr, stride_row, p_pages, n0, n_end, PAGE_SIZE: gl.constexpr, D: gl.constexpr,
            BN: gl.constexpr, LW: gl.constexpr):  # fmt: skip
    """Keys `[n0, n0 + BN)` of a paged cache (`rows_ptr`: the kv head's first column of slot 0, a slot
    `stride_row` elements on) into `buf [BN, D]` by cp.async, 8 rows at a time; keys `>= n_end` zero."""
    CP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [LW, 1], [1, 0])  # [RB, 64] 16-bit, 16 B a copy
    RB: gl.constexpr = 8 * LW
    o_d = gl.arange(0, 64, layout=gl.SliceLayout(0, CP))
    for r in gl.static_range(BN // RB):
        o_n = n0 + r * RB + gl.arange(0, RB, layout=gl.SliceLayout(1, CP))
        m_n = o_n < n_end
        pg = gl.load(p_pages + o_n // PAGE_SIZE, mask=m_n, other=0).to(gl.int64)
        p_row = (rows_ptr + (pg * PAGE_SIZE + o_n % PAGE_SIZE) * stride_row)[:, None]
        for c in gl.static_range(D // 64):
            async_copy.async_copy_global_to_shared(
                buf.slice(r * RB, RB, dim=0).slice(c * 64, 64, dim=1), p_row + (c * 64 + o_d)[None, :],
                mask=m_n[:, None],
            )  # fmt: skip


@gluon.jit
def _item(it, tiles, qo_indptr, seq_lens, kv_page_indices, kv_indptr, Hq, BM: gl.constexpr, BN: gl.constexpr,
          CAUSAL: gl.constexpr, PREFIX: gl.constexpr):  # fmt: skip
    """Work item `it` = (tile `it // Hq`, query head `it % Hq`): (head, request's first row, first new
    token, new tokens, prefix keys, its page table, prefix blocks, blocks)."""
    i_t = it // Hq
    h = it % Hq
    i_b = gl.load(tiles + 2 * i_t)
    q0 = gl.load(tiles + 2 * i_t + 1)
    row0 = gl.load(qo_indptr + i_b)
    q_end = gl.load(qo_indptr + i_b + 1) - row0
    last = gl.minimum(q0 + BM, q_end)  # new keys a tile needs: up to its last row (causal) or all
    if PREFIX:
        prefix = gl.load(seq_lens + i_b) - q_end
        p_pages = kv_page_indices + gl.load(kv_indptr + i_b)
    else:
        prefix = q_end * 0
        p_pages = kv_page_indices
    nbp = gl.cdiv(prefix, BN)
    if CAUSAL:
        nb = nbp + gl.cdiv(last, BN)
    else:
        nb = nbp + gl.cdiv(q_end, BN)
    return h, row0, q0, q_end, prefix, p_pages, nbp, nb


@gluon.jit
def _loader(q_desc, k_desc, v_desc, kc_desc, vc_desc, kc_rows, vc_rows, stride_kc, stride_vc,
            tiles, qo_indptr, seq_lens, kv_page_indices, kv_indptr, n_items, Hq,
            q_buf, k_bufs, v_bufs, q_full, q_empty, full, empty, G: gl.constexpr,
            BM: gl.constexpr, D: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
            PREFIX: gl.constexpr, PAGE_SIZE: gl.constexpr, PAGE_TMA: gl.constexpr, LW: gl.constexpr):  # fmt: skip
    PB: gl.constexpr = PAGE_SIZE if PAGE_TMA and PAGE_SIZE < BN else BN  # rows of a cache box (whole pages)
    NP: gl.constexpr = BN // PB  # boxes a block
    PV: gl.constexpr = gl.BlockedLayout([NP], [32], [LW], [0])  # every thread holds a block's box rows
    o_c = gl.arange(0, NP, layout=PV)
    g = 0  # blocks loaded so far (all items): the ring's position
    k = 0  # items so far
    for it in range(gl.program_id(0), n_items, gl.num_programs(0)):
        h, row0, q0, q_end, prefix, p_pages, nbp, nb = _item(it, tiles, qo_indptr, seq_lens, kv_page_indices,
                                                            kv_indptr, Hq, BM, BN, CAUSAL, PREFIX)  # fmt: skip
        h_kv = h // G
        if k > 0:  # both consumers are done with the previous item's Q (and its output staging)
            mbarrier.wait(q_empty, (k - 1) & 1)
        mbarrier.expect(q_full, BM * D * 2)
        tma.async_copy_global_to_shared(q_desc, [row0 + q0, h * D], q_full, q_buf)
        for j in range(nb):
            s = g % STAGES
            whole = (j * BN + BN <= prefix) & PAGE_TMA  # a prefix block of whole pages: its box rows, early
            if PAGE_TMA:
                n_c = j * BN + o_c * PB
                rows = gl.load(p_pages + n_c // PAGE_SIZE, mask=n_c < prefix, other=0) * PAGE_SIZE + n_c % PAGE_SIZE
            else:
                rows = o_c  # never read
            if g >= STAGES:
                mbarrier.wait(empty.index(s), ((g // STAGES) - 1) & 1)
            if j < nbp:  # the cached prefix
                n0 = j * BN
                if whole:
                    mbarrier.expect(full.index(s), 2 * BN * D * 2)
                    for c in gl.static_range(NP):
                        row = gl.sum(gl.where(o_c == c, rows, 0), 0)
                        tma.async_copy_global_to_shared(kc_desc, [row, h_kv * D], full.index(s),
                                                        k_bufs.index(s).slice(c * PB, PB, dim=0))  # fmt: skip
                        tma.async_copy_global_to_shared(vc_desc, [row, h_kv * D], full.index(s),
                                                        v_bufs.index(s).slice(c * PB, PB, dim=0))  # fmt: skip
                else:
                    _gather(k_bufs.index(s), kc_rows + h_kv * D, stride_kc, p_pages, n0, prefix, PAGE_SIZE, D, BN, LW)
                    _gather(v_bufs.index(s), vc_rows + h_kv * D, stride_vc, p_pages, n0, prefix, PAGE_SIZE, D, BN, LW)
                    async_copy.commit_group()
                    async_copy.wait_group(0)
                    fence_async_shared()
                    mbarrier.arrive(full.index(s))
            else:  # the new tokens
                n0 = row0 + (j - nbp) * BN
                mbarrier.expect(full.index(s), 2 * BN * D * 2)
                tma.async_copy_global_to_shared(k_desc, [n0, h_kv * D], full.index(s), k_bufs.index(s))
                tma.async_copy_global_to_shared(v_desc, [n0, h_kv * D], full.index(s), v_bufs.index(s))
            g += 1
        k += 1


@gluon.jit
def _consumer(q_buf, k_bufs, v_bufs, q_full, q_empty, full, empty, o, lse, stride_ot, stride_oh, stride_lt,
              qk_scale, tiles, qo_indptr, seq_lens, kv_page_indices, kv_indptr, n_items, Hq,
              ROW0: gl.constexpr, BM: gl.constexpr, D: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr,
              PREFIX: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """Rows `[ROW0, ROW0 + 64)` of each work item's tile (first query: new token `q0` of its request,
    `q_end` new tokens, `prefix` cached keys before them in `nbp` blocks)."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    P_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    R: gl.constexpr = gl.SliceLayout(1, S_L)
    ST: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [4, 1], [1, 0])
    q_rows = q_buf.slice(ROW0, 64, dim=0)
    g = 0  # blocks consumed so far (all items): the ring's position
    k = 0  # items so far
    for it in range(gl.program_id(0), n_items, gl.num_programs(0)):
        h, row0, q0, q_end, prefix, p_pages, nbp, nb = _item(it, tiles, qo_indptr, seq_lens, kv_page_indices,
                                                            kv_indptr, Hq, BM, BN, CAUSAL, PREFIX)  # fmt: skip
        o_m = q0 + ROW0 + gl.arange(0, 64, layout=R)  # new-token positions (= their causal new-key limit)
        b_m = gl.full([64], float("-inf"), gl.float32, R)
        b_l = gl.zeros([64], gl.float32, R)
        b_acc = gl.zeros([64, D], gl.float32, O_L)
        # new-token blocks every row sees whole: keys below the tile's first row (causal) and below the end
        if CAUSAL:
            full_blocks = nbp + gl.minimum(q0 + ROW0 + 1, q_end) // BN
        else:
            full_blocks = nbp + q_end // BN
        mbarrier.wait(q_full, k & 1)
        for j in range(nb):
            s = g % STAGES
            mbarrier.wait(full.index(s), (g // STAGES) & 1)
            b_s = warpgroup_mma(q_rows, k_bufs.index(s).permute((1, 0)), gl.zeros([64, BN], gl.float32, S_L),
                                use_acc=False)  # fmt: skip
            b_s = b_s * qk_scale
            if j < nbp:
                if (j == nbp - 1) & (prefix % BN != 0):  # the prefix ends inside (its zero-filled keys)
                    o_n = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, S_L))
                    b_s = gl.where((o_n < prefix)[None, :], b_s, float("-inf"))
            elif j >= full_blocks:
                o_n = (j - nbp) * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, S_L))
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
            g += 1
        b_lo = gl.convert_layout(b_l, gl.SliceLayout(1, O_L))
        b_acc = b_acc * gl.where(b_lo > 0, 1.0 / gl.where(b_lo > 0, b_lo, 1.0), 0.0)[:, None]
        # the output through this warpgroup's rows of the Q buffer (its last MMA has read them)
        q_rows.store(b_acc.to(q_buf.dtype))
        gl.thread_barrier()
        o_r = gl.arange(0, 64, layout=gl.SliceLayout(1, ST))
        o_c = gl.arange(0, D, layout=gl.SliceLayout(0, ST))
        rows = q0 + ROW0 + o_r
        b_o = q_rows.load(ST)
        o_ptr = o + row0 * stride_ot + h * stride_oh
        gl.store(o_ptr + rows[:, None] * stride_ot + o_c[None, :], b_o, mask=(rows < q_end)[:, None])
        lse_v = gl.where(b_l > 0, b_m.to(gl.float64) * _LN2 + gl.log(gl.where(b_l > 0, b_l, 1.0).to(gl.float64)),
                         float("-inf"))  # fmt: skip
        gl.store(lse + (row0 + o_m) * stride_lt + h, lse_v.to(gl.float32), mask=o_m < q_end)
        gl.thread_barrier()  # every warp's reads of the staged output done
        fence_async_shared()  # before the next Q's TMA writes the buffer
        mbarrier.arrive(q_empty)
        k += 1


@gluon.jit
def prefill_ws_kernel(
    q_desc, k_desc, v_desc, kc_desc, vc_desc, kc_rows, vc_rows, stride_kc, stride_vc,
    kv_page_indices, kv_indptr, seq_lens, tiles, qo_indptr, o, lse, qk_scale,
    stride_ot, stride_oh, stride_lt, n_items, Hq,
    G: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr, PREFIX: gl.constexpr,
    PAGE_SIZE: gl.constexpr, PAGE_TMA: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    """Work items `(tile i, query head h)` numbered `i * Hq + h` (tile `tiles[i] = (request, first new
    token)`, the heaviest first); a program takes items `program_id, + num_programs, ...` (one each when
    the grid is the item count; persistent when it is the SM count: the next item's K/V blocks load while
    this one's output is written). `PREFIX`: some request has cached keys (else the cache arguments are
    never read)."""
    BM: gl.constexpr = 128
    BN: gl.constexpr = 128
    LOADER_WARPS: gl.constexpr = 4 if PREFIX else 1
    SW: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    dtype: gl.constexpr = q_desc.dtype
    q_buf = gl.allocate_shared_memory(dtype, [BM, D], SW)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, D], SW)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, D], SW)
    q_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_full, count=1)
    mbarrier.init(q_empty, count=2)  # both consumers
    for s in gl.static_range(STAGES):
        mbarrier.init(full.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both consumers
    fence_async_shared()

    gl.warp_specialize(
        [
            (_consumer, (q_buf, k_bufs, v_bufs, q_full, q_empty, full, empty, o, lse, stride_ot, stride_oh, stride_lt,
                         qk_scale, tiles, qo_indptr, seq_lens, kv_page_indices, kv_indptr, n_items, Hq,
                         0, BM, D, BN, CAUSAL, PREFIX, STAGES)),
            (_consumer, (q_buf, k_bufs, v_bufs, q_full, q_empty, full, empty, o, lse, stride_ot, stride_oh, stride_lt,
                         qk_scale, tiles, qo_indptr, seq_lens, kv_page_indices, kv_indptr, n_items, Hq,
                         64, BM, D, BN, CAUSAL, PREFIX, STAGES)),
            (_loader, (q_desc, k_desc, v_desc, kc_desc, vc_desc, kc_rows, vc_rows, stride_kc, stride_vc,
                       tiles, qo_indptr, seq_lens, kv_page_indices, kv_indptr, n_items, Hq,
                       q_buf, k_bufs, v_bufs, q_full, q_empty, full, empty, G,
                       BM, D, BN, STAGES, CAUSAL, PREFIX, PAGE_SIZE, PAGE_TMA, LOADER_WARPS)),
        ],
        [4, LOADER_WARPS],
        [232, 40],
    )  # fmt: skip


def _prefixes(x) -> list[int]:
    return [L - n for L, n in zip(x.seq_lens_host, x.q_lens_host)]


def _tile_keys(x, pre: list[int], b: int, q0: int) -> tuple[int, int]:
    """The keys tile (request `b`, first new token `q0`) reads: its prefix, and its new tokens up to its
    last row when causal (all of them when not), as the kernel's `_item` counts its blocks."""
    n = x.q_lens_host[b]
    return pre[b], min(q0 + BLOCK_M, n) if x.causal else n


def prefill_unsupported(x) -> str | None:
    """Why extend `x` cannot take this kernel (None: it can)."""
    from attnbench.kernels.triton.extend_plan import _rows_view

    T, Hq, D = x.q.shape
    if x.k_new is None or x.v_new is None:
        return "keys not in k_new/v_new"
    if x.window >= 0 or x.soft_cap > 0 or x.sinks is not None or x.custom_mask is not None:
        return "window, soft cap, sinks or a custom mask"
    if D not in (64, 128) or x.v_new.shape[-1] != D:
        return f"head dims {D}/{x.v_new.shape[-1]} (64 or 128, equal)"
    if x.q.dtype not in (torch.bfloat16, torch.float16) or x.k_new.dtype != x.q.dtype or x.v_new.dtype != x.q.dtype:
        return "q/k/v not all bf16 or all fp16"
    for t in (x.q, x.k_new, x.v_new):
        if t.stride(-1) != 1 or t.stride(1) != D or t.stride(0) != t.shape[1] * D or t.data_ptr() % 16:
            return "q/k/v not contiguous [T, H, D]"
    cached = any(_prefixes(x))
    if (x.save_kv or cached) and (x.k_cache.dtype != x.q.dtype or x.v_cache.dtype != x.q.dtype):
        return f"a {x.k_cache.dtype} cache (attended as stored: extend.py's kernel)"
    if cached:
        for t in (x.k_cache, x.v_cache):
            why = _rows_view(t, D)
            if isinstance(why, str):
                return f"cache: {why}"
    return None


@dataclass(frozen=True)
class PrefillPolicy:
    """When the fast backend takes this kernel over extend.py's (triton-det takes it wherever it applies:
    the choice must not follow the batch). Measured on an H100 (reports/examples/h100-session18/ext2, the
    `extend` suite, `extend_kernel=ws` against `extend_kernel=triton` in one run):

    - `min_blocks_per_tile` = 6: tiles that read few 128-key blocks on average do not pay for the pipeline
      fill of a program with one tile (2.5 and 4.5 blocks a tile, b2 q512 and b1 q1024 prefills: 1.02x
      the time of extend.py's smaller tiles at two programs per SM); from 8.5 on it wins (0.73-0.90x: q2048
      prefills, extends over 1-4k prefixes).
    - `head_dims` = (128,): at head dim 64 the softmax outweighs the MMAs of a 128 x 128 block (1.08x
      the time on the d64 prefill row).
    - `gathered_prefix` = False: a prefix whose pages do not tile 128-key blocks is gathered by
      cp.async through the loader warps, 1.27x the time of extend.py's pointer loads (pages of 1).
    - extends that pack a kv group's query heads into a tile (`extend_plan.gqa_packs`: spec verify,
      draft extends) and grids over a prefix with programs for at most half the SMs (extend.py splits
      the prefix over the idle SMs) stay on extend.py's kernel; at 128 programs on 132 SMs this kernel
      was still ahead (b2 q256 over 1024 keys, bidirectional: 38.1 against 41.1 us).
    """

    min_blocks_per_tile: float = 6.0
    head_dims: tuple[int, ...] = (128,)
    gathered_prefix: bool = False


PREFILL_POLICY = PrefillPolicy()


def prefill_declined(x, tiles: torch.Tensor, policy: PrefillPolicy = PREFILL_POLICY) -> str | None:
    """Why the fast backend leaves extend `x` (which this kernel supports) to extend.py's kernel, or None."""
    from attnbench.kernels.triton.common import sm_count
    from attnbench.kernels.triton.extend_plan import gqa_packs

    pre = _prefixes(x)
    if x.q.shape[2] not in policy.head_dims:
        return f"head dim {x.q.shape[2]}"
    blocks = sum(
        -(-p // BLOCK_N) + -(-n // BLOCK_N) for p, n in (_tile_keys(x, pre, b, q0) for b, q0 in tiles.tolist())
    )
    if blocks < policy.min_blocks_per_tile * tiles.shape[0]:
        return f"{blocks / tiles.shape[0]:.1f} key blocks a tile"
    if any(pre):
        if not policy.gathered_prefix and not page_tma(x.k_cache.shape[1]):
            return f"pages of {x.k_cache.shape[1]} (gathered)"
        if gqa_packs(x):
            return "GQA-packed tiles"
        if 2 * tiles.shape[0] * x.q.shape[1] <= sm_count(x.q.device):
            return "programs for at most half the SMs (split KV)"
    return None


def page_tma(page_size: int) -> bool:
    """Whether whole prefix blocks load by TMA: a page holds whole blocks, or a block whole pages of
    8-row multiples (the swizzle's period); otherwise every prefix block is gathered by cp.async."""
    if page_size >= BLOCK_N:
        return page_size % BLOCK_N == 0
    return BLOCK_N % page_size == 0 and page_size % 8 == 0


def plan_prefill(x) -> torch.Tensor:
    """The tile list `[n, 2]` int32 (request, first new token), on the device: the heaviest tiles first
    (keys a tile reads: its prefix, then its new tokens up to its last row when causal)."""
    pre = _prefixes(x)
    tiles = [(b, q0) for b, n in enumerate(x.q_lens_host) for q0 in range(0, n, BLOCK_M)]
    tiles.sort(key=lambda t: -sum(_tile_keys(x, pre, *t)))
    return torch.tensor(tiles, dtype=torch.int32).reshape(-1, 2).to(x.q.device)


def prefill_launches(x, tiles: torch.Tensor, stages: int = 2, persistent: bool = False) -> list[tuple]:
    """(kernel, grid, args, kwargs) of the prefill of `x` over `tiles` (`plan_prefill`), with a ring of
    `stages` K/V stages; one program per (tile, head), or (`persistent`) one per SM walking them."""
    from attnbench.kernels.triton.common import LOG2E, sm_count
    from attnbench.kernels.triton.extend_plan import _rows_view

    T, Hq, D = x.q.shape
    Hkv = x.k_new.shape[1]
    sw = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q2, k2, v2 = x.q.view(T, Hq * D), x.k_new.view(T, Hkv * D), x.v_new.view(T, Hkv * D)
    descs = [
        TensorDescriptor(t, list(t.shape), list(t.stride()), [BLOCK_M if t is q2 else BLOCK_N, D], sw)
        for t in (q2, k2, v2)
    ]
    prefix = any(_prefixes(x))
    page = x.k_cache.shape[1] if prefix else BLOCK_N
    if prefix:
        kc, vc = _rows_view(x.k_cache, D), _rows_view(x.v_cache, D)
        if page_tma(page):
            box = [min(page, BLOCK_N), D]
            cache = [TensorDescriptor(t, list(t.shape), list(t.stride()), box, sw) for t in (kc, vc)]
        else:  # every prefix block gathered: the descriptors are never read
            cache = [descs[1], descs[2]]
        cache += [kc, vc, kc.stride(0), vc.stride(0)]
    else:  # never read
        cache = [descs[1], descs[2], k2, v2, k2.stride(0), v2.stride(0)]
    args = (*descs, *cache, x.kv_page_indices, x.kv_indptr, x.seq_lens, tiles, x.qo_indptr, x.o, x.lse,
            x.sm_scale * LOG2E, x.o.stride(0), x.o.stride(1), x.lse.stride(0), tiles.shape[0] * Hq, Hq)  # fmt: skip
    meta = dict(G=Hq // Hkv, D=D, CAUSAL=bool(x.causal), PREFIX=prefix, PAGE_SIZE=page,
                PAGE_TMA=prefix and page_tma(page), STAGES=stages, num_warps=4)  # fmt: skip
    items = tiles.shape[0] * Hq
    grid = min(items, sm_count(x.q.device)) if persistent else items
    return [(prefill_ws_kernel, (grid,), args, meta)]
