"""Merging two partial attention states by their LSEs (Triton).

For each (token, head): `o = (v_a e^{s_a} + v_b e^{s_b}) / (e^{s_a} + e^{s_b})`, `lse = log(e^{s_a} +
e^{s_b})`, natural log. An LSE of -inf (or +inf, as SGLang treats it) is an empty state; two empty
states merge to o = 0, lse = -inf.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from attnbench.kernels.triton.common import bind_launch


@triton.jit
def _merge_state_kernel(
    # Inputs
    v_a, s_a, v_b, s_b,
    # Outputs
    o, lse,
    # Sizes and strides (last dims are contiguous)
    H, stride_vat, stride_vah, stride_vbt, stride_vbh, stride_sat, stride_sbt,
    stride_ot, stride_oh, stride_lt,
    # Meta-parameters
    D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    i_t, i_hb = tl.program_id(0), tl.program_id(1)
    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    o_d = tl.arange(0, BLOCK_D)
    m_hd = m_h[:, None] & (o_d < D)[None, :]

    # the row scalars in fp64 (exact exp/log, one rounding of the LSE); the weights then in fp32
    b_sa = tl.load(s_a + i_t * stride_sat + o_h, mask=m_h, other=float("-inf")).to(tl.float64)
    b_sb = tl.load(s_b + i_t * stride_sbt + o_h, mask=m_h, other=float("-inf")).to(tl.float64)
    b_sa = tl.where(b_sa == float("inf"), float("-inf"), b_sa)
    b_sb = tl.where(b_sb == float("inf"), float("-inf"), b_sb)
    b_m = tl.maximum(b_sa, b_sb)
    b_m = tl.where(b_m == float("-inf"), 0.0, b_m)
    b_wa = tl.exp(b_sa - b_m)
    b_wb = tl.exp(b_sb - b_m)
    b_total = b_wa + b_wb
    b_seen = b_total > 0
    b_inv = tl.where(b_seen, 1.0 / tl.where(b_seen, b_total, 1.0), 0.0)
    b_lse = tl.where(b_seen, b_m + tl.log(tl.where(b_seen, b_total, 1.0)), float("-inf"))
    b_fa = (b_wa * b_inv).to(tl.float32)
    b_fb = (b_wb * b_inv).to(tl.float32)
    # an empty side has weight 0; its values (possibly garbage) must not be read into the sum
    b_va = tl.load(v_a + i_t * stride_vat + o_h[:, None] * stride_vah + o_d[None, :], mask=m_hd, other=0.0)
    b_vb = tl.load(v_b + i_t * stride_vbt + o_h[:, None] * stride_vbh + o_d[None, :], mask=m_hd, other=0.0)
    b_va = tl.where((b_fa > 0)[:, None], b_va.to(tl.float32), 0.0)
    b_vb = tl.where((b_fb > 0)[:, None], b_vb.to(tl.float32), 0.0)
    b_o = b_va * b_fa[:, None] + b_vb * b_fb[:, None]
    p_o = o + i_t * stride_ot + o_h[:, None] * stride_oh + o_d[None, :]
    tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_hd)
    tl.store(lse + i_t * stride_lt + o_h, b_lse.to(tl.float32), mask=m_h)


def _launch(v_a, s_a, v_b, s_b, o, lse) -> tuple:
    T, H, D = v_a.shape
    shapes = [tuple(t.shape) for t in (v_a, v_b, o, s_a, s_b, lse)]
    if shapes != [(T, H, D)] * 3 + [(T, H)] * 3:
        raise ValueError(f"expected v_a, v_b, o [T, H, D] and s_a, s_b, lse [T, H], got {shapes}")
    block_d = max(16, triton.next_power_of_2(D))
    block_h = max(1, min(triton.next_power_of_2(H), 4096 // block_d))
    grid = (T, triton.cdiv(H, block_h))
    args = (
        v_a, s_a, v_b, s_b, o, lse,
        H, v_a.stride(0), v_a.stride(1), v_b.stride(0), v_b.stride(1), s_a.stride(0), s_b.stride(0),
        o.stride(0), o.stride(1), lse.stride(0),
    )  # fmt: skip
    meta = dict(D=D, BLOCK_H=block_h, BLOCK_D=block_d, num_warps=4 if block_h * block_d >= 2048 else 2)
    return _merge_state_kernel, grid, args, meta


def merge_state(
    v_a: torch.Tensor,
    s_a: torch.Tensor,
    v_b: torch.Tensor,
    s_b: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge partial states `(v_a, s_a)` and `(v_b, s_b)` into `o`, `lse` (written in place).

    Args:
        v_a, v_b: `[T, H, D]` normalised partial outputs (any float dtype; last dim contiguous).
        s_a, s_b: `[T, H]` fp32 natural-log LSEs, -inf for an empty state.
        o: `[T, H, D]` output; lse: `[T, H]` fp32 output.

    Returns:
        `(o, lse)`.
    """
    fn, grid, args, kwargs = _launch(v_a, s_a, v_b, s_b, o, lse)
    fn[grid](*args, **kwargs)
    return o, lse


def bind_merge_state(v_a, s_a, v_b, s_b, o, lse) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """`merge_state(...)` as a zero-argument call with its kernel compiled and arguments bound now."""
    call = bind_launch(*_launch(v_a, s_a, v_b, s_b, o, lse))

    def run():
        call()
        return o, lse

    return run
