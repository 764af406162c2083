"""Absorbed-MLA paged decode (Triton), designed for MLA's shape.

MLA decode is one latent KV head (`[c_kv 512 | k_rope 64]` per token, V = c_kv) shared by every query
head of a request (DeepSeek-V3: 128). So a program takes a block of `BLOCK_H` query heads (the M
dimension of the tensor-core tiles) over a range of keys, and each key block is loaded once for all
of them: `S = Q_lat K_lat^T + Q_rope K_rope^T` (`[BLOCK_H, BLOCK_N]`), online softmax, `O += P K_lat`.

What differs from the generic decode kernel (decode.py), which stays the path for every other
layout:
- **Whole blocks from one page.** Key blocks are aligned to `BLOCK_N` and `PAGE_SIZE % BLOCK_N == 0`,
  so a block is `BLOCK_N` consecutive rows of one page: one page-index load per block, and on Hopper
  the rows come by TMA (`USE_TMA`: tensor descriptors over the cache viewed as `[pages * page_size,
  576]`), no per-row address arithmetic. Blocks not wholly inside the program's key range (a window
  start, the end of the sequence) are loaded row-masked with `other=0` (never by TMA: slots past a
  sequence hold NaN, and `0 * NaN` in `P V` would reach the output).
- **Splits sized for waves.** `mla_splits` picks the number of KV splits per request that fills whole
  waves of programs while the partial outputs (`BLOCK_H x 512` fp32 per split, written and read back)
  stay small against the split's own keys; the merge is decode.py's `_decode_merge_kernel`, or with
  `MLAConfig.fused_merge` decode.py's `merge_if_last` inside this kernel (the last split to finish).

Numerics are the generic kernel's (kernels/triton/NOTES.md): base-2 scores, probabilities rounded to
the input dtype before `P V`, fp32 accumulation, LSE finished in fp64. bf16/fp16 queries and caches of
the same dtype only: fp32 tiles do not fit, and fp8 caches stay on the generic kernel (converting the
tiles here spilled 900 bytes on sm_90).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from attnbench.kernels.triton.common import (
    exp2_,
    finish_lse,
    finish_o,
    mma,
    soft_cap_scores,
    v_is_k_prefix,
)
from attnbench.kernels.triton.decode import merge_if_last

D_LATENT, D_ROPE = 512, 64


@triton.jit
def _mla_block(
    b_q, b_qr, b_k, b_kr, b_m, b_l, b_acc, m_n, qk_scale, scale_over_cap, cap_log2e,
    MASKED: tl.constexpr, HAS_SOFTCAP: tl.constexpr, PRECISE_EXP: tl.constexpr,
):  # fmt: skip
    """One key block: scores, online-softmax update, `acc += P V` (V = the latent part of K)."""
    b_s = mma(b_q, tl.trans(b_k), tl.zeros([b_q.shape[0], b_k.shape[0]], tl.float32), "tf32")
    b_s = mma(b_qr, tl.trans(b_kr), b_s, "tf32")
    if HAS_SOFTCAP:
        b_s = soft_cap_scores(b_s, scale_over_cap, cap_log2e, PRECISE_EXP)
    else:
        b_s = b_s * qk_scale
    if MASKED:
        b_s = tl.where(m_n[None, :], b_s, float("-inf"))
    b_mn = tl.maximum(b_m, tl.max(b_s, 1))  # every block holds a key of the range: finite
    b_alpha = exp2_(b_m - b_mn, PRECISE_EXP)
    b_p = exp2_(b_s - b_mn[:, None], PRECISE_EXP)
    b_l = b_l * b_alpha + tl.sum(b_p, 1)
    b_acc = mma(b_p.to(b_k.dtype), b_k, b_acc * b_alpha[:, None], "tf32")
    return b_mn, b_l, b_acc


@triton.jit
def _mla_masked_block(
    kv, p_pages, n0, n_start, n_end, stride_kvp, stride_kvs,
    b_q, b_qr, b_m, b_l, b_acc, qk_scale, scale_over_cap, cap_log2e,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, PRECISE_EXP: tl.constexpr,
):  # fmt: skip
    """The block `[n0, n0 + BLOCK_N)` with only keys in `[n_start, n_end)`: row-masked loads (other=0)."""
    o_n = n0 + tl.arange(0, BLOCK_N)
    m_n = (o_n >= n_start) & (o_n < n_end)
    i_page = tl.load(p_pages + n0 // PAGE_SIZE).to(tl.int64)
    p_row = kv + i_page * stride_kvp + (o_n % PAGE_SIZE) * stride_kvs
    b_k = tl.load(p_row[:, None] + tl.arange(0, 512)[None, :], mask=m_n[:, None], other=0.0)
    b_kr = tl.load(p_row[:, None] + 512 + tl.arange(0, 64)[None, :], mask=m_n[:, None], other=0.0)
    return _mla_block(
        b_q, b_qr, b_k, b_kr, b_m, b_l, b_acc, m_n, qk_scale, scale_over_cap, cap_log2e,
        True, HAS_SOFTCAP, PRECISE_EXP,
    )  # fmt: skip


@triton.jit
def _mla_decode_kernel(
    # Inputs
    q, kv, kv_desc, kv_rope_desc, kv_page_indices, kv_indptr, sinks, work,
    # Outputs: final (requests with one split) and partial (requests with several)
    o, lse, part_o, part_ml,
    # Scalars
    qk_scale, scale_over_cap, cap_log2e,
    # Strides (last dims are contiguous)
    stride_qt, stride_qh, stride_kvp, stride_kvs,
    stride_ot, stride_oh, stride_lt, stride_pw, stride_ph, stride_mw, stride_ml,
    # Fused merge (FUSED_MERGE): merge rows, each work item's merge row, arrival counters [M, units]
    merge, work_row, counters,
    # Meta-parameters
    G: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr, USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
    PRECISE_EXP: tl.constexpr, FUSED_MERGE: tl.constexpr = 0, MERGE_DV: tl.constexpr = 128,
):  # fmt: skip
    i_hb, i_w = tl.program_id(0), tl.program_id(1)
    i_b = tl.load(work + i_w * 4)
    n_start = tl.load(work + i_w * 4 + 1)
    n_end = tl.load(work + i_w * 4 + 2)
    is_final = tl.load(work + i_w * 4 + 3)

    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)  # query heads of this program (one kv head)
    m_h = o_h < G
    p_q = q + i_b * stride_qt + o_h[:, None] * stride_qh
    b_q = tl.load(p_q + tl.arange(0, 512)[None, :], mask=m_h[:, None], other=0.0)
    b_qr = tl.load(p_q + 512 + tl.arange(0, 64)[None, :], mask=m_h[:, None], other=0.0)

    p_pages = kv_page_indices + tl.load(kv_indptr + i_b)
    b_m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    b_l = tl.zeros([BLOCK_H], tl.float32)
    b_acc = tl.zeros([BLOCK_H, 512], tl.float32)

    # blocks aligned to BLOCK_N: a masked head block (window start inside it), whole blocks, a masked tail
    body_lo = tl.cdiv(n_start, BLOCK_N) * BLOCK_N
    body_hi = tl.maximum(body_lo, (n_end // BLOCK_N) * BLOCK_N)
    if n_start != body_lo:
        b_m, b_l, b_acc = _mla_masked_block(
            kv, p_pages, body_lo - BLOCK_N, n_start, n_end, stride_kvp, stride_kvs,
            b_q, b_qr, b_m, b_l, b_acc, qk_scale, scale_over_cap, cap_log2e,
            PAGE_SIZE, BLOCK_N, HAS_SOFTCAP, PRECISE_EXP,
        )  # fmt: skip
    o_nb = tl.arange(0, BLOCK_N)
    for n0 in tl.range(body_lo, body_hi, BLOCK_N, num_stages=NUM_STAGES, warp_specialize=WARP_SPECIALIZE):
        i_page = tl.load(p_pages + n0 // PAGE_SIZE)
        if USE_TMA:
            row = i_page * PAGE_SIZE + n0 % PAGE_SIZE
            b_k = kv_desc.load([row, 0])
            b_kr = kv_rope_desc.load([row, 512])
        else:
            p_row = kv + i_page.to(tl.int64) * stride_kvp + (n0 % PAGE_SIZE + o_nb) * stride_kvs
            b_k = tl.load(p_row[:, None] + tl.arange(0, 512)[None, :])
            b_kr = tl.load(p_row[:, None] + 512 + tl.arange(0, 64)[None, :])
        b_m, b_l, b_acc = _mla_block(
            b_q, b_qr, b_k, b_kr, b_m, b_l, b_acc, o_nb, qk_scale, scale_over_cap, cap_log2e,
            False, HAS_SOFTCAP, PRECISE_EXP,
        )  # fmt: skip
    if n_end > body_hi:  # never the head block: that one ends at body_lo <= body_hi
        b_m, b_l, b_acc = _mla_masked_block(
            kv, p_pages, body_hi, n_start, n_end, stride_kvp, stride_kvs,
            b_q, b_qr, b_m, b_l, b_acc, qk_scale, scale_over_cap, cap_log2e,
            PAGE_SIZE, BLOCK_N, HAS_SOFTCAP, PRECISE_EXP,
        )  # fmt: skip
    o_dv = tl.arange(0, 512)
    if is_final != 0:
        if HAS_SINKS:
            b_sink = tl.load(sinks + o_h, mask=m_h, other=0.0)
        else:
            b_sink = b_m  # unused
        b_o = finish_o(b_acc, b_m, b_l, b_sink, HAS_SINKS, PRECISE_EXP)
        p_o = o + i_b * stride_ot + o_h[:, None] * stride_oh + o_dv[None, :]
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_h[:, None])
        tl.store(lse + i_b * stride_lt + o_h, finish_lse(b_m, b_l, b_sink, HAS_SINKS, PRECISE_EXP), mask=m_h)
    else:  # the partial output, normalised, with its max (log2 units) and sum kept apart
        p_part = part_o + i_w * stride_pw + o_h[:, None] * stride_ph + o_dv[None, :]
        tl.store(p_part, b_acc / b_l[:, None], mask=m_h[:, None])
        tl.store(part_ml + i_w * stride_mw + o_h, b_m, mask=m_h)
        tl.store(part_ml + i_w * stride_mw + stride_ml + o_h, b_l, mask=m_h)
        if FUSED_MERGE:  # the last split of (request, head block) to finish merges them (decode.py)
            merge_if_last(
                merge, work_row, counters, i_w, i_hb, sinks, part_o, part_ml, o, lse, i_b, o_h, m_h,
                stride_pw, stride_ph, stride_mw, stride_ml, stride_ot, stride_oh, stride_lt,
                512, 512, MERGE_DV, BLOCK_H, HAS_SINKS, PRECISE_EXP,
            )  # fmt: skip


# ---- when this kernel applies, and its launch configuration --------------------------------------


@dataclass(frozen=True)
class MLAConfig:
    """`block_h` query heads by `block_n` keys per step; `use_tma`: whole blocks by tensor descriptor."""

    block_h: int = 64
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 2
    use_tma: bool = True
    warp_specialize: bool = False
    fused_merge: bool = False  # split requests merged in the same launch (decode.DecodeConfig.fused_merge)
    pdl: bool = False  # the merge kernel as a programmatic dependent (decode.with_pdl, no trigger); off: it moved no H200 MLA row by over 1.3% (h200-session23/dec)
    # "triton": this file's kernel; on Hopper, Gluon kernels where they apply (`gluon_unsupported`):
    # "wgmma" (decode_mla_gluon.py: two warpgroups side by side), "ws" (decode_mla_ws.py: warp-specialized)
    impl: str = "triton"


def mla_config(group: int, page_size: int, sm: int) -> MLAConfig:
    """The default tiling: 64 heads (two warpgroups share the 64 x 512 fp32 accumulator) by 64 keys,
    two stages (2 x 72 KB of K/V plus 72 KB of Q: Hopper's 227 KB). On Hopper (sm 90, compiled, not
    interpreted) the warp-specialized Gluon kernel (`impl="ws"`) runs where `plan_mla_decode` finds it
    applies (kernels/triton/NOTES.md, "Absorbed-MLA decode": its measurements)."""
    from attnbench.kernels.triton.limits import interpreting

    block_h = min(64, max(16, triton.next_power_of_2(group)))
    block_n = min(64, page_size)
    # TMA (use_tma) loads the same tiles; on an H100 it ran 1-3% slower than the pointer loads
    # (tools/bench/mla_variants.py, reports/examples/h100-session10), so it stays a variant
    impl = "ws" if sm == 90 and not interpreting() else "triton"
    return MLAConfig(block_h, block_n, 8 if block_h >= 64 else 4, 2, False, impl=impl)


MLA_IMPLS = ("triton", "wgmma", "ws")


def gluon_unsupported_for(x, config: MLAConfig) -> str | None:
    """Why `x` under `config` cannot take a Gluon kernel (decode_mla_gluon.py, decode_mla_ws.py; None: it can)."""
    from attnbench.kernels.triton.limits import interpreting

    if interpreting():
        return "Triton's interpreter does not run Gluon kernels"
    if config.fused_merge:
        return "the fused merge is the Triton MLA kernel's"
    if (config.block_h, config.block_n) != (64, 64):
        return f"tiling {config.block_h} heads x {config.block_n} keys (the Gluon kernel's is 64 x 64)"
    from attnbench.kernels.triton.decode_mla_gluon import gluon_unsupported

    return gluon_unsupported(x)


def mla_unsupported(x, config: MLAConfig) -> str | None:
    """Why `x` cannot take this kernel (None: it can). The generic decode kernel runs the rest."""
    _, _, Dk = x.q.shape
    Hkv, page, Dv = x.k_cache.shape[2], x.k_cache.shape[1], x.v_cache.shape[-1]
    k = x.k_cache
    if (Hkv, Dk, Dv) != (1, D_LATENT + D_ROPE, D_LATENT):
        return f"not absorbed MLA (Hkv {Hkv}, head dims {Dk}/{Dv}; wants 1, 576/512)"
    if not v_is_k_prefix(k, x.v_cache):
        return "V is not the latent part of the K cache"
    if x.q.dtype not in (torch.bfloat16, torch.float16):
        return f"{x.q.dtype} queries (the tiles are sized for 16-bit operands)"
    if k.dtype != x.q.dtype:  # fp8 caches: converting the tiles in registers spilled 900 bytes (sm_90 ptxas)
        return f"{k.dtype} cache with {x.q.dtype} queries"
    if config.block_n < 16 or page % config.block_n:
        return f"page size {page}: blocks of {config.block_n} keys (at least 16, whole pages' parts)"
    if k.stride(-1) != 1 or k.stride(1) != k.stride(2) * Hkv or k.stride(2) != Dk:
        return "cache rows are not contiguous [page, 576] rows"
    if config.use_tma and (k.data_ptr() % 16 or (k.stride(0) * k.element_size()) % 16):
        return "cache not 16-byte aligned for TMA"
    if x.q.stride(-1) != 1:
        return "queries not contiguous in their last dim"
    return None


def mla_splits(lens: list[int], units: int, slots: int, block_n: int, partial_keys: int, max_splits: int = 64) -> int:
    """KV splits per request for a batch of key counts `lens`, each request run by `units` programs.

    Modeled time (in key loads) of `s` splits: waves of programs, each wave as long as its longest
    split, plus the partial outputs each split writes and the merge reads back (`partial_keys`: the
    keys whose K/V bytes equal one split's partials, written and read: counted twice), spread over
    the `slots` resident programs, and never below perfect balance. The fewest splits within 2% of
    the best wins (fewer partials).
    """
    from attnbench.kernels.triton.decode import fewest_within, split_counts

    balanced = sum(lens) * units / slots
    costs = [
        (max(waves * chunk + (2 * partial_keys * programs / slots if n > 1 else 0.0), balanced), n)
        for n, chunk, programs, waves in split_counts(lens, units, block_n, slots, 2 * block_n, max_splits)
    ]
    return fewest_within(costs, 0.02)


def make_descriptors(x, config: MLAConfig) -> tuple:
    """Tensor descriptors over the cache as `[pages * page_size, 576]` rows: latent `[block_n, 512]`
    and rope `[block_n, 64]` boxes; (None, None) without TMA."""
    if not config.use_tma:
        return None, None
    from triton.tools.tensor_descriptor import TensorDescriptor

    k = x.k_cache
    rows = k.shape[0] * k.shape[1]
    flat = k.as_strided((rows, D_LATENT + D_ROPE), (k.stride(1), 1))
    lat = TensorDescriptor(flat, [rows, D_LATENT + D_ROPE], [k.stride(1), 1], [config.block_n, D_LATENT])
    rope = TensorDescriptor(flat, [rows, D_LATENT + D_ROPE], [k.stride(1), 1], [config.block_n, D_ROPE])
    return lat, rope


WAVE_CTAS = 1  # resident programs per SM planned for (64 x 512 fp32 accumulator, ~216 KB shared memory)

# How much a split's partial output (written, then read by the merge) costs against the keys a program
# streams, per MLA kernel: the byte ratio times this weight. 1 for the Triton MLA kernel (its splits
# were fitted on it, reports/examples/h100-session10). The Gluon kernels stream keys 2-2.5x faster while
# the partials cost the same: H100 (reports/examples/h100-session17), ws B32 L1024 ran 41.2 us unsplit
# against 47.5 on two splits, and B32 L4096 94.8 on two; a per-block time of 1.97 us and a split's
# partials and merge of 22 us fit both, 3.2x the byte ratio (368 keys a split against 114).
PARTIAL_WEIGHT = {"triton": 1.0, "wgmma": 3.2, "ws": 3.2}


def plan_mla_decode(
    x, *, deterministic: bool = False, split_tile: int = 2048, config: MLAConfig | None = None,
    num_sms: int | None = None, splits: int | None = None,
):  # fmt: skip
    """Schedule, scratch and launch parameters of `x` on this kernel (host work only, no device sync).

    Args:
        x: `AttentionInputs` of an absorbed-MLA decode case (`mla_unsupported(x, config)` is None).
        deterministic: every request cut into splits of `split_tile` keys whatever the batch.
        split_tile: keys per split in deterministic mode (a multiple of `config.block_n`).
        config: tiling (default: `mla_config`).
        num_sms: SMs to plan for (default: the device's).
        splits: force this many splits of the longest request (default: `mla_splits`).
    Returns:
        a decode.py `DecodePlan` (its `meta` for `_mla_decode_kernel`) with `descriptors` attached.
    """
    from attnbench.kernels.triton.common import arch, sm_count
    from attnbench.kernels.triton.decode import DecodePlan, arrange_merge, split_schedule, split_tables

    device = x.q.device
    T, Hq, _ = x.q.shape
    page = x.k_cache.shape[1]
    cfg = config or mla_config(Hq, page, arch(device))
    reason = mla_unsupported(x, cfg)
    if reason:
        raise ValueError(f"MLA decode kernel: {reason}")
    if cfg.impl not in MLA_IMPLS:
        raise ValueError(f"MLA decode kernel {cfg.impl!r}: one of {', '.join(MLA_IMPLS)}")
    if cfg.impl != "triton" and gluon_unsupported_for(x, cfg):
        cfg = replace(cfg, impl="triton")
    if any(n != 1 for n in x.q_lens_host) or T != len(x.seq_lens_host):
        raise ValueError("decode takes exactly one query per request")
    if deterministic and split_tile % cfg.block_n:
        raise ValueError(f"split_tile ({split_tile}) must be a multiple of block_n ({cfg.block_n})")
    units = -(-Hq // cfg.block_h)
    visible = [L - max(0, L - 1 - x.window) if x.window >= 0 else L for L in x.seq_lens_host]
    if deterministic:
        chunk = split_tile
    else:
        sms = num_sms or sm_count(device)
        key_bytes = (D_LATENT + D_ROPE) * x.k_cache.element_size()
        partial_keys = -(-cfg.block_h * (D_LATENT + 2) * 4 // key_bytes) * PARTIAL_WEIGHT[cfg.impl]
        n = splits or mla_splits(visible, units, sms * WAVE_CTAS, cfg.block_n, partial_keys)
        chunk = -(-max(visible) // n)
        chunk = max(cfg.block_n, -(-chunk // cfg.block_n) * cfg.block_n)
    items, _ = split_schedule(
        list(x.seq_lens_host), x.window, units, cfg.block_n, 1, 1,
        min_chunk=chunk, deterministic=True, split_tile=chunk,
    )  # fmt: skip
    work_t, merge_t, part_o, part_ml, counts = split_tables(items, len(x.seq_lens_host), Hq, D_LATENT, device)
    W = work_t.shape[0]
    precise = False  # 16-bit queries only
    meta = dict(
        G=Hq, PAGE_SIZE=page, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, NUM_STAGES=cfg.num_stages,
        HAS_SOFTCAP=x.soft_cap > 0, HAS_SINKS=x.sinks is not None, PRECISE_EXP=precise, num_warps=cfg.num_warps,
        USE_TMA=cfg.use_tma, WARP_SPECIALIZE=cfg.warp_specialize,
    )  # fmt: skip
    # BLOCK_S fixed: the merge's summation order never depends on the batch. 4 partial rows a step, not
    # decode's 16: a [16, 512] fp32 tile held 96 registers a thread and the B32 L4096 merge (4096 programs
    # of two splits each) ran in six waves, 20 us under Nsight Compute beside the 94 us kernel
    # (reports/examples/h100-session18/ncu.md)
    merge_meta = dict(
        DV=D_LATENT, BLOCK_DV=D_LATENT, BLOCK_S=4, HAS_SINKS=x.sinks is not None, PRECISE_EXP=precise, num_warps=4
    )  # fmt: skip
    plan = DecodePlan(
        work_t,
        merge_t,
        part_o,
        part_ml,
        (units, W),
        (0 if merge_t is None else merge_t.shape[0], Hq),
        meta,
        merge_meta,
        counts,
        cfg,
    )
    plan.descriptors = make_descriptors(x, cfg)
    return arrange_merge(plan, cfg, units, device, trigger=False)  # the MLA kernels do not trigger


def _launches(x, plan) -> list[tuple]:
    """(kernel, grid, args, kwargs) of the attention launch and, when a request is split, the merge."""
    from attnbench.kernels.triton.common import LOG2E
    from attnbench.kernels.triton.decode import fused_args, merge_launch

    if plan.config.impl == "wgmma":
        from attnbench.kernels.triton.decode_mla_gluon import gluon_launches

        return gluon_launches(x, plan)
    if plan.config.impl == "ws":
        from attnbench.kernels.triton.decode_mla_ws import ws_launches

        return ws_launches(x, plan)
    q, k, o, lse = x.q, x.k_cache, x.o, x.lse
    sinks = x.sinks if x.sinks is not None else lse  # never read without sinks
    scale, cap = x.sm_scale, x.soft_cap
    lat, rope = plan.descriptors
    args = (
        q, k, lat, rope, x.kv_page_indices, x.kv_indptr, sinks, plan.work,
        o, lse, plan.part_o, plan.part_ml,
        scale * LOG2E, scale / cap if cap > 0 else 0.0, cap * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        o.stride(0), o.stride(1), lse.stride(0),
        plan.part_o.stride(0), plan.part_o.stride(1), plan.part_ml.stride(0), plan.part_ml.stride(1),
        *fused_args(plan),
    )  # fmt: skip
    out = [(_mla_decode_kernel, plan.grid, args, plan.meta)]
    if plan.merge is not None and not plan.fused:
        out.append(merge_launch(x.qo_indptr, plan, sinks, o, lse))
    return out


def bind_mla_decode(x, plan):
    """The decode of `x` under `plan` as a zero-argument call, kernels compiled and arguments bound now."""
    from attnbench.kernels.triton.common import bind_launches

    return bind_launches(_launches(x, plan), {"o": x.o, "lse": x.lse})
