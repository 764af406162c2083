"""Speculative commit for GDN in Triton: the verify buffers' entries of each request's last accepted token
into its pool slots (the recurrent state and the conv window of one slot, in one launch).

One program per (request, block of BLOCK elements) copies its block of the request's `[HV, K, V]` fp32
state and of its `[dim, W-1]` conv window; a request with no accepted token or a padding slot does
nothing, so its slots (and every spare slot) stay bitwise as they were. Plain loads and stores: copies
are exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnbench.kernels.triton.gdn_common import pool_is_k_last


@triton.jit
def _gdn_commit_kernel(
    # Pointers
    inter_states, inter_windows, last_accepted, pool, conv_states, indices,
    # Sizes
    T, S_NUMEL, C_NUMEL, K: tl.constexpr, V: tl.constexpr,
    # Meta-parameters
    BLOCK: tl.constexpr, POOL_VK: tl.constexpr,
):  # fmt: skip
    i_n, i_b = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i_slot = tl.load(indices + i_n).to(tl.int64)
    i_last = tl.load(last_accepted + i_n).to(tl.int64)
    if (i_slot >= 0) & (i_last >= 0):
        o_x = i_b * BLOCK + tl.arange(0, BLOCK)
        m_s, m_c = o_x < S_NUMEL, o_x < C_NUMEL
        i_step = i_n * T + i_last
        b_s = tl.load(inter_states + i_step * S_NUMEL + o_x, mask=m_s)
        if POOL_VK:  # entry (hv, k, v) of the canonical intermediate state goes to (hv, v, k) of the slot
            o_kv = o_x % (K * V)
            o_p = o_x - o_kv + (o_kv % V) * K + o_kv // V
        else:
            o_p = o_x
        tl.store(pool + i_slot * S_NUMEL + o_p, b_s, mask=m_s)
        b_c = tl.load(inter_windows + i_step * C_NUMEL + o_x, mask=m_c)
        tl.store(conv_states + i_slot * C_NUMEL + o_x, b_c, mask=m_c)


def gdn_commit(
    inter_states: torch.Tensor,
    inter_windows: torch.Tensor,
    last_accepted: torch.Tensor,
    pool: torch.Tensor,
    conv_states: torch.Tensor,
    indices: torch.Tensor,
    pool_layout: str = "kv",
) -> None:
    """Writes `pool[indices[b]] = inter_states[b, last_accepted[b]]` and the same for the conv window,
    where both indices are >= 0.

    Args:
        inter_states: `[B, T, HV, K, V]` fp32; inter_windows: `[B, T, dim, W-1]`; last_accepted: `[B]` int32
            (-1: none accepted); pool: `[N, HV, K, V]` fp32; conv_states: `[N, dim, W-1]`; indices: `[B]`
            int32 (negative: padding).
        pool_layout: "kv" (the pool as above) or "vk" (`[N, HV, V, K]`, K-last: the copy transposes each
            state, its stores strided; the intermediate states stay `[.., K, V]`).
    """
    for t in (inter_states, inter_windows, pool, conv_states, last_accepted, indices):
        assert t.is_contiguous()
    B, T = inter_states.shape[0], inter_states.shape[1]
    K, V = inter_states.shape[-2:]
    k_last = pool_is_k_last(pool, pool_layout, K, V)
    s_numel, c_numel = pool[0].numel(), conv_states[0].numel()
    BLOCK = 1024
    grid = (B, triton.cdiv(max(s_numel, c_numel), BLOCK))
    _gdn_commit_kernel[grid](
        inter_states, inter_windows, last_accepted, pool, conv_states, indices, T, s_numel, c_numel, K, V,
        BLOCK=BLOCK, POOL_VK=k_last, num_warps=4,
    )  # fmt: skip
