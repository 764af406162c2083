"""Causal depthwise conv1d + SiLU for GDN in Triton: the varlen prefill form, the one-token update and
speculative verify.

Layouts (canonical, see attnbench.ops.gdn): token-major `x [T, dim]`, `weight [dim, W]`, `bias [dim]`,
conv states `[N, dim, W-1]` (the last W-1 raw inputs per slot) addressed by `cache_indices [B]`.

Prefill: one program per (request, block of BT tokens, block of BD channels). Tap j of token t reads
`x~[t - (W-1) + j]`, where `x~ = [state | x]`; only the first token block of a request reaches into
the state (BT >= W-1), so that program alone rewrites the request's state after it has read it.
Widths 2..4 (the state's columns are held in three registers).

Verify: one program per (request, block of BD channels) steps through the request's draft tokens with
the window in registers, stores the window after every token to `intermediate_conv_windows` and never
writes the pool; with `parents` each step reloads its parent's window from that buffer (stored by this
same program in an earlier step) or the pool's for a root.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnbench.kernels.triton.gdn_common import INTERPRET, TL_DTYPES, round_to


@triton.jit
def _conv1d_prefill_kernel(
    # Pointers
    x, weight, bias, states, cache_indices, has_initial_state, query_start_loc, y,
    # Sizes
    D, W: tl.constexpr,
    # Meta-parameters
    BT: tl.constexpr, BD: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr,
):  # fmt: skip
    i_n, i_t, i_d = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos = tl.load(query_start_loc + i_n).to(tl.int64)
    eos = tl.load(query_start_loc + i_n + 1).to(tl.int64)
    n = eos - bos
    if i_t * BT < n:
        i_slot = tl.load(cache_indices + i_n).to(tl.int64)
        init = tl.load(has_initial_state + i_n) != 0
        o_t = i_t * BT + tl.arange(0, BT)  # positions inside the request
        o_d = i_d * BD + tl.arange(0, BD)
        m_t, m_d = o_t < n, o_d < D
        p_x, p_y = x + bos * D, y + bos * D
        p_state = states + i_slot * D * (W - 1) + o_d * (W - 1)  # [BD] row starts of this slot's channels
        # the state's columns (up to 3), read once; a tap reaching before the request selects one of them
        b_s0 = tl.load(p_state, mask=m_d & init, other=0).to(tl.float32)
        b_s1 = tl.load(p_state + min(1, W - 2), mask=m_d & init, other=0).to(tl.float32)
        b_s2 = tl.load(p_state + min(2, W - 2), mask=m_d & init, other=0).to(tl.float32)

        b_bias = tl.load(bias + o_d, mask=m_d, other=0).to(tl.float32)
        b_y = tl.zeros([BT, BD], dtype=tl.float32) + b_bias[None, :]
        for j in tl.static_range(W):
            pos = o_t - (W - 1) + j  # position in the request; < 0 reaches into the state
            m_x = m_t[:, None] & m_d[None, :] & (pos >= 0)[:, None]
            b_x = tl.load(p_x + pos[:, None] * D + o_d[None, :], mask=m_x, other=0).to(tl.float32)
            col = (pos + (W - 1))[:, None]
            b_s = tl.where(col == 0, b_s0[None, :], tl.where(col == 1, b_s1[None, :], b_s2[None, :]))
            b_x = tl.where((pos < 0)[:, None], b_s, b_x)
            b_w = tl.load(weight + o_d * W + j, mask=m_d, other=0).to(tl.float32)
            b_y += b_x * b_w[None, :]
        b_y = b_y / (1.0 + tl.exp(-b_y))  # SiLU
        tl.store(
            p_y + o_t[:, None] * D + o_d[None, :],
            round_to(b_y, DT, EMULATE),
            mask=m_t[:, None] & m_d[None, :],
        )

        if i_t == 0:  # new state: the last W-1 rows of [state | x]; this program has finished reading it
            tl.debug_barrier()
            for c in tl.static_range(W - 1):
                src = n - (W - 1) + c  # position of the input that becomes state column c
                b_xs = tl.load(x + (bos + src) * D + o_d, mask=m_d & (src >= 0), other=0)
                b_ss = tl.load(p_state + tl.maximum(src + (W - 1), 0), mask=m_d & (src < 0) & init, other=0)
                tl.store(p_state + c, tl.where(src >= 0, b_xs, b_ss), mask=m_d)


@triton.jit
def _conv1d_update_kernel(
    # Pointers
    x, weight, bias, states, cache_indices, y,
    # Sizes
    D, W: tl.constexpr,
    # Meta-parameters
    BD: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr,
):  # fmt: skip
    i_n, i_d = tl.program_id(0).to(tl.int64), tl.program_id(1)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    i_slot = tl.load(cache_indices + i_n).to(tl.int64)
    valid = i_slot >= 0  # padding: a zero window, no slot read or written, its output row unspecified
    m_s = m_d & valid
    p_state = states + tl.maximum(i_slot, 0) * D * (W - 1) + o_d * (W - 1)
    b_x = tl.load(x + i_n * D + o_d, mask=m_d, other=0)
    b_y = tl.load(bias + o_d, mask=m_d, other=0).to(tl.float32)
    b_y += b_x.to(tl.float32) * tl.load(weight + o_d * W + (W - 1), mask=m_d, other=0).to(tl.float32)
    for j in tl.static_range(W - 1):
        b_s = tl.load(p_state + j, mask=m_s, other=0)
        b_y += b_s.to(tl.float32) * tl.load(weight + o_d * W + j, mask=m_d, other=0).to(tl.float32)
        if j > 0:
            tl.store(p_state + (j - 1), b_s, mask=m_s)  # shift left; column j was read above
    tl.store(p_state + (W - 2), b_x, mask=m_s)
    b_y = b_y / (1.0 + tl.exp(-b_y))
    tl.store(y + i_n * D + o_d, round_to(b_y, DT, EMULATE), mask=m_d)


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    conv_states: torch.Tensor,
    cache_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    y: torch.Tensor,
    max_len: int,
) -> None:
    """Varlen prefill: `x [T, dim]` packed by `query_start_loc [B+1]`; writes `y [T, dim]` and the states.

    `max_len` (host int) is the longest request: it sizes the grid.
    """
    assert x.is_contiguous() and y.is_contiguous() and conv_states.is_contiguous() and weight.is_contiguous()
    D, W = weight.shape
    B = cache_indices.shape[0]
    BT, BD = 32, min(64, triton.next_power_of_2(D))
    assert BT >= W - 1 and 2 <= W <= 4, "width 2..4"
    grid = (B, triton.cdiv(max(max_len, 1), BT), triton.cdiv(D, BD))
    _conv1d_prefill_kernel[grid](
        x, weight, bias, conv_states, cache_indices, has_initial_state, query_start_loc, y, D, W=W,
        BT=BT, BD=BD, DT=TL_DTYPES[y.dtype], EMULATE=INTERPRET, num_warps=4,
    )  # fmt: skip


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    conv_states: torch.Tensor,
    cache_indices: torch.Tensor,
    y: torch.Tensor,
) -> None:
    """One decode token per request, `x [B, dim]`, against its slot's state; writes `y [B, dim]` and it.
    A slot of -1 is padding (a CUDA-graph-padded batch): no slot is read or written for it."""
    assert x.is_contiguous() and y.is_contiguous() and conv_states.is_contiguous() and weight.is_contiguous()
    D, W = weight.shape
    B = cache_indices.shape[0]
    BD = min(256, triton.next_power_of_2(D))
    _conv1d_update_kernel[(B, triton.cdiv(D, BD))](
        x, weight, bias, conv_states, cache_indices, y, D, W=W, BD=BD, DT=TL_DTYPES[y.dtype],
        EMULATE=INTERPRET, num_warps=4,
    )  # fmt: skip


@triton.jit
def _conv1d_verify_kernel(
    # Pointers
    x, weight, bias, states, cache_indices, parents, windows, y,
    # Sizes
    D, T: tl.constexpr, W: tl.constexpr,
    # Meta-parameters
    BD: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr, USE_PARENTS: tl.constexpr,
):  # fmt: skip
    i_n, i_d = tl.program_id(0).to(tl.int64), tl.program_id(1)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    i_slot = tl.load(cache_indices + i_n).to(tl.int64)
    valid = i_slot >= 0  # padding: a zero window, nothing read from the pool, its outputs unspecified
    p_state = states + tl.maximum(i_slot, 0) * D * (W - 1) + o_d * (W - 1)
    # the pool's window (up to 3 columns, raw inputs in their own dtype: windows are exact copies)
    b_p0 = tl.load(p_state, mask=m_d & valid, other=0)
    b_p1 = tl.load(p_state + min(1, W - 2), mask=m_d & valid, other=0)
    b_p2 = tl.load(p_state + min(2, W - 2), mask=m_d & valid, other=0)
    b_w0 = tl.load(weight + o_d * W, mask=m_d, other=0).to(tl.float32)
    b_w1 = tl.load(weight + o_d * W + min(1, W - 1), mask=m_d, other=0).to(tl.float32)
    b_w2 = tl.load(weight + o_d * W + min(2, W - 1), mask=m_d, other=0).to(tl.float32)
    b_wx = tl.load(weight + o_d * W + (W - 1), mask=m_d, other=0).to(tl.float32)  # the newest input's tap
    b_bias = tl.load(bias + o_d, mask=m_d, other=0).to(tl.float32)
    b_c0, b_c1, b_c2 = b_p0, b_p1, b_p2  # the window before the current token
    for t in range(T):
        i_tok = i_n * T + t
        if USE_PARENTS:
            i_par = tl.load(parents + i_tok)
            tl.debug_barrier()  # the parent's window was stored by this program's threads in an earlier step
            p_par = windows + ((i_n * T + tl.maximum(i_par, 0)) * D + o_d) * (W - 1)
            m_par = m_d & (i_par >= 0)
            b_c0 = tl.where(i_par >= 0, tl.load(p_par, mask=m_par, other=0), b_p0)
            b_c1 = tl.where(i_par >= 0, tl.load(p_par + min(1, W - 2), mask=m_par, other=0), b_p1)
            b_c2 = tl.where(i_par >= 0, tl.load(p_par + min(2, W - 2), mask=m_par, other=0), b_p2)
        b_x = tl.load(x + i_tok * D + o_d, mask=m_d, other=0)
        b_y = b_bias + b_c0.to(tl.float32) * b_w0
        if W >= 3:
            b_y += b_c1.to(tl.float32) * b_w1
        if W >= 4:
            b_y += b_c2.to(tl.float32) * b_w2
        b_y += b_x.to(tl.float32) * b_wx
        b_y = b_y / (1.0 + tl.exp(-b_y))  # SiLU
        tl.store(y + i_tok * D + o_d, round_to(b_y, DT, EMULATE), mask=m_d)
        # the window after this token: drop the oldest input, append x
        if W == 2:
            b_c0 = b_x
        elif W == 3:
            b_c0, b_c1 = b_c1, b_x
        else:
            b_c0, b_c1, b_c2 = b_c1, b_c2, b_x
        p_win = windows + (i_tok * D + o_d) * (W - 1)
        tl.store(p_win, b_c0, mask=m_d)
        if W >= 3:
            tl.store(p_win + 1, b_c1, mask=m_d)
        if W >= 4:
            tl.store(p_win + 2, b_c2, mask=m_d)


def causal_conv1d_verify(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    conv_states: torch.Tensor,
    cache_indices: torch.Tensor,
    windows: torch.Tensor,
    y: torch.Tensor,
    parents: torch.Tensor | None = None,
) -> None:
    """Speculative verify: `x [B * T, dim]` (token b * T + t) from each request's pool window (-1:
    padding); writes `y [B * T, dim]` and `windows [B, T, dim, W-1]`, the window after every token.
    `parents [B, T]` int32 (a tree; -1 = the pool window) or None (the chain). The pool is only read."""
    assert x.is_contiguous() and y.is_contiguous() and windows.is_contiguous() and conv_states.is_contiguous()
    assert weight.is_contiguous() and (parents is None or parents.is_contiguous())
    D, W = weight.shape
    B, T = windows.shape[0], windows.shape[1]
    assert 2 <= W <= 4, "width 2..4"
    BD = min(256, triton.next_power_of_2(D))
    _conv1d_verify_kernel[(B, triton.cdiv(D, BD))](
        x, weight, bias, conv_states, cache_indices, parents if parents is not None else cache_indices, windows, y,
        D, T=T, W=W, BD=BD, DT=TL_DTYPES[y.dtype], EMULATE=INTERPRET, USE_PARENTS=parents is not None,
        num_warps=4,
    )  # fmt: skip
