"""Chunked (WY / UT form) GDN prefill in Triton: varlen, initial states from a pool, final states back.

Per chunk of C = 64 tokens and v-head, with gamma the in-chunk cumulative log decay, q^/k^ the
L2-normalised q (times scale) and k, L[t, s] = beta_t exp(gamma_t - gamma_s) (k^_t . k^_s) for s < t:

    T  = (I + L)^-1                       _chunk_tri: 16x16 diagonal blocks (Neumann product + one
                                          Newton step), then the off-diagonal blocks from them; it
                                          also stores k^ once per q/k head for the later kernels
    W  = T (beta exp(gamma) k^),  U = T (beta v)                            _chunk_wu
    per request, chunk by chunk:  H_c = S (stored),  U' = U - W S,
        S = exp(gamma_last) S + k^T (exp(gamma_last - gamma) U')           _chunk_state (sequential)
    O  = (exp(gamma) q^) H_c + (tril(q^ k^T) exp(gamma_t - gamma_s)) U'     _chunk_out

Every matmul takes operands rounded to the input dtype and accumulates in float32; T, W, U, U' and H
are stored in the input dtype (the twin in attnbench.references.gdn rounds at the same points).
The plan (which request and chunk each program takes) is built once per case from host lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from attnbench.kernels.triton.gdn_common import INTERPRET, L2_EPS, TL_DTYPES, autotune_configs, mm, round_to

CHUNK = 64
SUB = 16  # the diagonal blocks of the triangular inverse


@triton.jit
def _load_norm_rows(p, rows, m_rows, o_k, m_k, stride_t, scale, DT: tl.constexpr, EMULATE: tl.constexpr):
    """Rows `rows` of a `[*, K]` slice at `p`: L2-normalised, times `scale`, rounded to DT."""
    b_x = tl.load(p + rows[:, None] * stride_t + o_k[None, :], mask=m_rows[:, None] & m_k[None, :], other=0)
    b_x = b_x.to(tl.float32)
    b_x = b_x / tl.sqrt(tl.sum(b_x * b_x, 1) + L2_EPS)[:, None] * scale
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
    b_g = tl.load(g + (bos + o_t) * HV + i_hv, mask=m_t, other=0).to(tl.float32)
    tl.store(gcum + (bos + o_t) * HV + i_hv, tl.cumsum(b_g, 0), mask=m_t)


# ---- T = (I + L)^-1 -------------------------------------------------------------------------------
@triton.jit
def _l_block(k_i, k_j, gam_i, gam_j, beta_i, m_i, m_j, S: tl.constexpr, DIAG: tl.constexpr,
             EMULATE: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    """Block (i, j) of L: beta_t exp(gamma_t - gamma_s) k_t . k_s (strictly lower inside a diagonal block).

    k_i, k_j are normalised keys already rounded to the input dtype: a tensor-core dot, fp32 accumulation.
    """
    b_kk = mm(k_i, tl.trans(k_j), EMULATE, IEEE)
    keep = m_i[:, None] & m_j[None, :]
    if DIAG:
        r = tl.arange(0, S)
        keep = keep & (r[:, None] > r[None, :])
    diff = tl.where(keep, gam_i[:, None] - gam_j[None, :], 0.0)
    return tl.where(keep, beta_i[:, None] * tl.exp(diff) * b_kk, 0.0)


@triton.jit
def _unit_lower_inverse(L, S: tl.constexpr):
    """(I + L)^-1 of a 16 x 16 strictly lower L (nilpotent: L^16 = 0), with matmuls only.

    The Neumann series in product form, (I - L)(I + L^2)(I + L^4)(I + L^8), then one Newton step
    X += X (I - (I + L) X), which squares its error: float32 error ~3e-7 relative even for strongly
    correlated keys (|L| entries near 1), where the product alone loses ~6e-4.
    """
    r = tl.arange(0, S)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    N1 = -L
    N2 = tl.dot(N1, N1, input_precision="ieee")
    N4 = tl.dot(N2, N2, input_precision="ieee")
    N8 = tl.dot(N4, N4, input_precision="ieee")
    X = tl.dot(eye + N1, eye + N2, input_precision="ieee")
    X = tl.dot(X, eye + N4, input_precision="ieee")
    X = tl.dot(X, eye + N8, input_precision="ieee")
    return X + tl.dot(X, eye - tl.dot(eye + L, X, input_precision="ieee"), input_precision="ieee")


@triton.jit
def _chunk_tri_kernel(
    # Pointers
    k, beta, gcum, tmat, khat, chunks, cu_seqlens,
    # Sizes and strides
    stride_kt, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
    # Meta-parameters
    C: tl.constexpr, S: tl.constexpr, BK: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr,
    IEEE: tl.constexpr,
):  # fmt: skip
    i_c, i_hv = tl.program_id(0), tl.program_id(1)
    i_h = i_hv // (HV // H)
    bos, n = _chunk_bounds(chunks, cu_seqlens, i_c, C)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    r = tl.arange(0, S)
    p_k = k + bos * stride_kt + i_h * K
    # the four 16-row sub-blocks: normalised k (rounded like every matmul operand), gamma, beta
    k0 = _load_norm_rows(p_k, r, r < n, o_k, m_k, stride_kt, 1.0, DT, EMULATE)
    k1 = _load_norm_rows(p_k, S + r, S + r < n, o_k, m_k, stride_kt, 1.0, DT, EMULATE)
    k2 = _load_norm_rows(p_k, 2 * S + r, 2 * S + r < n, o_k, m_k, stride_kt, 1.0, DT, EMULATE)
    k3 = _load_norm_rows(p_k, 3 * S + r, 3 * S + r < n, o_k, m_k, stride_kt, 1.0, DT, EMULATE)
    m0, m1, m2, m3 = r < n, S + r < n, 2 * S + r < n, 3 * S + r < n
    if i_hv % (HV // H) == 0:  # one program per q/k head keeps the normalised keys for the later kernels
        p_kh = khat + ((bos + r) * H + i_h)[:, None] * K + o_k[None, :]
        m_kk = m_k[None, :]
        tl.store(p_kh, k0, mask=m0[:, None] & m_kk)
        tl.store(p_kh + S * H * K, k1, mask=m1[:, None] & m_kk)
        tl.store(p_kh + 2 * S * H * K, k2, mask=m2[:, None] & m_kk)
        tl.store(p_kh + 3 * S * H * K, k3, mask=m3[:, None] & m_kk)
    p_g = gcum + bos * HV + i_hv
    p_b = beta + bos * HV + i_hv
    g0 = tl.load(p_g + r * HV, mask=m0, other=0)
    g1 = tl.load(p_g + (S + r) * HV, mask=m1, other=0)
    g2 = tl.load(p_g + (2 * S + r) * HV, mask=m2, other=0)
    g3 = tl.load(p_g + (3 * S + r) * HV, mask=m3, other=0)
    b0 = tl.load(p_b + r * HV, mask=m0, other=0)
    b1 = tl.load(p_b + (S + r) * HV, mask=m1, other=0)
    b2 = tl.load(p_b + (2 * S + r) * HV, mask=m2, other=0)
    b3 = tl.load(p_b + (3 * S + r) * HV, mask=m3, other=0)

    X00 = _unit_lower_inverse(_l_block(k0, k0, g0, g0, b0, m0, m0, S, True, EMULATE, IEEE), S)
    X11 = _unit_lower_inverse(_l_block(k1, k1, g1, g1, b1, m1, m1, S, True, EMULATE, IEEE), S)
    X22 = _unit_lower_inverse(_l_block(k2, k2, g2, g2, b2, m2, m2, S, True, EMULATE, IEEE), S)
    X33 = _unit_lower_inverse(_l_block(k3, k3, g3, g3, b3, m3, m3, S, True, EMULATE, IEEE), S)
    L10 = _l_block(k1, k0, g1, g0, b1, m1, m0, S, False, EMULATE, IEEE)
    L20 = _l_block(k2, k0, g2, g0, b2, m2, m0, S, False, EMULATE, IEEE)
    L21 = _l_block(k2, k1, g2, g1, b2, m2, m1, S, False, EMULATE, IEEE)
    L30 = _l_block(k3, k0, g3, g0, b3, m3, m0, S, False, EMULATE, IEEE)
    L31 = _l_block(k3, k1, g3, g1, b3, m3, m1, S, False, EMULATE, IEEE)
    L32 = _l_block(k3, k2, g3, g2, b3, m3, m2, S, False, EMULATE, IEEE)
    # block forward substitution: X_ij = -X_ii sum_{j <= l < i} L_il X_lj
    X10 = -tl.dot(X11, tl.dot(L10, X00, input_precision="ieee"), input_precision="ieee")
    X21 = -tl.dot(X22, tl.dot(L21, X11, input_precision="ieee"), input_precision="ieee")
    X32 = -tl.dot(X33, tl.dot(L32, X22, input_precision="ieee"), input_precision="ieee")
    acc = tl.dot(L20, X00, input_precision="ieee")
    acc = tl.dot(L21, X10, acc, input_precision="ieee")
    X20 = -tl.dot(X22, acc, input_precision="ieee")
    acc = tl.dot(L31, X11, input_precision="ieee")
    acc = tl.dot(L32, X21, acc, input_precision="ieee")
    X31 = -tl.dot(X33, acc, input_precision="ieee")
    acc = tl.dot(L30, X00, input_precision="ieee")
    acc = tl.dot(L31, X10, acc, input_precision="ieee")
    acc = tl.dot(L32, X20, acc, input_precision="ieee")
    X30 = -tl.dot(X33, acc, input_precision="ieee")

    # T rows of this chunk: [n, 64] in the input dtype; blocks above the diagonal are zero
    p_t = tmat + ((bos + r) * HV + i_hv)[:, None] * C + r[None, :]
    zero = tl.zeros([S, S], dtype=tl.float32)
    m0, m1, m2, m3 = m0[:, None], m1[:, None], m2[:, None], m3[:, None]
    p1, p2, p3 = p_t + S * HV * C, p_t + 2 * S * HV * C, p_t + 3 * S * HV * C
    tl.store(p_t, round_to(X00, DT, EMULATE), mask=m0)
    tl.store(p_t + S, zero, mask=m0)
    tl.store(p_t + 2 * S, zero, mask=m0)
    tl.store(p_t + 3 * S, zero, mask=m0)
    tl.store(p1, round_to(X10, DT, EMULATE), mask=m1)
    tl.store(p1 + S, round_to(X11, DT, EMULATE), mask=m1)
    tl.store(p1 + 2 * S, zero, mask=m1)
    tl.store(p1 + 3 * S, zero, mask=m1)
    tl.store(p2, round_to(X20, DT, EMULATE), mask=m2)
    tl.store(p2 + S, round_to(X21, DT, EMULATE), mask=m2)
    tl.store(p2 + 2 * S, round_to(X22, DT, EMULATE), mask=m2)
    tl.store(p2 + 3 * S, zero, mask=m2)
    tl.store(p3, round_to(X30, DT, EMULATE), mask=m3)
    tl.store(p3 + S, round_to(X31, DT, EMULATE), mask=m3)
    tl.store(p3 + 2 * S, round_to(X32, DT, EMULATE), mask=m3)
    tl.store(p3 + 3 * S, round_to(X33, DT, EMULATE), mask=m3)


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
    b_rk = round_to(b_k * (b_beta * tl.exp(b_g))[:, None], DT, EMULATE)
    p_w = tl.make_block_ptr(w + (bos * HV + i_hv) * K, (n, K), (HV * K, 1), (0, 0), (C, BK), (1, 0))
    tl.store(p_w, round_to(mm(b_T, b_rk, EMULATE, IEEE), DT, EMULATE).to(DT), boundary_check=(0, 1))
    for i_v in tl.static_range(0, V, BV):
        p_v = tl.make_block_ptr(
            v + bos * stride_vt + i_hv * V, (n, V), (stride_vt, 1), (0, i_v), (C, BV), (1, 0)
        )
        b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_rv = round_to(b_v * b_beta[:, None], DT, EMULATE)
        p_u = tl.make_block_ptr(u + (bos * HV + i_hv) * V, (n, V), (HV * V, 1), (0, i_v), (C, BV), (1, 0))
        tl.store(p_u, round_to(mm(b_T, b_rv, EMULATE, IEEE), DT, EMULATE).to(DT), boundary_check=(0, 1))


# ---- the state recurrence over chunks ---------------------------------------------------------------------
_STATE_CONFIGS = autotune_configs(
    [
        triton.Config({"BV": 32}, num_warps=4, num_stages=2),
        triton.Config({"BV": 64}, num_warps=4, num_stages=2),
        triton.Config({"BV": 64}, num_warps=8, num_stages=2),
        triton.Config({"BV": 16}, num_warps=2, num_stages=2),
    ]
)


@triton.autotune(configs=_STATE_CONFIGS, key=["B_KEY", "H", "HV", "K", "V"], restore_value=["pool"])
@triton.jit
def _chunk_state_kernel(
    # Pointers
    khat, gcum, w, u, h, vnew, pool, indices, has_initial_state, cu_seqlens, chunk_offsets,
    # Sizes and strides
    B_KEY, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    # Meta-parameters
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr,
    IEEE: tl.constexpr,
):  # fmt: skip
    i_v, i_nh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    c0 = tl.load(chunk_offsets + i_n).to(tl.int64)
    o_t, o_k, o_v = tl.arange(0, C), tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    m_h = (o_k < K)[:, None] & (o_v < V)[None, :]
    p_pool = (
        pool + (tl.load(indices + i_n).to(tl.int64) * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]
    )
    init = tl.load(has_initial_state + i_n) != 0
    b_s = tl.load(p_pool, mask=m_h & init, other=0).to(tl.float32)

    for j in range(tl.cdiv(eos - bos, C)):
        t0 = bos + j * C
        nj = tl.minimum(eos - t0, C)
        b_sr = round_to(b_s, DT, EMULATE)
        p_h = tl.make_block_ptr(
            h + ((c0 + j) * HV + i_hv) * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0)
        )
        tl.store(p_h, b_sr.to(DT), boundary_check=(0, 1))
        p_w = tl.make_block_ptr(w + (t0 * HV + i_hv) * K, (nj, K), (HV * K, 1), (0, 0), (C, BK), (1, 0))
        p_u = tl.make_block_ptr(
            u + (t0 * HV + i_hv) * V, (nj, V), (HV * V, 1), (0, i_v * BV), (C, BV), (1, 0)
        )
        p_vn = tl.make_block_ptr(
            vnew + (t0 * HV + i_hv) * V, (nj, V), (HV * V, 1), (0, i_v * BV), (C, BV), (1, 0)
        )
        p_k = tl.make_block_ptr(khat + (t0 * H + i_h) * K, (nj, K), (H * K, 1), (0, 0), (C, BK), (1, 0))
        b_w = round_to(tl.load(p_w, boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
        b_u = tl.load(p_u, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_vn = round_to(b_u - mm(b_w, b_sr, EMULATE, IEEE), DT, EMULATE)  # U' = U - W S
        tl.store(p_vn, b_vn.to(DT), boundary_check=(0, 1))
        b_g = tl.load(gcum + (t0 + o_t) * HV + i_hv, mask=o_t < nj, other=0)
        b_glast = tl.load(gcum + (t0 + nj - 1) * HV + i_hv)
        b_k = round_to(tl.load(p_k, boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
        b_vd = round_to(b_vn.to(tl.float32) * tl.exp(b_glast - b_g)[:, None], DT, EMULATE)
        b_s = b_s * tl.exp(b_glast) + mm(tl.trans(b_k), b_vd, EMULATE, IEEE)
    tl.store(p_pool, b_s, mask=m_h)


# ---- the output ---------------------------------------------------------------------------------------
# No BV = 32: with num_warps=4, num_stages=2 Triton 3.6 compiles this kernel into one that reads shared
# memory out of range on an H200 (`attnbench sweep --sanitize memcheck`: "Invalid __shared__ read of
# size 1024 bytes"; an illegal address at T = 32768). Reproduction: docs/findings.md.
_OUT_CONFIGS = autotune_configs(
    [
        triton.Config({"BV": 64}, num_warps=4, num_stages=2),
        triton.Config({"BV": 128}, num_warps=8, num_stages=2),
        triton.Config({"BV": 128}, num_warps=4, num_stages=2),
    ]
)


@triton.autotune(configs=_OUT_CONFIGS, key=["H", "HV", "K", "V"])
@triton.jit
def _chunk_out_kernel(
    # Pointers
    q, khat, gcum, h, vnew, o, chunks, cu_seqlens,
    # Sizes and strides
    stride_qt, scale, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    # Meta-parameters
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr,
    IEEE: tl.constexpr,
):  # fmt: skip
    i_c, i_hv, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    bos, n = _chunk_bounds(chunks, cu_seqlens, i_c, C)
    o_t = tl.arange(0, C)
    m_t = o_t < n
    i_c64 = tl.program_id(0).to(tl.int64)
    p_q = tl.make_block_ptr(q + bos * stride_qt + i_h * K, (n, K), (stride_qt, 1), (0, 0), (C, BK), (1, 0))
    p_k = tl.make_block_ptr(khat + (bos * H + i_h) * K, (n, K), (H * K, 1), (0, 0), (C, BK), (1, 0))
    p_h = tl.make_block_ptr(h + (i_c64 * HV + i_hv) * K * V, (K, V), (V, 1), (0, i_v * BV), (BK, BV), (1, 0))
    p_vn = tl.make_block_ptr(
        vnew + (bos * HV + i_hv) * V, (n, V), (HV * V, 1), (0, i_v * BV), (C, BV), (1, 0)
    )
    p_o = tl.make_block_ptr(o + (bos * HV + i_hv) * V, (n, V), (HV * V, 1), (0, i_v * BV), (C, BV), (1, 0))

    b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
    b_q = round_to(b_q / tl.sqrt(tl.sum(b_q * b_q, 1) + L2_EPS)[:, None] * scale, DT, EMULATE)
    b_k = round_to(tl.load(p_k, boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
    b_g = tl.load(gcum + (bos + o_t) * HV + i_hv, mask=m_t, other=0)
    keep = (o_t[:, None] >= o_t[None, :]) & m_t[:, None] & m_t[None, :]
    b_a = mm(b_q, tl.trans(b_k), EMULATE, IEEE)
    b_a = round_to(
        tl.where(keep, b_a * tl.exp(tl.where(keep, b_g[:, None] - b_g[None, :], 0.0)), 0.0), DT, EMULATE
    )
    b_qg = round_to(b_q.to(tl.float32) * tl.exp(b_g)[:, None], DT, EMULATE)
    b_h = round_to(tl.load(p_h, boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
    b_vn = round_to(tl.load(p_vn, boundary_check=(0, 1), padding_option="zero"), DT, EMULATE)
    b_o = mm(b_qg, b_h, EMULATE, IEEE) + mm(b_a, b_vn, EMULATE, IEEE)
    tl.store(p_o, round_to(b_o, DT, EMULATE).to(DT), boundary_check=(0, 1))  # block stores take DT values


# ---- plan and launcher ------------------------------------------------------------------------------------
@dataclass
class ChunkPlan:
    """Which request and chunk each chunk-parallel program takes, plus the workspaces (built once)."""

    chunks: torch.Tensor  # [NC, 2] int32: (request, chunk index within it)
    chunk_offsets: torch.Tensor  # [B + 1] int32: first plan row of each request
    gcum: torch.Tensor  # [T, HV] fp32
    khat: torch.Tensor  # [T, H, K]: the L2-normalised keys
    tmat: torch.Tensor  # [T, HV, C] input dtype
    w: torch.Tensor  # [T, HV, K]
    u: torch.Tensor  # [T, HV, V]
    h: torch.Tensor  # [NC, HV, K, V]: the state at the start of every chunk
    vnew: torch.Tensor  # [T, HV, V]: U' = U - W S


def plan(lens: list[int], H: int, HV: int, K: int, V: int, dtype: torch.dtype, device) -> ChunkPlan:
    rows, offsets = [], [0]
    for n, L in enumerate(lens):
        nc = triton.cdiv(L, CHUNK)
        rows += [(n, j) for j in range(nc)]
        offsets.append(offsets[-1] + nc)
    T, NC = sum(lens), max(len(rows), 1)
    return ChunkPlan(
        chunks=torch.tensor(rows or [(0, 0)], dtype=torch.int32, device=device),
        chunk_offsets=torch.tensor(offsets, dtype=torch.int32, device=device),
        gcum=torch.empty(T, HV, dtype=torch.float32, device=device),
        khat=torch.empty(T, H, K, dtype=dtype, device=device),
        tmat=torch.empty(T, HV, CHUNK, dtype=dtype, device=device),
        w=torch.empty(T, HV, K, dtype=dtype, device=device),
        u=torch.empty(T, HV, V, dtype=dtype, device=device),
        h=torch.empty(NC, HV, K, V, dtype=dtype, device=device),
        vnew=torch.empty(T, HV, V, dtype=dtype, device=device),
    )


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
) -> None:
    """Varlen chunked prefill: writes `o [T, HV, V]` and every request's final state into `pool`.

    Args:
        q, k: `[T, H, K]` raw (normalised here); v: `[T, HV, V]`; g, beta: `[T, HV]` fp32 gates.
        pool: `[N, HV, K, V]` fp32; indices: `[B]` slots; has_initial_state: `[B]` bool.
        cu_seqlens: `[B+1]` int32; p: the plan from `plan()` for these lengths.
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
    _chunk_cumsum_kernel[(NC, HV)](g, p.gcum, p.chunks, cu_seqlens, HV=HV, C=CHUNK)
    _chunk_tri_kernel[(NC, HV)](
        k, beta, p.gcum, p.tmat, p.khat, p.chunks, cu_seqlens, k.stride(0), H=H, HV=HV, K=K, C=CHUNK, S=SUB,
        BK=BK, IEEE=ieee, num_warps=4, **common,
    )  # fmt: skip
    _chunk_wu_kernel[(NC, HV)](
        p.khat, v, beta, p.gcum, p.tmat, p.w, p.u, p.chunks, cu_seqlens, v.stride(0), H=H, HV=HV, K=K, V=V,
        C=CHUNK, BK=BK, BV=min(64, max(16, triton.next_power_of_2(V))), IEEE=ieee, num_warps=8, **common,
    )  # fmt: skip
    _chunk_state_kernel[lambda meta: (triton.cdiv(V, meta["BV"]), B * HV)](
        p.khat, p.gcum, p.w, p.u, p.h, p.vnew, pool, indices, has_initial_state, cu_seqlens, p.chunk_offsets,
        B if B < 64 else B // 64 * 64, H=H, HV=HV, K=K, V=V, C=CHUNK, BK=BK, IEEE=ieee, **common,
    )  # fmt: skip
    _chunk_out_kernel[lambda meta: (NC, HV, triton.cdiv(V, meta["BV"]))](
        q, p.khat, p.gcum, p.h, p.vnew, o, p.chunks, cu_seqlens, q.stride(0), scale, H=H, HV=HV, K=K, V=V,
        C=CHUNK, BK=BK, IEEE=ieee, **common,
    )  # fmt: skip
