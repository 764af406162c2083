"""GDN decode on a K-last state pool `[N, HV, V, K]`: the triton backend's gdn_decode since our four GDN state
kernels moved to the K-last pool together (`gdn_layout`, default vk; `gdn_vk` rows per program, 8 on one warp by
default; issue #34). On an H200 it runs at 0.97-0.99 of FlashInfer from B8 on and ahead of it at B1, 3-13% ahead
of the canonical-pool kernel (reports/examples/h200-session26/gdnlayout; kernels/triton/NOTES.md).

The default kernel (`gdn.gdn_recurrent`) reads the canonical `[N, HV, K, V]` pool: a program's `[K, BV]`
slice is K rows of BV * 4 bytes, one every V * 4 bytes. SGLang's and FlashInfer's decode kernels keep the
pool K-last (`[.., V, K]`, kernels/native_states.py), so a program's `BV` value rows are one contiguous
block of BV * K * 4 bytes. On an H200 FlashInfer's kernel moves the B256 H32 state at 82% of DRAM
bandwidth with 16-row tiles in 65536 CTAs of 128 threads and 40 registers (occupancy 72%); ours at 72%
with 163 registers (occupancy 18%) (reports/examples/h200-session24/ncu-h200.md). This kernel is the
same step on that layout, with FlashInfer-sized programs (`bv` value rows, default 16): the experiment
of whether layout and program size are what separates the two.

A canonical pool is converted once in `prepare` and written back by the closure's `finalize` (untimed), as
the FlashInfer and SGLang adapters do; a gdn_chain's K-last pool is used as it is. Same contract and math as `gdn.gdn_recurrent` with one step: q/k
L2-normalised (q scaled), gates from the raw a/b, decay, delta against the decayed state, output from
the updated state; a negative pool index reads a zero state and writes nothing back.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnbench.kernels.triton.gdn import _step_inputs
from attnbench.kernels.triton.gdn_common import INTERPRET, TL_DTYPES, pool_is_k_last, recurrent_shapes, round_to
from attnbench.kernels.triton.limits import GDN_VK_TILES


@triton.jit
def _gdn_decode_vk_kernel(
    q, k, v, a, b, A_log, dt_bias, pool, indices, o,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr,
):  # fmt: skip
    """One program: request i_n, v-head i_hv, value rows [i_v * BV, (i_v + 1) * BV) of its `[V, K]` state."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    i_slot = tl.load(indices + i_n).to(tl.int64)
    valid = i_slot >= 0
    m_h = m_v[:, None] & m_k[None, :]
    # the rows of this program: one contiguous block of the state (read once, written once: past L2)
    p_h = pool + (tl.maximum(i_slot, 0) * HV + i_hv) * V * K + o_v[:, None] * K + o_k[None, :]
    b_h = tl.load(p_h, mask=m_h & valid, other=0, eviction_policy="evict_first").to(tl.float32)

    b_A = tl.exp(tl.load(A_log + i_hv).to(tl.float32))
    b_dt = tl.load(dt_bias + i_hv).to(tl.float32)
    b_q, b_k, b_v, b_g, b_beta = _step_inputs(
        q, k, v, a, b, i_n, i_h, i_hv, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
        o_k, o_v, m_k, m_v, scale, b_A, b_dt, HV, DT,
    )  # fmt: skip

    b_h = b_h * tl.exp(b_g)  # decay first
    b_u = b_beta * (b_v - tl.sum(b_h * b_k[None, :], 1))  # delta against the decayed state
    b_h = b_h + b_u[:, None] * b_k[None, :]
    b_o = tl.sum(b_h * b_q[None, :], 1)  # output from the updated state
    tl.store(o + (i_n * HV + i_hv) * V + o_v, round_to(b_o, DT, EMULATE), mask=m_v)
    tl.store(p_h, b_h, mask=m_h & valid, eviction_policy="evict_first")


def gdn_decode_vk(
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
    bv: int = 16,
    num_warps: int = 4,
) -> None:
    """One decode step of every request, written back to its slot of the K-last pool.

    Args:
        q, k: `[B, H, K]`; v: `[B, HV, V]` (any token/head strides, the last dim contiguous: packed decode
            passes views of mixed_qkv); a, b: `[B, HV]` raw gates; A_log, dt_bias: `[HV]`.
        pool: `[N, HV, V, K]` fp32 (K-last; kernels/native_states.py converts the canonical one);
            indices: `[B]` (negative: padding, reads zeros, writes nothing).
        o: `[B, HV, V]` contiguous output.
        bv: value rows per program (`GDN_VK_TILES`).
    """
    if bv not in GDN_VK_TILES:
        raise ValueError(f"gdn_decode_vk: bv in {GDN_VK_TILES}; got {bv}")
    B, H, K, HV, V = recurrent_shapes(q, k, v, a, b, pool, indices, o)
    pool_is_k_last(pool, "vk", K, V)
    grid = (triton.cdiv(V, bv), B * HV)
    _gdn_decode_vk_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, pool, indices, o,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        scale,
        H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=bv, DT=TL_DTYPES[o.dtype],
        EMULATE=INTERPRET, num_warps=num_warps, num_stages=1,
    )  # fmt: skip
