"""GDN decode, streamed: each program walks its value columns in tiles, the next tile's state in flight
while the current one is computed (opt-in: the triton backend's `gdn_stream` knob; issue #34).

`gdn.gdn_recurrent` (the default) gives every program one `[K, BV]` slice of a state: one load, the
step, one store, so a program's DRAM traffic comes in a single burst between two dependent latencies
(the slot index, then the state). On an H200 (h200-session23) it moves the B256 state at 75% of DRAM
bandwidth where FlashInfer's decode, which streams state tiles through a two-stage pipeline, reaches
84%. Here a program owns `COLS` columns of one (request, v-head) and steps through them `BV` at a time;
the load of tile j + 1 is issued before tile j's step, so it overlaps the step and the store.

Measured, it loses (H200, reports/examples/h200-session24/gdnd, B256 H32 K=V=128): 325.9 us at 128
columns in steps of 32, 444.6 at 64 columns on 2 warps, 464.7 at 128 in steps of 16, 931.1 on one warp,
against 281.7 for the default kernel and 266.6 for FlashInfer in the same run. Profiled
(h200-session25/ncu-h200.md, 128 columns in steps of 16): 440.2 us at DRAM 50%, 71 registers,
occupancy 43%, stalled on long scoreboard (19.5 cycles per issue of 32): the prefetch does not keep
enough loads in flight. Kept as an opt-in variant with its numbers; not a default.

Same contract and math as `gdn.gdn_recurrent` with one step: q/k L2-normalised (q scaled), gates from
the raw a/b, decay, delta against the decayed state, output from the updated state; a negative pool
index reads a zero state and writes nothing back.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnbench.kernels.triton.gdn import _step
from attnbench.kernels.triton.gdn_common import INTERPRET, TL_DTYPES, gates, l2_normalized, recurrent_shapes, round_to
from attnbench.kernels.triton.limits import GDN_STREAM_COLS, GDN_STREAM_TILES


@triton.jit
def _gdn_decode_stream_kernel(
    q, k, v, a, b, A_log, dt_bias, pool, indices, o,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, COLS: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr,
):  # fmt: skip
    """One program: request i_n, v-head i_hv, columns [i_c * COLS, (i_c + 1) * COLS) in tiles of BV."""
    i_c, i_nh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    i_slot = tl.load(indices + i_n).to(tl.int64)
    valid = i_slot >= 0
    p_state = pool + (tl.maximum(i_slot, 0) * HV + i_hv) * K * V
    v0 = i_c * COLS

    # the first tile's state goes out before the step's inputs are loaded and normalised
    o_v = v0 + tl.arange(0, BV)
    m_h = m_k[:, None] & (o_v < V)[None, :] & valid
    b_next = tl.load(p_state + o_k[:, None] * V + o_v[None, :], mask=m_h, other=0, eviction_policy="evict_first")

    b_q = tl.load(q + i_n * stride_qt + i_h * stride_qh + o_k, mask=m_k, other=0).to(tl.float32)
    b_k = tl.load(k + i_n * stride_kt + i_h * stride_kh + o_k, mask=m_k, other=0).to(tl.float32)
    b_q = l2_normalized(b_q, 0, DT) * scale
    b_k = l2_normalized(b_k, 0, DT)
    b_A = tl.exp(tl.load(A_log + i_hv).to(tl.float32))
    b_dt = tl.load(dt_bias + i_hv).to(tl.float32)
    b_g, b_beta = gates(tl.load(a + i_n * HV + i_hv).to(tl.float32), tl.load(b + i_n * HV + i_hv).to(tl.float32),
                        b_A, b_dt)  # fmt: skip

    for j in tl.static_range(0, COLS, BV):
        o_v = v0 + j + tl.arange(0, BV)
        m_v = o_v < V
        m_h = m_k[:, None] & m_v[None, :]
        p_h = p_state + o_k[:, None] * V + o_v[None, :]
        b_h = b_next.to(tl.float32)
        if j + BV < COLS:  # the next tile's load, issued before this tile's step
            o_vn = o_v + BV
            m_hn = m_k[:, None] & (o_vn < V)[None, :] & valid
            b_next = tl.load(
                p_state + o_k[:, None] * V + o_vn[None, :], mask=m_hn, other=0, eviction_policy="evict_first"
            )
        b_v = tl.load(v + i_n * stride_vt + i_hv * stride_vh + o_v, mask=m_v, other=0).to(tl.float32)
        b_h, b_o = _step(b_h, b_q, b_k, b_v, b_g, b_beta)
        tl.store(o + (i_n * HV + i_hv) * V + o_v, round_to(b_o, DT, EMULATE), mask=m_v)
        tl.store(p_h, b_h, mask=m_h & valid, eviction_policy="evict_first")


def gdn_decode_stream(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    pool: torch.Tensor,
    indices: torch.Tensor,
    o: torch.Tensor,
    *,
    scale: float,
    cols: int = 128,
    bv: int = 16,
    num_warps: int = 4,
) -> None:
    """One decode step of every request, written back to its pool slot.

    Args:
        q, k: `[B, H, K]`; v: `[B, HV, V]` (any token/head strides, the last dim contiguous: packed decode
            passes views of mixed_qkv); a, b: `[B, HV]` raw gates; A_log, dt_bias: `[HV]`.
        pool: `[N, HV, K, V]` fp32; indices: `[B]` (negative: padding, reads zeros, writes nothing).
        o: `[B, HV, V]` contiguous output.
        cols: value columns per program (`GDN_STREAM_COLS`); bv: columns per step of its walk (`GDN_STREAM_TILES`,
            at most `cols`).
    """
    if cols not in GDN_STREAM_COLS or bv not in GDN_STREAM_TILES or bv > cols:
        raise ValueError(
            f"gdn_decode_stream: cols in {GDN_STREAM_COLS}, bv in {GDN_STREAM_TILES} and bv <= cols; got {cols}, {bv}"
        )
    B, H, K, HV, V = recurrent_shapes(q, k, v, a, b, pool, indices, o)
    cols = min(cols, max(bv, triton.next_power_of_2(V)))  # a program never walks past V by more than a tile
    grid = (triton.cdiv(V, cols), B * HV)
    _gdn_decode_stream_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, pool, indices, o,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        scale,
        H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=bv, COLS=cols, DT=TL_DTYPES[o.dtype],
        EMULATE=INTERPRET, num_warps=num_warps, num_stages=1,
    )  # fmt: skip
