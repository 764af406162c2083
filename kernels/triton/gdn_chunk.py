"""Chunked (WY / UT form) GDN prefill in Triton: varlen, initial states from a pool, final states back.

Per chunk of C = 64 tokens and v-head, with gamma the in-chunk cumulative log decay, q^/k^ the
L2-normalised q (times scale) and k, L[t, s] = beta_t exp(gamma_t - gamma_s) (k^_t . k^_s) for s < t:

    T  = (I + L)^-1                       _chunk_tri: 16x16 diagonal blocks (Neumann product + one
                                          Newton step), then the off-diagonal blocks from them; it
                                          also stores k^ once per q/k head for the later kernels
    W  = T (beta exp(gamma) k^),  U = T (beta v)                            _chunk_wu (or, with
                                          TriConfig.wu, _chunk_tri from T's blocks in registers)
    per request, chunk by chunk:  H_c = S (stored),  U' = U - W S,
        S = exp(gamma_last) S + k^T (exp(gamma_last - gamma) U')           _chunk_state (sequential)
    O  = (exp(gamma) q^) H_c + (tril(q^ k^T) exp(gamma_t - gamma_s)) U'     _chunk_out

Every matmul takes operands rounded to the input dtype and accumulates in float32; T, W, U, U' and H
are stored in the input dtype (the twin in attnbench.references.gdn rounds at the same points).
The plan (which request and chunk each program takes) is built once per case from host lengths.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from attnbench.kernels.triton.gdn_common import (
    INTERPRET,
    TL_DTYPES,
    autotune_configs,
    exp_in,
    l2_normalized,
    mm,
    pool_is_k_last,
    pool_offsets,
    round_to,
)

CHUNK = 64
FUSE_OUT_MODES = ("", "tri", "loop", "wu")  # ChunkPlan.fuse_out
SUB = 16  # the diagonal blocks of the triangular inverse


@dataclass(frozen=True)
class TriConfig:
    """Launch knobs of the T kernel (`_chunk_tri_batched_kernel`): `num_warps`, and the tl.dot
    input_precision of the Neumann product, the Newton step and the off-diagonal merge.

    16-bit inputs: "tf32x3" (three TF32 tensor-core products) is float32-accurate for this algebra;
    plain "tf32" is not (merge: 8e-4 relative, a third of the bf16 T entries round differently from
    the float32 twin). Float32 inputs always take `TRI_IEEE` (their twin is float32). Measurements and
    the numerics of each precision: kernels/triton/NOTES.md.
    """

    num_warps: int = 4
    neumann: str = "tf32x3"
    newton: str = "tf32x3"
    merge: str = "tf32x3"
    kk: str = "once"  # "once": one 64 x 64 k k^T dot, blocks cut from it; "blocks": keys loaded per block set
    diag: str = "neumann"  # the 16 x 16 diagonal inverses: "neumann" (dots) or "subst" (forward substitution)
    wu: bool = False  # W and U from T's blocks in the T kernel's registers (no T round trip, no W/U kernel)
    maxnreg: int | None = None  # ptxas's register cap (`TRI`: 128, 4 programs an SM instead of 3)

    def __post_init__(self):
        if self.kk not in ("blocks", "once"):
            raise ValueError(f"TriConfig.kk must be 'blocks' or 'once', not {self.kk!r}")
        if self.diag not in ("neumann", "subst"):
            raise ValueError(f"TriConfig.diag must be 'neumann' or 'subst', not {self.diag!r}")


# the default for bf16/fp16: under a 128-register cap (sm_90 ptxas: 128 registers, 32-40 B spilled; 168 uncapped,
# 3 programs an SM) the extend took 0.5-7.4% less time on every gdn_extend row of the `gdn` suite (H200,
# h200-session28/extend2: T32768 H32 2289.5 against 2300.7 us, T1024 85.8 against 92.7)
TRI = TriConfig(maxnreg=128)
# float32 inputs (kk "blocks": "once" is measured for 16-bit inputs only, and spills more in float32)
TRI_IEEE = TriConfig(neumann="ieee", newton="ieee", merge="ieee", kk="blocks")


@triton.jit
def _load_norm_rows(p, rows, m_rows, o_k, m_k, stride_t, scale, DT: tl.constexpr, EMULATE: tl.constexpr):
    """Rows `rows` of a `[*, K]` slice at `p`: L2-normalised, times `scale`, rounded to DT."""
    b_x = tl.load(p + rows[:, None] * stride_t + o_k[None, :], mask=m_rows[:, None] & m_k[None, :], other=0)
    b_x = b_x.to(tl.float32)
    b_x = l2_normalized(b_x, 1, DT) * scale
    return round_to(b_x, DT, EMULATE)


@triton.jit
def _chunk_bounds(chunks, cu_seqlens, i_c, CHUNK_SIZE: tl.constexpr):
    """(first token, token count) of chunk `i_c` of the plan."""
    i_n = tl.load(chunks + i_c * 2).to(tl.int64)
    i_j = tl.load(chunks + i_c * 2 + 1).to(tl.int64)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64) + i_j * CHUNK_SIZE
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    return bos, tl.minimum(eos - bos, CHUNK_SIZE)


# ---- gamma: in-chunk cumulative log decay -----------------------------------------------------------
@triton.jit
def _chunk_cumsum_kernel(g, gcum, chunks, cu_seqlens, HV: tl.constexpr, C: tl.constexpr):
    i_c, i_hv = tl.program_id(0), tl.program_id(1)
    bos, n = _chunk_bounds(chunks, cu_seqlens, i_c, C)
    o_t = tl.arange(0, C)
    m_t = o_t < n
    b_g = tl.load(g + (bos + o_t) * HV + i_hv, mask=m_t, other=0).to(gcum.dtype.element_ty)
    tl.store(gcum + (bos + o_t) * HV + i_hv, tl.cumsum(b_g, 0), mask=m_t)


# ---- T = (I + L)^-1 -------------------------------------------------------------------------------
@triton.jit
def _unit_lower_inverse(L, S: tl.constexpr, P_NEU: tl.constexpr, P_NEWTON: tl.constexpr):
    """(I + L)^-1 of 16 x 16 strictly lower L (nilpotent: L^16 = 0), with matmuls only; L is one
    block `[S, S]` or a batch `[B, S, S]`.

    The Neumann series in product form, (I - L)(I + L^2)(I + L^4)(I + L^8), with dots in precision
    P_NEU, then one Newton step X += X (I - (I + L) X) in P_NEWTON, which squares its error: float32
    error ~3e-7 relative even for strongly correlated keys (|L| entries near 1), where the product
    alone loses ~6e-4. TF32 ("tf32") products lose ~3e-2 there and one Newton step leaves ~8e-4;
    "tf32x3" (three TF32 tensor-core products, ~fp32 accurate) keeps ~3e-7 (kernels/triton/NOTES.md).
    """
    r = tl.arange(0, S)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    N1 = -L
    N2 = tl.dot(N1, N1, input_precision=P_NEU)
    N4 = tl.dot(N2, N2, input_precision=P_NEU)
    N8 = tl.dot(N4, N4, input_precision=P_NEU)
    X = tl.dot(eye + N1, eye + N2, input_precision=P_NEU)
    X = tl.dot(X, eye + N4, input_precision=P_NEU)
    X = tl.dot(X, eye + N8, input_precision=P_NEU)
    R = eye - tl.dot(eye + L, X, input_precision=P_NEWTON)
    return X + tl.dot(X, R, input_precision=P_NEWTON)


@triton.jit
def _load_norm_rows3(p, rows, m_rows, o_k, m_k, stride_t, DT: tl.constexpr, EMULATE: tl.constexpr):
    """`_load_norm_rows` (scale 1) for a `[B, R]` grid of rows: `[B, R, BK]`."""
    b_x = tl.load(
        p + rows[:, :, None] * stride_t + o_k[None, None, :], mask=m_rows[:, :, None] & m_k[None, None, :], other=0
    )
    b_x = b_x.to(tl.float32)
    b_x = l2_normalized(b_x, 2, DT)
    return round_to(b_x, DT, EMULATE)


@triton.jit
def _decayed(b_kk, keep, g_i, g_j, beta_i, DT: tl.constexpr, EMULATE: tl.constexpr):
    """beta_t exp(gamma_t - gamma_s) (k_t . k_s) where `keep`, 0 elsewhere (any rank, rows then columns last)."""
    diff = tl.where(keep, tl.expand_dims(g_i, -1) - tl.expand_dims(g_j, -2), 0.0)
    return tl.where(keep, tl.expand_dims(beta_i, -1) * exp_in(diff, DT, EMULATE) * b_kk, 0.0)


@triton.jit
def _unit_lower_inverse_subst(L, S: tl.constexpr):
    """(I + L)^-1 of a batch `[B, S, S]` of strictly lower L by forward substitution in float32 (the
    float32 twin's algorithm): row i of X is e_i - sum_j L[i, j] X[j, :], where rows j >= i of X are
    still e_j and L[i, j] = 0, so only the rows already solved contribute. S - 1 dependent steps of
    elementwise products and 16-wide sums; no dots."""
    r = tl.arange(0, S)
    X = tl.where((r[:, None] == r[None, :])[None, :, :], 1.0, 0.0) + tl.zeros_like(L)
    for i in tl.static_range(1, S):
        row_i = (r == i)[None, :, None]
        l_i = tl.sum(tl.where(row_i, L, 0.0), 1)  # [B, S]: row i of L
        X = tl.where(row_i, X - tl.sum(l_i[:, :, None] * X, 1)[:, None, :], X)
    return X


@triton.jit
def _l_blocks_loaded(
    p_k, p_g, p_b, khat, bos, i_h, i_hv, o_k, m_k, stride_kt,
    rows4, rows_e, rows_o, r2, m4, m_e, m_o, m_lo, m_hi,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, S: tl.constexpr, DT: tl.constexpr,
    EMULATE: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    """The blocks of L the doubling needs (diagonal `[4, S, S]`, (1, 0) and (3, 2) `[2, S, S]`,
    L[2S:, :2S]), each from its own load of the keys (L1/L2 hits), so every key tile dies at its dot."""
    r = tl.arange(0, S)
    k4 = _load_norm_rows3(p_k, rows4, m4, o_k, m_k, stride_kt, DT, EMULATE)
    if i_hv % (HV // H) == 0:  # one program per q/k head keeps the normalised keys for the later kernels
        p_kh = khat + ((bos + rows4) * H + i_h)[:, :, None] * K + o_k[None, None, :]
        tl.store(p_kh, k4, mask=m4[:, :, None] & m_k[None, None, :])
    kk4 = mm(k4, tl.permute(k4, (0, 2, 1)), EMULATE, IEEE)
    k_e = _load_norm_rows3(p_k, rows_e, m_e, o_k, m_k, stride_kt, DT, EMULATE)
    k_o = _load_norm_rows3(p_k, rows_o, m_o, o_k, m_k, stride_kt, DT, EMULATE)
    kk2 = mm(k_o, tl.permute(k_e, (0, 2, 1)), EMULATE, IEEE)
    k_lo = _load_norm_rows(p_k, r2, m_lo, o_k, m_k, stride_kt, 1.0, DT, EMULATE)
    k_hi = _load_norm_rows(p_k, 2 * S + r2, m_hi, o_k, m_k, stride_kt, 1.0, DT, EMULATE)
    kk_hl = mm(k_hi, tl.trans(k_lo), EMULATE, IEEE)

    g4 = tl.load(p_g + rows4 * HV, mask=m4, other=0)
    b4 = tl.load(p_b + rows4 * HV, mask=m4, other=0)
    keep4 = m4[:, :, None] & m4[:, None, :] & (r[:, None] > r[None, :])[None, :, :]
    L4 = _decayed(kk4, keep4, g4, g4, b4, DT, EMULATE)
    g_e = tl.load(p_g + rows_e * HV, mask=m_e, other=0)
    g_o = tl.load(p_g + rows_o * HV, mask=m_o, other=0)
    b_o = tl.load(p_b + rows_o * HV, mask=m_o, other=0)
    L2 = _decayed(kk2, m_o[:, :, None] & m_e[:, None, :], g_o, g_e, b_o, DT, EMULATE)
    g_lo = tl.load(p_g + r2 * HV, mask=m_lo, other=0)
    g_hi = tl.load(p_g + (2 * S + r2) * HV, mask=m_hi, other=0)
    b_hi = tl.load(p_b + (2 * S + r2) * HV, mask=m_hi, other=0)
    L_hl = _decayed(kk_hl, m_hi[:, None] & m_lo[None, :], g_hi, g_lo, b_hi, DT, EMULATE)
    return L4, L2, L_hl


@triton.jit
def _l_blocks_once(
    p_k, p_g, p_b, khat, bos, n, i_h, i_hv, o_k, m_k, stride_kt,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, C: tl.constexpr, S: tl.constexpr, DT: tl.constexpr,
    EMULATE: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    """The same blocks as `_l_blocks_loaded`, cut from the whole `[C, C]` L of one `k k^T` dot: the
    keys loaded and normalised once; a block is the masked sum over the block axis of L viewed as
    `[4, S, 4, S]` (or `[2, 2S, 2, 2S]`), no gather."""
    o_t = tl.arange(0, C)
    m_t = o_t < n
    b_k = _load_norm_rows(p_k, o_t, m_t, o_k, m_k, stride_kt, 1.0, DT, EMULATE)
    if i_hv % (HV // H) == 0:  # one program per q/k head keeps the normalised keys for the later kernels
        p_kh = khat + ((bos + o_t) * H + i_h)[:, None] * K + o_k[None, :]
        tl.store(p_kh, b_k, mask=m_t[:, None] & m_k[None, :])
    kk = mm(b_k, tl.trans(b_k), EMULATE, IEEE)
    b_g = tl.load(p_g + o_t * HV, mask=m_t, other=0)
    b_b = tl.load(p_b + o_t * HV, mask=m_t, other=0)
    keep = m_t[:, None] & m_t[None, :] & (o_t[:, None] > o_t[None, :])
    L = _decayed(kk, keep, b_g, b_g, b_b, DT, EMULATE)
    a4 = tl.arange(0, 4)
    L44 = tl.reshape(L, [4, S, 4, S])  # (row block, row, column block, column)
    L4 = tl.sum(tl.where((a4[:, None] == a4[None, :])[:, None, :, None], L44, 0.0), 2)
    below = (a4[:, None] == a4[None, :] + 1) & (a4 % 2 == 1)[:, None]  # blocks (1, 0) and (3, 2)
    L2 = tl.sum(tl.reshape(tl.sum(tl.where(below[:, None, :, None], L44, 0.0), 2), [2, 2, S, S]), 1)
    a2 = tl.arange(0, 2)
    L22 = tl.reshape(L, [2, 2 * S, 2, 2 * S])
    corner = (a2[:, None] == 1) & (a2[None, :] == 0)
    L_hl = tl.sum(tl.sum(tl.where(corner[:, None, :, None], L22, 0.0), 2), 0)
    return L4, L2, L_hl


@triton.jit
def _pair_split(x):
    """`[4, ...]` -> (`x[0::2]`, `x[1::2]`), each `[2, ...]`: blocks (0, 2) and (1, 3)."""
    x = tl.reshape(x, [2, 2, x.shape[1], x.shape[2]])
    return tl.split(tl.permute(x, (0, 2, 3, 1)))


@triton.jit
def _lower_2x2(a, c, d):
    """The block matrices [[a_p, 0], [c_p, d_p]] of a batch `[P, S, S]` each: `[P, 2S, 2S]`."""
    P: tl.constexpr = a.shape[0]
    S: tl.constexpr = a.shape[1]
    top = tl.reshape(tl.permute(tl.join(a, tl.zeros_like(a)), (0, 1, 3, 2)), [P, S, 2 * S])
    bot = tl.reshape(tl.permute(tl.join(c, d), (0, 1, 3, 2)), [P, S, 2 * S])
    return tl.reshape(tl.permute(tl.join(top, bot), (0, 3, 1, 2)), [P, 2 * S, 2 * S])


@triton.jit
def _chunk_tri_batched_kernel(
    # Pointers
    k, beta, gcum, tmat, khat, chunks, cu_seqlens, q, qhat, amat, v, w, u,
    # Sizes and strides
    stride_kt, stride_qt, stride_vt, scale, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
    V: tl.constexpr,
    # Meta-parameters
    C: tl.constexpr, S: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr,
    EMULATE: tl.constexpr, IEEE: tl.constexpr, P_NEU: tl.constexpr, P_NEWTON: tl.constexpr,
    P_MERGE: tl.constexpr, KK_ONCE: tl.constexpr, SUBST: tl.constexpr, FUSE_OUT: tl.constexpr,
    WU: tl.constexpr,
):  # fmt: skip
    """T per (chunk, v-head) by recursive doubling, each level one batched or one larger dot chain:

        the four 16 x 16 diagonal blocks          one [4, 16, 16] Neumann + Newton chain
        X10, X32 = -X11 L10 X00, -X33 L32 X22      one [2, 16, 16] pair of dots
        T[32:, :32] = -D^-1 L[32:, :32] A^-1        two 32 x 32 dots, A^-1 / D^-1 the 32 x 32 diagonal blocks

    11 dependent small dots instead of 44, so 4x fewer layout round trips (C = 64, S = 16 only).
    With FUSE_OUT it also writes what the fused state pass needs and does not depend on the state:
    q^ (one program per q/k head) and the decayed causal block tril(q^ k^T) e^(gamma_t - gamma_s).
    With WU it writes W and U instead of T (`_t_blocks_times`), so T never reaches memory.
    """
    i_c, i_hv = tl.program_id(0), tl.program_id(1)
    i_h = i_hv // (HV // H)
    bos, n = _chunk_bounds(chunks, cu_seqlens, i_c, C)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    r = tl.arange(0, S)
    p_k = k + bos * stride_kt + i_h * K
    p_g = gcum + bos * HV + i_hv
    p_b = beta + bos * HV + i_hv

    rows4 = tl.arange(0, 4)[:, None] * S + r[None, :]  # the diagonal blocks: token rows 16 b + i
    rows_e = tl.arange(0, 2)[:, None] * (2 * S) + r[None, :]  # blocks (1, 0) and (3, 2): rows 32 p + 16 + i
    rows_o = rows_e + S  # ... against rows 32 p + i
    r2 = tl.arange(0, 2 * S)
    m4, m_e, m_o, m_lo, m_hi = rows4 < n, rows_e < n, rows_o < n, r2 < n, 2 * S + r2 < n
    if KK_ONCE:
        L4, L2, L_hl = _l_blocks_once(p_k, p_g, p_b, khat, bos, n, i_h, i_hv, o_k, m_k, stride_kt,
                                      H, HV, K, C, S, DT, EMULATE, IEEE)  # fmt: skip
    else:
        L4, L2, L_hl = _l_blocks_loaded(p_k, p_g, p_b, khat, bos, i_h, i_hv, o_k, m_k, stride_kt,
                                        rows4, rows_e, rows_o, r2, m4, m_e, m_o, m_lo, m_hi,
                                        H, HV, K, S, DT, EMULATE, IEEE)  # fmt: skip
    if SUBST:
        X4 = _unit_lower_inverse_subst(L4, S)  # X00, X11, X22, X33
    else:
        X4 = _unit_lower_inverse(L4, S, P_NEU, P_NEWTON)

    # level 1: X10, X32
    X_e, X_o = _pair_split(X4)  # (X00, X22), (X11, X33)
    Y = -tl.dot(X_o, tl.dot(L2, X_e, input_precision=P_MERGE), input_precision=P_MERGE)  # X10, X32

    # level 2: T[32:, :32] = -D^-1 L[32:, :32] A^-1
    AD = _lower_2x2(X_e, Y, X_o)  # [[X00, 0], [X10, X11]], [[X22, 0], [X32, X33]]
    A_inv, D_inv = tl.split(tl.permute(AD, (1, 2, 0)))
    Z = -tl.dot(D_inv, tl.dot(L_hl, A_inv, input_precision=P_MERGE), input_precision=P_MERGE)

    RS = HV * C  # T's (and the FUSE_OUT block's) row stride
    if WU:  # W = T (beta e^gamma k^) and U = T (beta v) from T's 32 x 32 blocks: T stays in registers
        a_r, z_r, d_r = round_to(A_inv, DT, EMULATE), round_to(Z, DT, EMULATE), round_to(D_inv, DT, EMULATE)
        b_lo = tl.load(p_b + r2 * HV, mask=m_lo, other=0)
        b_hi = tl.load(p_b + (2 * S + r2) * HV, mask=m_hi, other=0)
        x_lo = _load_norm_rows(p_k, r2, m_lo, o_k, m_k, stride_kt, 1.0, DT, EMULATE)
        x_hi = _load_norm_rows(p_k, 2 * S + r2, m_hi, o_k, m_k, stride_kt, 1.0, DT, EMULATE)
        s_lo = b_lo * exp_in(tl.load(p_g + r2 * HV, mask=m_lo, other=0), DT, EMULATE)
        s_hi = b_hi * exp_in(tl.load(p_g + (2 * S + r2) * HV, mask=m_hi, other=0), DT, EMULATE)
        p_w = w + ((bos + r2) * HV + i_hv)[:, None] * K + o_k[None, :]
        _t_blocks_times(a_r, z_r, d_r, x_lo, x_hi, s_lo, s_hi, p_w, 2 * S * HV * K, m_lo, m_hi, m_k,
                        DT, EMULATE, IEEE)  # fmt: skip
        for i_v in tl.static_range(0, V, BV):
            o_v = i_v + tl.arange(0, BV)
            m_v = o_v < V
            p_v = v + (bos + r2)[:, None] * stride_vt + i_hv * V + o_v[None, :]
            v_lo = tl.load(p_v, mask=m_lo[:, None] & m_v[None, :], other=0)
            v_hi = tl.load(p_v + 2 * S * stride_vt, mask=m_hi[:, None] & m_v[None, :], other=0)
            p_u = u + ((bos + r2) * HV + i_hv)[:, None] * V + o_v[None, :]
            _t_blocks_times(a_r, z_r, d_r, v_lo, v_hi, b_lo, b_hi, p_u, 2 * S * HV * V, m_lo, m_hi, m_v,
                            DT, EMULATE, IEEE)  # fmt: skip
    else:  # T rows of this chunk: [n, 64] in the input dtype; blocks above the diagonal are zero
        p_t = tmat + (bos * HV + i_hv) * C
        tl.store(p_t + rows4[:, :, None] * RS + (tl.arange(0, 4) * S)[:, None, None] + r[None, None, :],
                 round_to(X4, DT, EMULATE), mask=m4[:, :, None])  # fmt: skip
        p_pair = p_t + rows_o[:, :, None] * RS + (tl.arange(0, 2) * 2 * S)[:, None, None] + r[None, None, :]
        tl.store(p_pair, round_to(Y, DT, EMULATE), mask=m_o[:, :, None])
        tl.store(p_pair - S * RS + S, tl.zeros_like(Y), mask=m_e[:, :, None])  # X01, X23
        p_2 = p_t + r2[:, None] * RS + r2[None, :]
        tl.store(p_2 + 2 * S * RS, round_to(Z, DT, EMULATE), mask=m_hi[:, None])
        tl.store(p_2 + 2 * S, tl.zeros_like(Z), mask=m_lo[:, None])

    if FUSE_OUT:  # after the chain, whose registers are free by now
        o_t = tl.arange(0, C)
        m_t = o_t < n
        b_q = _load_norm_rows(q + bos * stride_qt + i_h * K, o_t, m_t, o_k, m_k, stride_qt, scale, DT, EMULATE)
        if i_hv % (HV // H) == 0:
            p_qh = qhat + ((bos + o_t) * H + i_h)[:, None] * K + o_k[None, :]
            tl.store(p_qh, b_q, mask=m_t[:, None] & m_k[None, :])
        b_k = _load_norm_rows(p_k, o_t, m_t, o_k, m_k, stride_kt, 1.0, DT, EMULATE)
        b_g = tl.load(p_g + o_t * HV, mask=m_t, other=0)
        b_a = _causal_qk(b_q, b_k, b_g, m_t, DT, EMULATE, IEEE)
        tl.store(amat + (bos * HV + i_hv) * C + o_t[:, None] * RS + o_t[None, :], b_a, mask=m_t[:, None])


@triton.jit
def _t_blocks_times(a, z, d, x_lo, x_hi, s_lo, s_hi, p_out, hi_offset, m_lo, m_hi, m_col,
                    DT: tl.constexpr, EMULATE: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    """T (s x) stored at `p_out` (rows 0-31; rows 32-63 at `p_out + hi_offset`), T given by its 32 x 32
    blocks [[a, 0], [z, d]] already rounded to DT and x by its halves `[32, N]`, each row scaled by `s`:
    s x rounded to DT, the products accumulated in float32 and rounded to DT, as `_t_times` does with
    the whole T (the same sums, the lower rows' two halves added in another order)."""
    xs_lo = round_to(x_lo.to(tl.float32) * s_lo[:, None], DT, EMULATE)
    y_lo = round_to(mm(a, xs_lo, EMULATE, IEEE), DT, EMULATE)
    tl.store(p_out, y_lo.to(p_out.dtype.element_ty), mask=m_lo[:, None] & m_col[None, :])
    y_hi = mm(z, xs_lo, EMULATE, IEEE)
    xs_hi = round_to(x_hi.to(tl.float32) * s_hi[:, None], DT, EMULATE)
    y_hi += mm(d, xs_hi, EMULATE, IEEE)
    tl.store(p_out + hi_offset, round_to(y_hi, DT, EMULATE).to(p_out.dtype.element_ty),
             mask=m_hi[:, None] & m_col[None, :])  # fmt: skip


@triton.jit
def _causal_qk(b_q, b_k, b_g, m_t, DT: tl.constexpr, EMULATE: tl.constexpr, IEEE: tl.constexpr):
    """The chunk's decayed causal block tril(q^ k^T) e^(gamma_t - gamma_s) over its valid rows `m_t`,
    rounded to DT: the same bits wherever it is computed (the out kernel, the T kernel's FUSE_OUT, the
    fused state loop)."""
    o_t = tl.arange(0, b_q.shape[0])
    keep = (o_t[:, None] >= o_t[None, :]) & m_t[:, None] & m_t[None, :]
    b_a = mm(b_q, tl.trans(b_k), EMULATE, IEEE)
    decay = exp_in(tl.where(keep, b_g[:, None] - b_g[None, :], 0.0), DT, EMULATE)
    return round_to(tl.where(keep, b_a * decay, 0.0), DT, EMULATE)


@triton.jit
def _t_times(b_T, b_x, b_scale, DT: tl.constexpr, EMULATE: tl.constexpr, IEEE: tl.constexpr):
    """T (scale x), each row of x scaled, operands and result rounded to DT: W = T (beta e^gamma k^) and
    U = T (beta v), in `_chunk_wu_kernel` and the fused state loop alike."""
    return round_to(mm(b_T, round_to(b_x.to(tl.float32) * b_scale[:, None], DT, EMULATE), EMULATE, IEEE), DT, EMULATE)


@triton.jit
def _pool_state(pool, indices, has_initial_state, i_n, i_hv, o_k, o_v, m_h, HV: tl.constexpr, K: tl.constexpr,
                V: tl.constexpr, POOL_VK: tl.constexpr):  # fmt: skip
    """(pointers, float32 values) of request `i_n`'s state block in the pool: its slot's `[K, V]` state of
    v-head `i_hv` at columns `o_v` (a `[BK, BV]` block; POOL_VK: the pool holds each state as `[V, K]`),
    zero where the request has no initial state."""
    p_pool = pool + (tl.load(indices + i_n).to(tl.int64) * HV + i_hv) * K * V + pool_offsets(o_k, o_v, K, V, POOL_VK)
    init = tl.load(has_initial_state + i_n) != 0
    return p_pool, tl.load(p_pool, mask=m_h & init, other=0).to(tl.float32)


@triton.jit
def _serial_program(cu_seqlens, H: tl.constexpr, HV: tl.constexpr, HVG: tl.constexpr):
    """What a program of a serial state pass takes (grid: value blocks x requests x HVG v-heads): its value
    block, request, v-head (within the group of HVG), q/k head, and the request's token range [bos, eos)."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_n, i_hv = i_nh // HVG, i_nh % HVG
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    return i_v, i_n, i_hv, i_hv // (HV // H), bos, eos


@triton.jit
def _state_step(b_s, b_vn, b_k, b_g, b_glast, DT: tl.constexpr, EMULATE: tl.constexpr, IEEE: tl.constexpr):
    """The state after a chunk: S = e^gamma_last S + k^T (e^(gamma_last - gamma) U'), U' in DT."""
    b_vd = round_to(b_vn.to(tl.float32) * exp_in(b_glast - b_g, DT, EMULATE)[:, None], DT, EMULATE)
    return b_s * exp_in(b_glast, DT, EMULATE) + mm(tl.trans(b_k), b_vd, EMULATE, IEEE)


# ---- W = T (beta e^gamma k^), U = T (beta v) -----------------------------------------------------------
@triton.jit
def _chunk_wu_kernel(
    # Pointers
    khat, v, beta, gcum, tmat, w, u, chunks, cu_seqlens,
    # Sizes and strides
    stride_vt, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    # Meta-parameters
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr,
    IEEE: tl.constexpr,
):  # fmt: skip
    i_c, i_hv = tl.program_id(0), tl.program_id(1)
    i_h = i_hv // (HV // H)
    bos, n = _chunk_bounds(chunks, cu_seqlens, i_c, C)
    o_t = tl.arange(0, C)
    m_t = o_t < n
    b_g = tl.load(gcum + (bos + o_t) * HV + i_hv, mask=m_t, other=0)
    b_beta = tl.load(beta + (bos + o_t) * HV + i_hv, mask=m_t, other=0)
    # T's columns past the chunk's end are zero (upper triangle), so only its rows need a bound
    p_T = tl.make_block_ptr(tmat + (bos * HV + i_hv) * C, (n, C), (HV * C, 1), (0, 0), (C, C), (1, 0))
    b_T = round_to(tl.load(p_T, boundary_check=(0,), padding_option="zero"), DT, EMULATE)

    p_k = tl.make_block_ptr(khat + (bos * H + i_h) * K, (n, K), (H * K, 1), (0, 0), (C, BK), (1, 0))
    b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero").to(tl.float32)

    p_w = tl.make_block_ptr(w + (bos * HV + i_hv) * K, (n, K), (HV * K, 1), (0, 0), (C, BK), (1, 0))
    b_wscale = b_beta * exp_in(b_g, DT, EMULATE)
    tl.store(p_w, _t_times(b_T, b_k, b_wscale, DT, EMULATE, IEEE).to(DT), boundary_check=(0, 1))
    for i_v in tl.static_range(0, V, BV):
        p_v = tl.make_block_ptr(v + bos * stride_vt + i_hv * V, (n, V), (stride_vt, 1), (0, i_v), (C, BV), (1, 0))
        b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        p_u = tl.make_block_ptr(u + (bos * HV + i_hv) * V, (n, V), (HV * V, 1), (0, i_v), (C, BV), (1, 0))
        tl.store(p_u, _t_times(b_T, b_v, b_beta, DT, EMULATE, IEEE).to(DT), boundary_check=(0, 1))


# ---- the state recurrence over chunks ---------------------------------------------------------------------
# The recurrence is serial over chunks and its grid small (V / BV x heads x requests), so deeper
# pipelines (the next chunk's W, U, K loaded while this one computes) are candidates too.
_STATE_CONFIGS = autotune_configs(
    [
        triton.Config({"BV": 32}, num_warps=4, num_stages=2),
        triton.Config({"BV": 64}, num_warps=4, num_stages=2),
        triton.Config({"BV": 64}, num_warps=8, num_stages=2),
        triton.Config({"BV": 16}, num_warps=2, num_stages=2),
        triton.Config({"BV": 32}, num_warps=4, num_stages=3),
        triton.Config({"BV": 32}, num_warps=4, num_stages=4),
        triton.Config({"BV": 32}, num_warps=2, num_stages=3),
        triton.Config({"BV": 64}, num_warps=4, num_stages=3),
    ]
)


@triton.autotune(configs=_STATE_CONFIGS, key=["B_KEY", "H", "HV", "K", "V", "HVG", "POOL_VK"], restore_value=["pool"])
@triton.jit
def _chunk_state_kernel(
    # Pointers
    khat, gcum, w, u, h, vnew, pool, indices, has_initial_state, cu_seqlens, chunk_offsets,
    # Sizes and strides
    B_KEY, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, HVG: tl.constexpr,
    # Meta-parameters
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr,
    IEEE: tl.constexpr, POOL_VK: tl.constexpr,
):  # fmt: skip
    """Per (BV value columns, request x v-head of a group of HVG v-heads; the pointers start at the group's
    first head, `head_group`), chunk by chunk: H_c = S (stored), U' = U - W S, S after the chunk."""
    i_v, i_n, i_hv, i_h, bos, eos = _serial_program(cu_seqlens, H, HV, HVG)
    c0 = tl.load(chunk_offsets + i_n).to(tl.int64)
    o_t, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    m_h = (o_k < K)[:, None] & (o_v < V)[None, :]
    p_pool, b_s = _pool_state(pool, indices, has_initial_state, i_n, i_hv, o_k, o_v, m_h, HV, K, V, POOL_VK)

    for j in range(tl.cdiv(eos - bos, C)):
        t0 = bos + j * C
        nj = tl.minimum(eos - t0, C)
        b_sr = round_to(b_s, DT, EMULATE)
        p_h = tl.make_block_ptr(h + ((c0 + j) * HV + i_hv) * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
        tl.store(p_h, b_sr.to(DT), boundary_check=(0, 1))
        p_w = tl.make_block_ptr(w + (t0 * HV + i_hv) * K, (nj, K), (HV * K, 1), (0, 0), (C, BK), (1, 0))
        p_u = tl.make_block_ptr(u + (t0 * HV + i_hv) * V, (nj, V), (HV * V, 1), (0, i_v * BV), (C, BV), (1, 0))
        p_vn = tl.make_block_ptr(vnew + (t0 * HV + i_hv) * V, (nj, V), (HV * V, 1), (0, i_v * BV), (C, BV), (1, 0))
        p_k = tl.make_block_ptr(khat + (t0 * H + i_h) * K, (nj, K), (H * K, 1), (0, 0), (C, BK), (1, 0))
        b_w = round_to(tl.load(p_w, boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
        b_u = tl.load(p_u, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_vn = round_to(b_u - mm(b_w, b_sr, EMULATE, IEEE), DT, EMULATE)  # U' = U - W S
        tl.store(p_vn, b_vn.to(DT), boundary_check=(0, 1))
        b_g = tl.load(gcum + (t0 + o_t) * HV + i_hv, mask=o_t < nj, other=0)
        b_glast = tl.load(gcum + (t0 + nj - 1) * HV + i_hv)
        b_k = round_to(tl.load(p_k, boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
        b_s = _state_step(b_s, b_vn, b_k, b_g, b_glast, DT, EMULATE, IEEE)
    tl.store(p_pool, b_s, mask=m_h)


# ---- the same recurrence on the transposed state (`state_regs`) ------------------------------------------
# _chunk_state_kernel's products take the state S and U' as their right operands, which the tensor cores read
# from shared memory: every chunk stores both there and waits on it, a round trip inside the serial chain.
# Holding S^T ([BV, K], the K-last orientation) instead, both products take the loop-carried values as left
# operands, which stay in registers: U'^T = U^T - S^T W^T, then S^T = e^gamma_last S^T + (U'_d)^T k^; only W^T and
# k^ (loaded ahead, off the chain) go through shared memory. With BV = 16 rows per warp the accumulator feeds
# the next product without crossing warps (sm_90 ptxas: 255 registers, 88-200 B spilled at BV = 32 on 2 warps;
# 168 and none on 4 warps, which split the columns; 880 B spilled at BV = 16 on 1 warp, left out).
# Measured slower than _chunk_state_kernel on an H200 (1085 against 835 us at T32768, every gdn_extend row
# 1.02-1.20x; reports/examples/h200-session27/regs, kernels/triton/NOTES.md): opt-in (`gdn_state_regs`).
_STATE_REGS_CONFIGS = autotune_configs(
    [
        triton.Config({"BV": 32}, num_warps=2, num_stages=2),
        triton.Config({"BV": 32}, num_warps=2, num_stages=3),
        triton.Config({"BV": 32}, num_warps=4, num_stages=2),
        triton.Config({"BV": 32}, num_warps=4, num_stages=3),
        triton.Config({"BV": 16}, num_warps=2, num_stages=2),
        triton.Config({"BV": 64}, num_warps=4, num_stages=2),
    ]
)


@triton.jit
def _state_regs_chunk(b_st, khat, gcum, w, u, h, vnew, t0, nj, i_c, i_v, i_hv, i_h, H: tl.constexpr,
                      HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                      BV: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    """One chunk of `_chunk_state_regs_kernel`: its `nj` tokens from `t0` (plan row `i_c`); S^T after it."""
    o_t = tl.arange(0, C)
    b_str = round_to(b_st, DT, EMULATE)
    # H_c as [K, V] (the output kernel's layout), written from S^T: the block's dim 0 is v (stride 1)
    p_h = tl.make_block_ptr(h + (i_c * HV + i_hv) * K * V, (V, K), (1, V), (i_v * BV, 0), (BV, BK), (0, 1))
    tl.store(p_h, b_str.to(DT), boundary_check=(0, 1))
    p_wt = tl.make_block_ptr(w + (t0 * HV + i_hv) * K, (K, nj), (1, HV * K), (0, 0), (BK, C), (0, 1))
    p_ut = tl.make_block_ptr(u + (t0 * HV + i_hv) * V, (V, nj), (1, HV * V), (i_v * BV, 0), (BV, C), (0, 1))
    p_vnt = tl.make_block_ptr(vnew + (t0 * HV + i_hv) * V, (V, nj), (1, HV * V), (i_v * BV, 0), (BV, C), (0, 1))
    p_k = tl.make_block_ptr(khat + (t0 * H + i_h) * K, (nj, K), (H * K, 1), (0, 0), (C, BK), (1, 0))
    b_wt = round_to(tl.load(p_wt, boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
    b_ut = tl.load(p_ut, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
    b_vnt = round_to(b_ut - mm(b_str, b_wt, EMULATE, IEEE), DT, EMULATE)  # U'^T = U^T - S^T W^T
    tl.store(p_vnt, b_vnt.to(DT), boundary_check=(0, 1))
    b_g = tl.load(gcum + (t0 + o_t) * HV + i_hv, mask=o_t < nj, other=0)
    b_glast = tl.load(gcum + (t0 + nj - 1) * HV + i_hv)
    b_k = round_to(tl.load(p_k, boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
    b_vdt = round_to(b_vnt.to(tl.float32) * exp_in(b_glast - b_g, DT, EMULATE)[None, :], DT, EMULATE)
    return b_st * exp_in(b_glast, DT, EMULATE) + mm(b_vdt, b_k, EMULATE, IEEE)  # S^T after the chunk


@triton.autotune(configs=_STATE_REGS_CONFIGS, key=["B_KEY", "H", "HV", "K", "V", "HVG", "POOL_VK"],
                 restore_value=["pool"])  # fmt: skip
@triton.jit
def _chunk_state_regs_kernel(
    # Pointers
    khat, gcum, w, u, h, vnew, pool, indices, has_initial_state, cu_seqlens, chunk_offsets,
    # Sizes and strides
    B_KEY, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, HVG: tl.constexpr,
    # Meta-parameters
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr,
    IEEE: tl.constexpr, POOL_VK: tl.constexpr,
):  # fmt: skip
    """`_chunk_state_kernel`'s contract and rounding points (H_c and U' stored as there), the state held as
    S^T so that it and U'^T are the products' register operands."""
    i_v, i_n, i_hv, i_h, bos, eos = _serial_program(cu_seqlens, H, HV, HVG)
    c0 = tl.load(chunk_offsets + i_n).to(tl.int64)
    o_k, o_v = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    m_h = (o_k < K)[:, None] & (o_v < V)[None, :]
    p_pool, b_s = _pool_state(pool, indices, has_initial_state, i_n, i_hv, o_k, o_v, m_h, HV, K, V, POOL_VK)
    p_pool, b_st, m_st = tl.trans(p_pool), tl.trans(b_s), tl.trans(m_h)  # [BV, BK]: S^T, entry (v, k)
    n_full = (eos - bos) // C  # whole chunks: their bounds are the block's, no masks
    for j in range(n_full):
        b_st = _state_regs_chunk(b_st, khat, gcum, w, u, h, vnew, bos + j * C, C, c0 + j, i_v, i_hv, i_h, H, HV, K, V,
                                 C, BK, BV, DT, EMULATE, IEEE)  # fmt: skip
    if n_full * C < eos - bos:  # the request's last, partial chunk
        b_st = _state_regs_chunk(b_st, khat, gcum, w, u, h, vnew, bos + n_full * C, eos - bos - n_full * C,
                                 c0 + n_full, i_v, i_hv, i_h, H, HV, K, V, C, BK, BV, DT, EMULATE, IEEE)  # fmt: skip
    tl.store(p_pool, b_st, mask=m_st)


# ---- the state recurrence with the output fused (`fuse_out`) ---------------------------------------------
# The same recurrence, and each chunk's output computed from the state in registers: H (the chunk's
# start state, [NC, HV, K, V]) and U' are neither written nor read back. The decayed causal q^ k^T block
# does not depend on the state: `fuse_out="tri"` takes it (and q^) from the T kernel, `fuse_out="loop"`
# computes it here, where it can fill the recurrence's dependency stalls (each of the V / BV programs of
# a head recomputes it).
_STATE_OUT_CONFIGS = autotune_configs(
    [
        triton.Config({"BV": 32}, num_warps=4, num_stages=2),
        triton.Config({"BV": 16}, num_warps=4, num_stages=2),
        triton.Config({"BV": 32}, num_warps=4, num_stages=3),
        triton.Config({"BV": 64}, num_warps=4, num_stages=2),
        triton.Config({"BV": 64}, num_warps=8, num_stages=2),
        triton.Config({"BV": 16}, num_warps=2, num_stages=3),
    ]
)


@triton.autotune(configs=_STATE_OUT_CONFIGS, key=["B_KEY", "H", "HV", "K", "V", "POOL_VK"], restore_value=["pool"])
@triton.jit
def _chunk_state_out_kernel(
    # Pointers
    q, qhat, khat, amat, gcum, w, u, o, pool, indices, has_initial_state, cu_seqlens, v, beta, tmat,
    # Sizes and strides
    stride_qt, stride_vt, scale, B_KEY, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    # Meta-parameters
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr,
    IEEE: tl.constexpr, QK_IN_LOOP: tl.constexpr, WU_IN_LOOP: tl.constexpr, POOL_VK: tl.constexpr,
):  # fmt: skip
    """Per (BV value columns, request x v-head), chunk by chunk: with S the state (float32) and S_r
    it rounded to DT (what `_chunk_state_kernel` stores as H),

        U' = U - W S_r,  O = (e^gamma q^) S_r + (tril(q^ k^T) e^(gamma_t - gamma_s)) U',
        S = e^gamma_last S + k^T (e^(gamma_last - gamma) U')

    rounded at the same points as the two kernels it replaces; the final S goes to the pool. q^ and
    the decayed causal block: computed here from q (QK_IN_LOOP), else read from the T kernel's
    `qhat` / `amat` (its FUSE_OUT). W and U: computed here from T, k^, v and beta as `_chunk_wu_kernel`
    does (WU_IN_LOOP: W for all K columns in every one of a head's V / BV programs), else read."""
    i_v, i_n, i_hv, i_h, bos, eos = _serial_program(cu_seqlens, H, HV, HV)
    o_t, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    m_h = (o_k < K)[:, None] & (o_v < V)[None, :]
    p_pool, b_s = _pool_state(pool, indices, has_initial_state, i_n, i_hv, o_k, o_v, m_h, HV, K, V, POOL_VK)

    for j in range(tl.cdiv(eos - bos, C)):
        t0 = bos + j * C
        nj = tl.minimum(eos - t0, C)
        m_t = o_t < nj
        # the state-free operands first
        p_k = tl.make_block_ptr(khat + (t0 * H + i_h) * K, (nj, K), (H * K, 1), (0, 0), (C, BK), (1, 0))
        b_k = round_to(tl.load(p_k, boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
        b_g = tl.load(gcum + (t0 + o_t) * HV + i_hv, mask=m_t, other=0)
        b_glast = tl.load(gcum + (t0 + nj - 1) * HV + i_hv)
        if QK_IN_LOOP:
            p_q = tl.make_block_ptr(q + t0 * stride_qt + i_h * K, (nj, K), (stride_qt, 1), (0, 0), (C, BK), (1, 0))
            b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
            b_q = round_to(l2_normalized(b_q, 1, DT) * scale, DT, EMULATE)
            b_a = _causal_qk(b_q, b_k, b_g, m_t, DT, EMULATE, IEEE)
            b_q = b_q.to(tl.float32)
        else:
            p_q = tl.make_block_ptr(qhat + (t0 * H + i_h) * K, (nj, K), (H * K, 1), (0, 0), (C, BK), (1, 0))
            p_a = tl.make_block_ptr(amat + (t0 * HV + i_hv) * C, (nj, C), (HV * C, 1), (0, 0), (C, C), (1, 0))
            b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
            b_a = round_to(tl.load(p_a, boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
        b_qg = round_to(b_q * exp_in(b_g, DT, EMULATE)[:, None], DT, EMULATE)
        # then the recurrence
        b_sr = round_to(b_s, DT, EMULATE)
        if WU_IN_LOOP:  # W = T (beta e^gamma k^), U = T (beta v), rounded as _chunk_wu_kernel stores them
            b_beta = tl.load(beta + (t0 + o_t) * HV + i_hv, mask=m_t, other=0)
            p_T = tl.make_block_ptr(tmat + (t0 * HV + i_hv) * C, (nj, C), (HV * C, 1), (0, 0), (C, C), (1, 0))
            b_T = round_to(tl.load(p_T, boundary_check=(0,), padding_option="zero"), DT, EMULATE)
            b_w = _t_times(b_T, b_k, b_beta * exp_in(b_g, DT, EMULATE), DT, EMULATE, IEEE)
            p_v = tl.make_block_ptr(
                v + t0 * stride_vt + i_hv * V, (nj, V), (stride_vt, 1), (0, i_v * BV), (C, BV), (1, 0)
            )
            b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero")
            b_u = _t_times(b_T, b_v, b_beta, DT, EMULATE, IEEE).to(tl.float32)
        else:
            p_w = tl.make_block_ptr(w + (t0 * HV + i_hv) * K, (nj, K), (HV * K, 1), (0, 0), (C, BK), (1, 0))
            p_u = tl.make_block_ptr(u + (t0 * HV + i_hv) * V, (nj, V), (HV * V, 1), (0, i_v * BV), (C, BV), (1, 0))
            b_w = round_to(tl.load(p_w, boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
            b_u = tl.load(p_u, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_vn = round_to(b_u - mm(b_w, b_sr, EMULATE, IEEE), DT, EMULATE)  # U' = U - W S
        b_o = mm(b_qg, b_sr, EMULATE, IEEE) + mm(b_a, b_vn, EMULATE, IEEE)
        p_o = tl.make_block_ptr(o + (t0 * HV + i_hv) * V, (nj, V), (HV * V, 1), (0, i_v * BV), (C, BV), (1, 0))
        tl.store(p_o, round_to(b_o, DT, EMULATE).to(DT), boundary_check=(0, 1))
        b_s = _state_step(b_s, b_vn, b_k, b_g, b_glast, DT, EMULATE, IEEE)
    tl.store(p_pool, b_s, mask=m_h)


# ---- the output ---------------------------------------------------------------------------------------
# No BV = 32: with num_warps=4, num_stages=2 Triton 3.6 compiles this kernel into one that reads shared
# memory out of range on an H200 (`attnbench sweep --sanitize memcheck`: "Invalid __shared__ read of
# size 1024 bytes"; an illegal address at T = 32768). Reproduction: docs/findings.md.
# BVI: the program's BV columns computed BVI at a time (the q^ k^T block and q^ shared by the blocks, the
# accumulator BVI wide). Besides one block of 64 or 128 columns, the tuner weighs 128 columns in two blocks of
# 64: sm_90 ptxas puts that at 194 registers on 4 warps (255 for one block of 128, 2 programs an SM), and at 168
# without spilling under maxnreg=168 (3 programs an SM, as BV = 64 alone, which computes the q^ k^T block twice
# per chunk and head); 158 on 8 warps. With them the extend took 4.1-5.0% less time on every gdn_extend row of
# the `gdn` suite but T1024 (0.6%) (H200, h200-session28/extend2: T32768 H32 2184.6 against 2300.7 us);
# `gdn_out=narrow` keeps the one-block configs alone.
_OUT_NARROW = [
    triton.Config({"BV": 64, "BVI": 64}, num_warps=4, num_stages=2),
    triton.Config({"BV": 128, "BVI": 128}, num_warps=8, num_stages=2),
    triton.Config({"BV": 128, "BVI": 128}, num_warps=4, num_stages=2),
]
_OUT_CONFIGS = autotune_configs(
    [
        *_OUT_NARROW,
        triton.Config({"BV": 128, "BVI": 64}, num_warps=4, num_stages=2, maxnreg=168),
        triton.Config({"BV": 128, "BVI": 64}, num_warps=4, num_stages=2),
        triton.Config({"BV": 128, "BVI": 64}, num_warps=8, num_stages=2),
    ]
)


@triton.jit
def _chunk_out_kernel(
    # Pointers
    q, khat, gcum, h, vnew, o, chunks, cu_seqlens,
    # Sizes and strides
    stride_qt, scale, ROWS_KEY, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    # Meta-parameters
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr,
    IEEE: tl.constexpr, BVI: tl.constexpr,
):  # fmt: skip
    i_c, i_hv, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    bos, n = _chunk_bounds(chunks, cu_seqlens, i_c, C)
    o_t = tl.arange(0, C)
    m_t = o_t < n
    i_c64 = tl.program_id(0).to(tl.int64)
    p_q = tl.make_block_ptr(q + bos * stride_qt + i_h * K, (n, K), (stride_qt, 1), (0, 0), (C, BK), (1, 0))
    p_k = tl.make_block_ptr(khat + (bos * H + i_h) * K, (n, K), (H * K, 1), (0, 0), (C, BK), (1, 0))
    p_h = tl.make_block_ptr(h + (i_c64 * HV + i_hv) * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BVI), (1, 0))
    p_vn = tl.make_block_ptr(vnew + (bos * HV + i_hv) * V, (n, V), (HV * V, 1), (0, i_v * BV), (C, BVI), (1, 0))
    p_o = tl.make_block_ptr(o + (bos * HV + i_hv) * V, (n, V), (HV * V, 1), (0, i_v * BV), (C, BVI), (1, 0))

    b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
    b_q = round_to(l2_normalized(b_q, 1, DT) * scale, DT, EMULATE)
    b_k = round_to(tl.load(p_k, boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
    b_g = tl.load(gcum + (bos + o_t) * HV + i_hv, mask=m_t, other=0)
    b_a = _causal_qk(b_q, b_k, b_g, m_t, DT, EMULATE, IEEE)
    b_qg = round_to(b_q.to(tl.float32) * exp_in(b_g, DT, EMULATE)[:, None], DT, EMULATE)
    for i in tl.static_range(0, BV, BVI):  # the program's columns in blocks of BVI: a smaller accumulator
        b_h = round_to(tl.load(tl.advance(p_h, (0, i)), boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
        b_vn = round_to(tl.load(tl.advance(p_vn, (0, i)), boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
        b_o = mm(b_qg, b_h, EMULATE, IEEE) + mm(b_a, b_vn, EMULATE, IEEE)
        tl.store(tl.advance(p_o, (0, i)), round_to(b_o, DT, EMULATE).to(DT), boundary_check=(0, 1))  # DT values


# Tuned per power-of-two bucket of the launch's (chunk, head) rows, `ROWS_KEY` (`rows_key`). Keyed on the
# head dims alone, the config tuned on the first case of those dims served every later one: in the `gdn`
# suite a T = 1024 request (16 x 32 rows) is tuned before T = 32768 (512 x 32), whose extend then took
# 3052.9 us on an H200 in session 28 against 2346.6 in session 27 with the same configs (h200-session28).
OUT_TUNED = {
    name: triton.autotune(configs=configs, key=["ROWS_KEY", "H", "HV", "K", "V"])(_chunk_out_kernel)
    for name, configs in (("", _OUT_CONFIGS), ("narrow", autotune_configs(_OUT_NARROW)))
}  # `gdn_out`: "" the default configs, "narrow" the one-block ones alone


def out_tune_for(dtype: torch.dtype, out_tune: str = "") -> str:
    """The output kernel's configs (`OUT_TUNED`'s key) for inputs of `dtype`: `out_tune` when given; else
    "narrow" for float32 (IEEE dots, a correctness path: the split-column configs are timed on 16-bit inputs
    only, and each float32 config of K = V = 128 takes 10-137 s of sm_90 ptxas on the CPU machine, a minute
    of a smoke run's tuning per config), "" for bf16/fp16."""
    return out_tune or ("narrow" if dtype == torch.float32 else "")


def rows_key(chunks: int, heads: int) -> int:
    """The output kernel's autotuning bucket of a launch of `chunks` x `heads` (chunk, head) rows: the
    next power of two, so a tuned config serves launches of up to twice another's size."""
    return triton.next_power_of_2(max(1, chunks * heads))


def gamma_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of gamma, the in-chunk cumulative log decay (`ChunkPlan.gcum`), for inputs of `dtype`.

    The kernels take e^(gamma_t - gamma_s), and a float32 gamma is off by up to half an ulp of |gamma|,
    which reaches 100 in a chunk of strong decay: 4e-6 relative error in the weights, whatever the order
    of the sum. Beside bf16/fp16 rounding that is noise; beside a float32 twin it is not. On an H200 a
    float32 smoke case (gdn_extend/b1-t64-h2x6-d16x16-initnone-scale0.4-fp32, gamma down to -97) was
    3.4x over its state bound; the same algorithm on the CPU with gamma summed in float64 and each
    difference rounded once to float32 is 7x closer to float64 than with float32 sums (1.2e-7 against
    8.7e-7). So float32 inputs keep gamma in float64 and round the differences (`exp_in`)."""
    return torch.float64 if dtype == torch.float32 else torch.float32


# ---- plan and launcher ------------------------------------------------------------------------------------
@dataclass
class ChunkPlan:
    """Which request and chunk each chunk-parallel program takes, plus the workspaces (built once)."""

    chunks: torch.Tensor  # [NC, 2] int32: (request, chunk index within it)
    chunk_offsets: torch.Tensor  # [B + 1] int32: first plan row of each request
    gcum: torch.Tensor  # [T, HV] fp32; fp64 for float32 inputs (`gamma_dtype`)
    khat: torch.Tensor  # [T, H, K]: the L2-normalised keys
    tmat: torch.Tensor | None  # [T, HV, C] input dtype (None: W and U come from the T kernel, TriConfig.wu)
    w: torch.Tensor | None  # [T, HV, K] (None: fuse_out "wu")
    u: torch.Tensor | None  # [T, HV, V] (None: fuse_out "wu")
    h: torch.Tensor | None  # [NC, HV, K, V]: the state at the start of every chunk (None: fused output)
    vnew: torch.Tensor | None  # [T, HV, V]: U' = U - W S (None: fused output)
    fuse_out: str = ""  # "": separate out kernel; "tri" / "loop" / "wu": the output inside the state recurrence
    qhat: torch.Tensor | None = None  # [T, H, K]: the normalised, scaled queries (fuse_out "tri" only)
    amat: torch.Tensor | None = None  # [T, HV, C]: the decayed causal q^ k^T block (fuse_out "tri" only)
    groups: int = 1  # v-head groups, each with its own state / output stream (`head_groups`; 1: one launch each)
    sides: list | None = None  # per group, the stream of its state pass and output kernel (CUDA)
    ready: list | None = None  # per group, the event after its chunk-parallel kernels (CUDA)


def head_groups(H: int, HV: int, groups: int) -> int:
    """The most v-head groups, at most `groups`, that cut HV into equal groups each holding whole GQA
    groups (a q/k head's HV / H v-heads stay together): the pointers of a group start at its first head."""
    per_qk = HV // H
    return max(g for g in range(1, max(1, groups) + 1) if HV % g == 0 and (HV // g) % per_qk == 0)


def plan(
    lens: list[int], H: int, HV: int, K: int, V: int, dtype: torch.dtype, device, fuse_out: str = "",
    tri: TriConfig = TRI, groups: int = 1,
) -> ChunkPlan:  # fmt: skip
    """The chunk rows and workspaces for requests of `lens` tokens. `fuse_out`: "" a separate output
    kernel; "tri", "loop" or "wu" the output inside the state recurrence (no H / U' workspaces), its q^ k^T
    block from the T kernel ("tri": q^ and the block as workspaces) or computed in the loop ("loop", "wu"),
    and with "wu" W and U too (no W / U workspaces, no `_chunk_wu_kernel`). `tri.wu`: W and U from the T
    kernel, no T workspace (not with fuse_out "wu", which needs T).

    `groups` > 1 (separate output kernel only): the v-heads are cut into that many groups
    (`head_groups`), and while the chunk-parallel kernels (cumsum, T, W/U) of group g + 1 run on the
    caller's stream, the serial state pass and the output kernel of group g run on a high-priority
    stream of its own: the state pass (one program per value block and head, serial over chunks,
    latency-bound: its time does not shrink with its head count) overlaps the next groups' work and the
    other groups' state passes instead of following all of it. One shared side stream serialises the
    passes: h200-session25/gdng measured that design at 1.2-5.5x the ungrouped time."""
    if fuse_out not in FUSE_OUT_MODES:
        raise ValueError(f"fuse_out must be one of {FUSE_OUT_MODES}, not {fuse_out!r}")
    if tri.wu and fuse_out == "wu":
        raise ValueError("TriConfig.wu computes W and U in the T kernel; fuse_out='wu' computes them from T")
    rows, offsets = [], [0]
    for n, L in enumerate(lens):
        nc = triton.cdiv(L, CHUNK)
        rows += [(n, j) for j in range(nc)]
        offsets.append(offsets[-1] + nc)
    if groups > 1 and fuse_out:
        raise ValueError("head groups pipeline the separate output kernel; fuse_out fuses it into the state pass")
    T, NC = sum(lens), max(len(rows), 1)
    groups = head_groups(H, HV, groups)
    cuda = torch.device(device).type == "cuda" and groups > 1
    return ChunkPlan(
        chunks=torch.tensor(rows or [(0, 0)], dtype=torch.int32, device=device),
        chunk_offsets=torch.tensor(offsets, dtype=torch.int32, device=device),
        gcum=torch.empty(T, HV, dtype=gamma_dtype(dtype), device=device),
        khat=torch.empty(T, H, K, dtype=dtype, device=device),
        tmat=None if tri.wu else torch.empty(T, HV, CHUNK, dtype=dtype, device=device),
        w=None if fuse_out == "wu" else torch.empty(T, HV, K, dtype=dtype, device=device),
        u=None if fuse_out == "wu" else torch.empty(T, HV, V, dtype=dtype, device=device),
        h=None if fuse_out else torch.empty(NC, HV, K, V, dtype=dtype, device=device),
        vnew=None if fuse_out else torch.empty(T, HV, V, dtype=dtype, device=device),
        fuse_out=fuse_out,
        qhat=torch.empty(T, H, K, dtype=dtype, device=device) if fuse_out == "tri" else None,
        amat=torch.empty(T, HV, CHUNK, dtype=dtype, device=device) if fuse_out == "tri" else None,
        groups=groups,
        sides=[torch.cuda.Stream(device=device, priority=-1) for _ in range(groups)] if cuda else None,
        ready=[torch.cuda.Event() for _ in range(groups)] if cuda else None,
    )


def _from_head(t: torch.Tensor | None, first: int) -> torch.Tensor | None:
    """`t` from head `first` on (dim 1 indexes heads): the same memory, its pointer at that head; the
    kernels address heads with the full head count's strides, so a grid over a group's heads reaches them."""
    return t if t is None or first == 0 else t[:, first:]


def launch_tri(
    k: torch.Tensor, beta: torch.Tensor, cu_seqlens: torch.Tensor, p: ChunkPlan, tri: TriConfig,
    q: torch.Tensor | None = None, scale: float = 1.0, v: torch.Tensor | None = None,
    heads: tuple[int, int] | None = None,
):  # fmt: skip
    """The T kernel (p.tmat, p.khat from k, beta, p.gcum) with the knobs `tri`; with `p.fuse_out` "tri"
    also p.qhat and p.amat from `q` and `scale`; with `tri.wu` p.w and p.u (from `v`) instead of p.tmat.
    `heads`: (first, count) v-heads only (a `head_groups` group); None: all."""
    T, H, K = k.shape
    HV = beta.shape[1]
    first, count = heads or (0, HV)
    first_qk = first // (HV // H)
    fused = p.fuse_out == "tri"
    q_, qhat, amat = (q, p.qhat, p.amat) if fused else (k, p.khat, p.khat)  # never touched unless fused
    v_, w, u, tmat = (v, p.w, p.u, p.khat) if tri.wu else (k, p.khat, p.khat, p.tmat)  # the same
    V = v_.shape[2] if tri.wu else K
    qk_views = [_from_head(t, first_qk) for t in (k, p.khat, q_, qhat)]
    if tri.wu:
        v_, w, u = (_from_head(t, first) for t in (v_, w, u))
    else:
        tmat = _from_head(tmat, first)
    k_, khat, q_, qhat = qk_views
    amat = _from_head(amat, first) if fused else amat
    _chunk_tri_batched_kernel[(p.chunks.shape[0], count)](
        k_, _from_head(beta, first), _from_head(p.gcum, first), tmat, khat, p.chunks, cu_seqlens, q_, qhat,
        amat, v_, w, u,
        k.stride(0), q_.stride(0), v_.stride(0), scale, H=H, HV=HV, K=K, V=V, C=CHUNK, S=SUB,
        BK=max(16, triton.next_power_of_2(K)), BV=min(64, max(16, triton.next_power_of_2(V))),
        DT=TL_DTYPES[k.dtype], EMULATE=INTERPRET,
        IEEE=k.dtype == torch.float32, P_NEU=tri.neumann, P_NEWTON=tri.newton, P_MERGE=tri.merge,
        KK_ONCE=tri.kk == "once", SUBST=tri.diag == "subst", FUSE_OUT=fused, WU=tri.wu, num_warps=tri.num_warps,
        **({"maxnreg": tri.maxnreg} if tri.maxnreg and not INTERPRET else {}),
    )  # fmt: skip


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    pool: torch.Tensor,
    indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    o: torch.Tensor,
    p: ChunkPlan,
    *,
    scale: float,
    tri: TriConfig = TRI,
    pool_layout: str = "kv",
    state_regs: bool = False,
    out_tune: str = "",
) -> None:
    """Varlen chunked prefill: writes `o [T, HV, V]` and every request's final state into `pool`.

    Args:
        q, k: `[T, H, K]` raw (normalised here); v: `[T, HV, V]`; g, beta: `[T, HV]` fp32 gates.
        pool: `[N, HV, K, V]` fp32; indices: `[B]` slots; has_initial_state: `[B]` bool.
        cu_seqlens: `[B+1]` int32; p: the plan from `plan()` for these lengths.
        tri: the T kernel's knobs for bf16/fp16 inputs (float32 inputs take `TRI_IEEE`).
        pool_layout: "kv" (the pool as above) or "vk" (`[N, HV, V, K]`, K-last).
        state_regs: the state pass on the transposed state (`_chunk_state_regs_kernel`; separate output
            kernel only), else `_chunk_state_kernel`.
        out_tune: the output kernel's configs, `OUT_TUNED`'s key ("" or "narrow"; "": `out_tune_for`).
    """
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    B = indices.shape[0]
    NC = p.chunks.shape[0]
    assert q.stride(2) == 1 and k.stride(2) == 1 and q.stride(1) == K and k.stride(1) == K
    assert v.stride(1) == V and v.stride(2) == 1 and g.is_contiguous() and beta.is_contiguous()
    assert K <= 256 and V <= 256, "K and V up to 256"
    if T == 0:
        return
    DT = TL_DTYPES[q.dtype]
    ieee = q.dtype == torch.float32
    BK = max(16, triton.next_power_of_2(K))
    common = dict(DT=DT, EMULATE=INTERPRET)
    vk = pool_is_k_last(pool, pool_layout, K, V)
    tri = replace(TRI_IEEE, wu=tri.wu) if ieee else tri
    wu = p.fuse_out == "wu"
    b_key = B if B < 64 else B // 64 * 64
    if p.fuse_out:
        _chunk_cumsum_kernel[(NC, HV)](g, p.gcum, p.chunks, cu_seqlens, HV=HV, C=CHUNK)
        launch_tri(k, beta, cu_seqlens, p, tri, q, scale, v)
        if not wu and not tri.wu:
            _launch_wu(v, beta, cu_seqlens, p, (0, HV), H, K, BK, ieee, common)
        loop = p.fuse_out in ("loop", "wu")
        qhat, amat = (p.khat, p.khat) if loop else (p.qhat, p.amat)  # never read when computed in the loop
        w, u = (p.khat, v) if wu else (p.w, p.u)  # the same
        tmat = p.tmat if wu else p.khat  # the same
        _chunk_state_out_kernel[lambda meta: (triton.cdiv(V, meta["BV"]), B * HV)](
            q, qhat, p.khat, amat, p.gcum, w, u, o, pool, indices, has_initial_state, cu_seqlens, v, beta, tmat,
            q.stride(0), v.stride(0), scale, b_key, H=H, HV=HV, K=K, V=V, C=CHUNK, BK=BK, IEEE=ieee,
            QK_IN_LOOP=loop, WU_IN_LOOP=wu, POOL_VK=vk, **common,
        )  # fmt: skip
        return
    G = HV // p.groups  # v-heads per group
    main = torch.cuda.current_stream(q.device) if p.sides is not None else None
    for i in range(p.groups):
        heads = (i * G, G)
        first, first_qk = i * G, i * G // (HV // H)
        _chunk_cumsum_kernel[(NC, G)](_from_head(g, first), _from_head(p.gcum, first), p.chunks, cu_seqlens,
                                      HV=HV, C=CHUNK)  # fmt: skip
        launch_tri(k, beta, cu_seqlens, p, tri, q, scale, v, heads=heads)
        if not tri.wu:
            _launch_wu(v, beta, cu_seqlens, p, heads, H, K, BK, ieee, common)
        if main is not None:  # the group's inputs and workspaces, written on the caller's stream
            p.ready[i].record(main)
            p.sides[i].wait_event(p.ready[i])
        with torch.cuda.stream(p.sides[i]) if main is not None else contextlib.nullcontext():
            khat, q_ = _from_head(p.khat, first_qk), _from_head(q, first_qk)
            gcum, h, vnew = (_from_head(t, first) for t in (p.gcum, p.h, p.vnew))
            state_kernel = _chunk_state_regs_kernel if state_regs else _chunk_state_kernel
            state_kernel[lambda meta: (triton.cdiv(V, meta["BV"]), B * G)](
                khat, gcum, _from_head(p.w, first), _from_head(p.u, first), h, vnew, _from_head(pool, first),
                indices, has_initial_state, cu_seqlens, p.chunk_offsets, b_key, H=H, HV=HV, K=K, V=V, HVG=G,
                C=CHUNK, BK=BK, IEEE=ieee, POOL_VK=vk, **common,
            )  # fmt: skip
            OUT_TUNED[out_tune_for(q.dtype, out_tune)][lambda meta: (NC, G, triton.cdiv(V, meta["BV"]))](
                q_, khat, gcum, h, vnew, _from_head(o, first), p.chunks, cu_seqlens, q.stride(0), scale,
                rows_key(NC, G), H=H, HV=HV, K=K, V=V, C=CHUNK, BK=BK, IEEE=ieee, **common,
            )  # fmt: skip
    for side in p.sides or ():
        main.wait_stream(side)  # the output and the pool, for whatever the caller runs next


def _launch_wu(v, beta, cu_seqlens, p: ChunkPlan, heads: tuple[int, int], H, K, BK, ieee, common):
    """`_chunk_wu_kernel` over v-heads [first, first + count) (`heads`)."""
    first, count = heads
    HV, V = v.shape[1], v.shape[2]
    _chunk_wu_kernel[(p.chunks.shape[0], count)](
        _from_head(p.khat, first // (HV // H)), _from_head(v, first), _from_head(beta, first),
        _from_head(p.gcum, first), _from_head(p.tmat, first), _from_head(p.w, first), _from_head(p.u, first),
        p.chunks, cu_seqlens, v.stride(0), H=H, HV=HV, K=K, V=V, C=CHUNK, BK=BK,
        BV=min(64, max(16, triton.next_power_of_2(V))), IEEE=ieee, num_warps=8, **common,
    )  # fmt: skip
