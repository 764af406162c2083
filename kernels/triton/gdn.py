"""GDN Triton kernels, elementwise and recurrent: fused gating, decode (plain and packed) and verify.

- `gdn_gating`: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), fp32.
- `gdn_recurrent`: one program per (request, v-head, block of BV value columns) keeps its `[K, BV]`
  slice of the fp32 state in registers and steps through the request's tokens: gating from the raw
  inputs, L2 norm of q/k, decay, delta, output. Decode is one step with the state written back to
  the pool; packed decode is the same kernel reading q/k/v straight out of `mixed_qkv` rows through
  strides (no split copy); verify runs `T` steps, stores the state after each step to the
  intermediate buffer and leaves the pool alone, and with `parents` restarts every step from its
  parent's stored state.

A negative pool index reads a zero state and writes nothing back (its output rows are computed from
that zero state, as SGLang's kernel does).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from attnbench.kernels.triton.gdn_common import (
    INTERPRET,
    TL_DTYPES,
    autotune_configs,
    gates,
    l2_normalized,
    pool_is_k_last,
    pool_offsets,
    recurrent_shapes,
    round_to,
)


# ---- gating ---------------------------------------------------------------------------------------
@triton.jit
def _gdn_gating_kernel(
    # Pointers
    A_log, a, b, dt_bias, g, beta,
    # Sizes
    N, HV: tl.constexpr,
    # Meta-parameters
    BLOCK: tl.constexpr,
):  # fmt: skip
    o_x = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_x = o_x < N
    i_hv = o_x % HV
    b_A = tl.exp(tl.load(A_log + i_hv, mask=m_x, other=0).to(tl.float32))
    b_dt = tl.load(dt_bias + i_hv, mask=m_x, other=0).to(tl.float32)
    b_a = tl.load(a + o_x, mask=m_x, other=0).to(tl.float32)
    b_b = tl.load(b + o_x, mask=m_x, other=0).to(tl.float32)
    b_g, b_beta = gates(b_a, b_b, b_A, b_dt)
    tl.store(g + o_x, b_g, mask=m_x)
    tl.store(beta + o_x, b_beta, mask=m_x)


def gdn_gating(A_log, a, b, dt_bias, g, beta) -> None:
    """Writes `g`, `beta` `[T, HV]` fp32 from `a`, `b` `[T, HV]` and `A_log`, `dt_bias` `[HV]`."""
    assert a.is_contiguous() and b.is_contiguous() and g.is_contiguous() and beta.is_contiguous()
    N, HV = a.numel(), a.shape[-1]
    BLOCK = 1024
    grid = (triton.cdiv(N, BLOCK),)
    _gdn_gating_kernel[grid](A_log, a, b, dt_bias, g, beta, N, HV, BLOCK=BLOCK, num_warps=4)


# ---- the recurrence ---------------------------------------------------------------------------------
_RECURRENT_CONFIGS = autotune_configs(
    [
        triton.Config({"BV": 32}, num_warps=4),
        triton.Config({"BV": 16}, num_warps=2),
        triton.Config({"BV": 32}, num_warps=2),
        triton.Config({"BV": 64}, num_warps=4),
        triton.Config({"BV": 64}, num_warps=8),
        triton.Config({"BV": 8}, num_warps=1),
        triton.Config({"BV": 16}, num_warps=4),
        triton.Config({"BV": 128}, num_warps=8),
    ]
)


@triton.jit
def _step_inputs(
    q, k, v, a, b, i_tok, i_h, i_hv, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    o_k, o_v, m_k, m_v, scale, b_A, b_dt, HV: tl.constexpr, DT: tl.constexpr,
):  # fmt: skip
    """One token's inputs in float32: q^ (L2-normalised, scaled), k^ (L2-normalised), v, and its gates
    (g, beta) from the raw a, b. DT: the inputs' dtype (`l2_normalized`: IEEE rounding for float32)."""
    b_q = tl.load(q + i_tok * stride_qt + i_h * stride_qh + o_k, mask=m_k, other=0).to(tl.float32)
    b_k = tl.load(k + i_tok * stride_kt + i_h * stride_kh + o_k, mask=m_k, other=0).to(tl.float32)
    b_v = tl.load(v + i_tok * stride_vt + i_hv * stride_vh + o_v, mask=m_v, other=0).to(tl.float32)
    b_q = l2_normalized(b_q, 0, DT) * scale
    b_k = l2_normalized(b_k, 0, DT)
    b_a = tl.load(a + i_tok * HV + i_hv).to(tl.float32)
    b_b = tl.load(b + i_tok * HV + i_hv).to(tl.float32)
    b_g, b_beta = gates(b_a, b_b, b_A, b_dt)
    return b_q, b_k, b_v, b_g, b_beta


@triton.jit
def _step(b_h, b_q, b_k, b_v, b_g, b_beta):
    """One token of the gated delta rule on a `[BK, BV]` state slice: (the updated state, the output)."""
    b_h = b_h * tl.exp(b_g)  # decay first
    b_u = b_beta * (b_v - tl.sum(b_h * b_k[:, None], 0))  # delta against the decayed state
    b_h = b_h + b_k[:, None] * b_u[None, :]
    return b_h, tl.sum(b_h * b_q[:, None], 0)  # output from the updated state


@triton.autotune(configs=_RECURRENT_CONFIGS, key=["B_KEY", "T", "HV", "K", "V", "POOL_VK"], restore_value=["pool"])
@triton.jit
def _gdn_recurrent_kernel(
    # Pointers
    q, k, v, a, b, A_log, dt_bias, pool, indices, o, inter, parents,
    # Strides (elements) of the token and head dims of q, k, v; the last dim is contiguous
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    scale,
    B_KEY,
    # Sizes
    T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    # Meta-parameters
    BK: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr,
    WRITE_POOL: tl.constexpr, STORE_INTER: tl.constexpr, USE_PARENTS: tl.constexpr, POOL_VK: tl.constexpr,
):  # fmt: skip
    i_v, i_nh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    # offsets of this [BK, BV] slice inside one state, in the pool and `inter` alike: [K, V], or [V, K] with
    # POOL_VK (one layout for every state access: else the compiler converts the state between two register
    # layouts every step, a shared-memory round trip)
    o_h = pool_offsets(o_k, o_v, K, V, POOL_VK)

    i_slot = tl.load(indices + i_n).to(tl.int64)
    valid = i_slot >= 0
    p_pool = pool + (tl.maximum(i_slot, 0) * HV + i_hv) * K * V + o_h
    # the state is read once and written once: stream it past L2 (the pool is far larger than L2)
    b_h0 = tl.load(p_pool, mask=m_h & valid, other=0, eviction_policy="evict_first").to(tl.float32)
    b_h = b_h0
    b_A = tl.exp(tl.load(A_log + i_hv).to(tl.float32))
    b_dt = tl.load(dt_bias + i_hv).to(tl.float32)

    for t in range(T):
        i_tok = i_n * T + t
        if USE_PARENTS:
            i_par = tl.load(parents + i_tok)
            tl.debug_barrier()  # the parent's state was stored by this program's threads in an earlier step
            p_par = inter + ((i_n * T + tl.maximum(i_par, 0)) * HV + i_hv) * K * V + o_h
            b_hp = tl.load(p_par, mask=m_h & (i_par >= 0), other=0)
            b_h = tl.where(i_par >= 0, b_hp, b_h0)
        b_q, b_k, b_v, b_g, b_beta = _step_inputs(
            q, k, v, a, b, i_tok, i_h, i_hv, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
            o_k, o_v, m_k, m_v, scale, b_A, b_dt, HV, DT,
        )  # fmt: skip
        b_h, b_o = _step(b_h, b_q, b_k, b_v, b_g, b_beta)
        tl.store(o + (i_tok * HV + i_hv) * V + o_v, round_to(b_o, DT, EMULATE), mask=m_v)
        if STORE_INTER:
            tl.store(inter + (i_tok * HV + i_hv) * K * V + o_h, b_h, mask=m_h)

    if WRITE_POOL:
        tl.store(p_pool, b_h, mask=m_h & valid, eviction_policy="evict_first")


def gdn_recurrent(
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
    steps: int = 1,
    inter: torch.Tensor | None = None,
    parents: torch.Tensor | None = None,
    config: RecurrentConfig | None = None,
    pool_layout: str = "kv",
) -> None:
    """The recurrence over `steps` tokens per request (decode: 1; verify: draft tokens).

    Args:
        q, k: `[B * steps, H, K]` (any token/head strides; packed decode passes views of mixed_qkv);
        v: `[B * steps, HV, V]`; a, b: `[B * steps, HV]` raw gates; A_log, dt_bias: `[HV]`.
        pool: `[N, HV, K, V]` fp32; indices: `[B]` (negative = padding).
        o: `[B * steps, HV, V]` contiguous output.
        inter: `[B, steps, HV, K, V]` fp32: given (verify), the state after every step goes there and the
            pool is not written; None (decode): the final state is written back to the pool.
        parents: `[B, steps]` int32 (tree verify): step t starts from the state after step parents[t]
            (< t; -1: the pool state).
        config: None runs `_gdn_recurrent_kernel`; a `RecurrentConfig` runs the variant kernel with it.
        pool_layout: "kv" (the pool as above) or "vk" (`[N, HV, V, K]`, K-last); `inter` is in the same
            layout (`[B, steps, HV, V, K]` with "vk", as SGLang's verify writes its intermediate states).
    """
    B, H, K, HV, V = recurrent_shapes(q, k, v, a, b, pool, indices, o)
    k_last = pool_is_k_last(pool, pool_layout, K, V)
    if inter is not None:
        pool_is_k_last(inter, pool_layout, K, V)
    assert inter is not None or parents is None, "parents need the intermediate buffer"

    def grid(meta):
        return (triton.cdiv(V, meta["BV"]), B * HV)

    args = (
        q, k, v, a, b, A_log, dt_bias, pool, indices, o,
        inter if inter is not None else o, parents if parents is not None else indices,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        scale, B if B < 64 else B // 64 * 64,  # autotune per batch bucket
    )  # fmt: skip
    meta = dict(
        T=steps, H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), DT=TL_DTYPES[o.dtype], EMULATE=INTERPRET,
        WRITE_POOL=inter is None, STORE_INTER=inter is not None, USE_PARENTS=parents is not None,
        POOL_VK=k_last,
    )  # fmt: skip
    if config is None:
        _gdn_recurrent_kernel[grid](*args, **meta)
        return
    meta |= dict(
        BT=triton.next_power_of_2(steps), CARRY_REG=config.carry == "reg", PRELOAD=config.preload,
        INTER_POLICY=INTER_STORES[config.inter_store],
    )  # fmt: skip
    if config.tile is None:
        TUNED[config.tune][grid](*args, **meta)
    else:
        BV, num_warps, num_stages = config.tile
        _gdn_recurrent_variant_kernel[grid](*args, **meta, BV=BV, num_warps=num_warps, num_stages=num_stages)


def tuned_tile(config: RecurrentConfig | None) -> dict | None:
    """The tile Triton's autotuner chose for the kernel `gdn_recurrent(config=config)` launched last (BV,
    warps, stages); None where the tile is fixed (`config.tile`) or nothing ran yet. Read after a call,
    for the row's record: the choice depends on the device and on the timings of that process."""
    if config is not None and config.tile is not None:
        return None
    best = getattr(_gdn_recurrent_kernel if config is None else TUNED[config.tune], "best_config", None)
    if best is None:
        return None
    return {**best.kwargs, "num_warps": best.num_warps, "num_stages": best.num_stages}


# ---- opt-in variants of the recurrence (issue #34; off by default, chosen by backend knobs) ----------
@dataclass(frozen=True)
class RecurrentConfig:
    """What `_gdn_recurrent_variant_kernel` changes against `_gdn_recurrent_kernel` (kernels/triton/NOTES.md,
    "GDN decode and verify: opt-in variants"). `RecurrentConfig()` is today's kernel, step for step.

    - carry: "reload" (tree verify restarts every step from its parent's state, reloaded from `inter`
      behind a barrier) or "reg" (the state stays in registers when the parent is the previous step, the
      common case; only another parent is reloaded: from `inter`, or from the pool for a parent of -1).
    - preload: q, k, v, the gates (and the parents) of all steps are loaded, normalised and gated before
      the step loop, so the loop carries no dependent global loads.
    - inter_store: the cache policy of the `inter` stores: "" (default), "evict_first" or "cs"
      (streaming, `st.global.cs`).
    - tile: (BV, num_warps, num_stages) fixed, no autotuning; None: autotuned over `tune`'s configs.
    - tune: "" (the default kernel's configs) or "wide" (those, 1- and 2-warp tiles and more stage counts).
    """

    carry: str = "reload"
    preload: bool = False
    inter_store: str = ""
    tile: tuple[int, int, int] | None = None
    tune: str = ""

    def __post_init__(self):
        if self.carry not in ("reload", "reg"):
            raise ValueError(f"RecurrentConfig.carry must be 'reload' or 'reg', got {self.carry!r}")
        if self.inter_store not in INTER_STORES:
            raise ValueError(f"RecurrentConfig.inter_store: one of {sorted(INTER_STORES)}, not {self.inter_store!r}")
        if self.tune not in TUNED:
            raise ValueError(f"RecurrentConfig.tune must be one of {sorted(TUNED)}, got {self.tune!r}")


INTER_STORES = {"": 0, "evict_first": 1, "cs": 2}  # -> the kernel's INTER_POLICY

_WIDE_CONFIGS = autotune_configs(
    [
        *_RECURRENT_CONFIGS,
        triton.Config({"BV": 32}, num_warps=1, num_stages=3),  # SGLang's verify tile
        triton.Config({"BV": 16}, num_warps=1),
        triton.Config({"BV": 64}, num_warps=2),
        triton.Config({"BV": 32}, num_warps=2, num_stages=1),
        triton.Config({"BV": 64}, num_warps=4, num_stages=1),
        triton.Config({"BV": 128}, num_warps=4),
        triton.Config({"BV": 128}, num_warps=16),
    ]
)


@triton.jit
def _load_rows(ptr, rows, stride_row, cols, mask):
    """`[len(rows), len(cols)]` float32 from `ptr + rows * stride_row + cols` (zeros where masked)."""
    return tl.load(ptr + rows[:, None] * stride_row + cols[None, :], mask=mask, other=0).to(tl.float32)


@triton.jit
def _row(x, sel):
    """Row `sel` (a one-hot mask over the first dim) of a 2-D tensor, exactly (one value plus zeros)."""
    return tl.sum(tl.where(sel[:, None], x, 0), 0)


@triton.jit
def _gdn_recurrent_variant_kernel(
    # Pointers
    q, k, v, a, b, A_log, dt_bias, pool, indices, o, inter, parents,
    # Strides (elements) of the token and head dims of q, k, v; the last dim is contiguous
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    scale,
    B_KEY,
    # Sizes
    T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    # Meta-parameters
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr,
    WRITE_POOL: tl.constexpr, STORE_INTER: tl.constexpr, USE_PARENTS: tl.constexpr,
    CARRY_REG: tl.constexpr, PRELOAD: tl.constexpr, INTER_POLICY: tl.constexpr, POOL_VK: tl.constexpr,
):  # fmt: skip
    """`_gdn_recurrent_kernel`'s contract and math, with `RecurrentConfig`'s changes (BT: T's power of 2)."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    o_h = pool_offsets(o_k, o_v, K, V, POOL_VK)  # in the pool and `inter` alike (`_gdn_recurrent_kernel`)

    i_slot = tl.load(indices + i_n).to(tl.int64)
    valid = i_slot >= 0
    p_pool = pool + (tl.maximum(i_slot, 0) * HV + i_hv) * K * V + o_h
    b_h = tl.load(p_pool, mask=m_h & valid, other=0, eviction_policy="evict_first").to(tl.float32)
    b_h0 = b_h  # held for a parent of -1 by "reload" only ("reg" reloads it from the pool)
    b_A = tl.exp(tl.load(A_log + i_hv).to(tl.float32))
    b_dt = tl.load(dt_bias + i_hv).to(tl.float32)

    if PRELOAD:  # every step's inputs, normalised and gated, before the serial loop
        o_t = tl.arange(0, BT)
        m_t = o_t < T
        i_toks = i_n * T + o_t
        b_Q = _load_rows(q + i_h * stride_qh, i_toks, stride_qt, o_k, m_t[:, None] & m_k[None, :])
        b_K = _load_rows(k + i_h * stride_kh, i_toks, stride_kt, o_k, m_t[:, None] & m_k[None, :])
        b_V = _load_rows(v + i_hv * stride_vh, i_toks, stride_vt, o_v, m_t[:, None] & m_v[None, :])
        b_Q = l2_normalized(b_Q, 1, DT) * scale
        b_K = l2_normalized(b_K, 1, DT)
        b_G, b_BETA = gates(
            tl.load(a + i_toks * HV + i_hv, mask=m_t, other=0).to(tl.float32),
            tl.load(b + i_toks * HV + i_hv, mask=m_t, other=0).to(tl.float32),
            b_A,
            b_dt,
        )
        if USE_PARENTS:
            b_P = tl.load(parents + i_toks, mask=m_t, other=-1)

    for t in range(T):
        i_tok = i_n * T + t
        if PRELOAD:
            sel = o_t == t
            b_q, b_k, b_v = _row(b_Q, sel), _row(b_K, sel), _row(b_V, sel)
            b_g, b_beta = tl.sum(tl.where(sel, b_G, 0)), tl.sum(tl.where(sel, b_BETA, 0))
            if USE_PARENTS:
                i_par = tl.sum(tl.where(sel, b_P, 0))
        else:
            b_q, b_k, b_v, b_g, b_beta = _step_inputs(
                q, k, v, a, b, i_tok, i_h, i_hv, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                o_k, o_v, m_k, m_v, scale, b_A, b_dt, HV, DT,
            )  # fmt: skip
            if USE_PARENTS:
                i_par = tl.load(parents + i_tok)
        if USE_PARENTS:
            if CARRY_REG:
                if i_par != t - 1:  # uniform per program: the branch and its barrier are taken by all threads
                    tl.debug_barrier()  # the parent's state was stored by this program's threads
                    if i_par >= 0:
                        b_h = tl.load(inter + ((i_n * T + i_par) * HV + i_hv) * K * V + o_h, mask=m_h, other=0)
                    else:
                        b_h = tl.load(p_pool, mask=m_h & valid, other=0).to(tl.float32)
            else:
                tl.debug_barrier()
                p_par = inter + ((i_n * T + tl.maximum(i_par, 0)) * HV + i_hv) * K * V + o_h
                b_hp = tl.load(p_par, mask=m_h & (i_par >= 0), other=0)
                b_h = tl.where(i_par >= 0, b_hp, b_h0)

        b_h, b_o = _step(b_h, b_q, b_k, b_v, b_g, b_beta)
        tl.store(o + (i_tok * HV + i_hv) * V + o_v, round_to(b_o, DT, EMULATE), mask=m_v)
        if STORE_INTER:
            p_inter = inter + (i_tok * HV + i_hv) * K * V + o_h
            if INTER_POLICY == 1:
                tl.store(p_inter, b_h, mask=m_h, eviction_policy="evict_first")
            elif INTER_POLICY == 2:
                tl.store(p_inter, b_h, mask=m_h, cache_modifier=".cs")
            else:
                tl.store(p_inter, b_h, mask=m_h)

    if WRITE_POOL:
        tl.store(p_pool, b_h, mask=m_h & valid, eviction_policy="evict_first")


_VARIANT_KEY = ["B_KEY", "T", "HV", "K", "V", "USE_PARENTS", "CARRY_REG", "PRELOAD", "INTER_POLICY", "POOL_VK"]
TUNED = {
    name: triton.autotune(configs=configs, key=_VARIANT_KEY, restore_value=["pool"])(_gdn_recurrent_variant_kernel)
    for name, configs in (("", _RECURRENT_CONFIGS), ("wide", _WIDE_CONFIGS))
}
