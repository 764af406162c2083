"""Helpers shared by the GDN Triton kernels: rounding, matmuls, gates, the interpreter switch.

Under `TRITON_INTERPRET=1` (the CPU lane) two things differ from a GPU, and the helpers hide both:
the interpreter's float32 -> bfloat16 conversion truncates (a GPU rounds to nearest even), and its
`tl.dot` on bfloat16 operands returns garbage (triton 3.6). So with `EMULATE` the kernels round with
an explicit round-to-nearest-even and feed float32 operands that hold the rounded values to an IEEE
float32 dot. Products of bf16/fp16 values are exact in float32, so this is the same math as a
tensor-core dot on the rounded operands; only the accumulation order differs.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from attnbench.kernels.triton.limits import interpreting

INTERPRET = interpreting()
L2_EPS = tl.constexpr(1e-6)  # q / sqrt(sum q^2 + eps), as FLA and SGLang

TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


AUTOTUNE = os.environ.get("ATTNBENCH_TRITON_AUTOTUNE", "1") != "0"


def autotune_configs(configs: list[triton.Config]) -> list[triton.Config]:
    """All configs on a GPU; the first only in the interpreter (autotuning needs a driver) or when
    ATTNBENCH_TRITON_AUTOTUNE=0 (correctness runs: one compile per shape instead of one per config)."""
    return configs if AUTOTUNE and not INTERPRET else configs[:1]


def recurrent_shapes(q, k, v, a, b, pool, indices, o) -> tuple[int, int, int, int, int]:
    """`(B, H, K, HV, V)` of a recurrence launch (q, k `[tokens, H, K]`, v `[tokens, HV, V]`, indices
    `[B]`), after the layout its kernels assume: q/k/v head dims contiguous (any token and head strides:
    packed decode passes views of mixed_qkv), o, pool and the gates contiguous."""
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1, "the head dims must be contiguous"
    assert o.is_contiguous() and pool.is_contiguous() and a.is_contiguous() and b.is_contiguous()
    return indices.shape[0], q.shape[1], q.shape[2], v.shape[1], v.shape[2]


POOL_LAYOUTS = {"kv": "canonical [N, HV, K, V]", "vk": "K-last [N, HV, V, K]"}  # kernels/native_states.py


def pool_is_k_last(pool, layout: str, K: int, V: int) -> bool:
    """Whether a launch addresses `pool` K-last (`layout` "vk") or canonically ("kv"), after checking
    that its last two dims are that layout's (`[V, K]` or `[K, V]`): the kernels' `POOL_VK`."""
    dims = {"kv": (K, V), "vk": (V, K)}[layout]
    assert pool.shape[-2:] == dims, f"a {layout} pool is {POOL_LAYOUTS[layout]}; got {tuple(pool.shape)}"
    return layout == "vk"


@triton.jit
def pool_offsets(o_k, o_v, K: tl.constexpr, V: tl.constexpr, POOL_VK: tl.constexpr):
    """`[BK, BV]` offsets of state entries (k, v) inside one pool state: `[K, V]` (canonical) or, with
    POOL_VK, `[V, K]` (K-last, kernels/native_states.py)."""
    if POOL_VK:
        return o_v[None, :] * K + o_k[:, None]
    return o_k[:, None] * V + o_v[None, :]


@triton.jit
def round_to(x, DT: tl.constexpr, EMULATE: tl.constexpr):
    """`x` rounded to DT: a DT tensor on a GPU, a float32 tensor of DT values when emulating.

    Emulated bfloat16 rounding is round-to-nearest-even on the bits (finite inputs), inline because
    every nested jit call is expensive in the interpreter.
    """
    if EMULATE:
        if DT == tl.bfloat16:
            bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            return bits.to(tl.float32, bitcast=True)
        else:
            return x.to(DT).to(tl.float32)
    else:
        return x.to(DT)


@triton.jit
def mm(a, b, EMULATE: tl.constexpr, IEEE: tl.constexpr):
    """a @ b with float32 accumulation; operands come from `round_to` (IEEE: float32 operands)."""
    if EMULATE or IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def exp_in(x, DT: tl.constexpr, EMULATE: tl.constexpr):
    """e^x in a kernel whose inputs are DT, x rounded to float32 first (float32 inputs keep gamma in
    float64, `gdn_chunk.gamma_dtype`, so a difference of gammas is rounded once). On a GPU `tl.exp` is
    ex2.approx of x log2(e), a few ulp off: noise beside bf16/fp16 rounding, not beside a float32 twin,
    so float32 inputs take libdevice's exp there. The interpreter's tl.exp is numpy's (no libdevice)."""
    x = x.to(tl.float32)
    if DT == tl.float32 and not EMULATE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def l2_normalized(x, AXIS: tl.constexpr, DT: tl.constexpr):
    """x / sqrt(sum x^2 + eps) along AXIS. For float32 inputs the square root and the division are
    IEEE-rounded (on a GPU `tl.sqrt` and `/` are sqrt.approx and div.full; `exp_in` says why)."""
    ss = tl.sum(x * x, AXIS) + L2_EPS
    if DT == tl.float32:
        return tl.div_rn(x, tl.broadcast_to(tl.expand_dims(tl.sqrt_rn(ss), AXIS), x.shape))
    else:
        return x / tl.expand_dims(tl.sqrt(ss), AXIS)  # the root before the broadcast: bf16 SASS as before


@triton.jit
def softplus(x):
    """log(1 + exp(x)), x itself above 20; log1p computed without cancellation (Goldberg's trick)."""
    e = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + e
    lp = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))
    return tl.where(x > 20.0, x, lp)


@triton.jit
def gates(a, b, A, dt_bias):
    """(g, beta) = (-A * softplus(a + dt_bias), sigmoid(b)), A = exp(A_log); float32."""
    return -A * softplus(a + dt_bias), 1.0 / (1.0 + tl.exp(-b))
