"""Float64 references for the Gated DeltaNet (GDN) family: gating, causal conv1d, and the gated delta rule.

Written from the math in docs/conventions.md ("Canonical semantics", "GDN speculative verify and commit") and
the SGLang/FLA semantics it summarises; importable on its own (plain tensors in, plain tensors out, nothing
from `attnbench.kernels` or the harness).

Gating (per token and v-head), softplus with threshold 20 (`x` itself above it)::

    g    = -exp(A_log) * softplus(a + dt_bias)        log-space decay, fp32
    beta = sigmoid(b)

Gated delta rule, per sequence and v-head `hv` (state `S [K, V]`, fp32 in the pools)::

    q^ = q / sqrt(sum q^2 + 1e-6) * scale,  k^ = k / sqrt(sum k^2 + 1e-6)    scale = K**-0.5 by default
    S  = exp(g_t) S                         decay first
    u  = beta_t (v_t - S^T k^_t)            delta against the decayed state
    S  = S + k^_t u^T
    o_t = S^T q^_t                          output from the updated state

q/k head of v-head `hv` is `hv // (HV / H)` (GVA). The chunked (WY / UT) form computes the same thing
chunk by chunk: with gamma = in-chunk cumulative g, Gamma = exp(gamma), L[t, s] = beta_t Gamma_t /
Gamma_s (k^_t . k^_s) for s < t and T = (I + L)^-1::

    W = T (beta Gamma k^),  U = T (beta v),  U' = U - W S0               (the delta-rule "new values")
    O = (Gamma q^) S0 + (tril(q^ k^T) * Gamma_t / Gamma_s) U'
    S = Gamma_C S0 + k^T (Gamma_C / Gamma * U')

Causal conv1d (width W, SiLU), per request over `x~ = [state (W-1 raw inputs) | x]` (zeros when the
request has no initial state)::

    y[t] = silu(bias + sum_j weight[:, j] * x~[t + j]),   new state = the last W-1 rows of x~

Speculative verify and commit: verify runs T draft tokens per request (a chain, or a tree whose token
t continues from token `parents[t]`, -1 = the pool) and keeps, per token, the recurrent state and the
conv window (the W-1 most recent raw inputs along the token's path) after it, leaving the pools alone;
commit then copies the state and window after the last accepted token into the request's pool slots
(none accepted: the pools keep the pre-verify state). Decoding the accepted tokens one by one ends in
the same pools.

Pools: states `[N, HV, K, V]` fp32 and conv states `[N, dim, W-1]`, addressed by per-request indices;
a negative index is padding: nothing is read from or written to the pool for it (its outputs are
computed from a zero state here; the op contracts leave them unspecified).

`precision=torch.float64` gives the reference. `precision=<the case dtype>` gives the native-precision
twin the tolerance rule scales from: float32 arithmetic on the low-precision inputs, outputs rounded
to the case dtype once, states kept in float32, softplus as the serving kernels write it
(`log(1 + exp(x))` in float32, whose cancellation for negative x dominates the state error of a
decode step); the chunked twin also rounds every matmul operand to the case dtype (as a tensor-core
chunk kernel does).
"""

from __future__ import annotations

import torch

__all__ = [
    "L2_EPS",
    "SOFTPLUS_THRESHOLD",
    "CHUNK",
    "l2norm",
    "softplus",
    "gating",
    "causal_conv1d",
    "causal_conv1d_update",
    "causal_conv1d_verify",
    "recurrent_gated_delta_rule",
    "chunk_gated_delta_rule",
    "gdn_decode",
    "gdn_extend",
    "gdn_verify",
    "gdn_commit",
]

L2_EPS = 1e-6  # q / sqrt(sum q^2 + eps): FLA's and SGLang's in-kernel L2 norm
SOFTPLUS_THRESHOLD = 20.0
CHUNK = 64

D64 = torch.float64


def _acc(precision: torch.dtype) -> torch.dtype:
    return D64 if precision == D64 else torch.float32


# ---- elementwise pieces ----------------------------------------------------------------------------
def l2norm(x: torch.Tensor, eps: float = L2_EPS) -> torch.Tensor:
    """`x / sqrt(sum(x^2, -1) + eps)` over the last dim, in x's dtype."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def softplus(x: torch.Tensor, threshold: float = SOFTPLUS_THRESHOLD) -> torch.Tensor:
    """`log(1 + exp(x))`, and `x` itself where `x > threshold`."""
    return torch.where(x > threshold, x, torch.log1p(torch.exp(torch.clamp(x, max=threshold))))


def gating(
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    *,
    threshold: float = SOFTPLUS_THRESHOLD,
    precision: torch.dtype = D64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDN gates from raw projections.

    Args:
        A_log: `[HV]` log of the per-head decay rate.
        a, b: `[..., HV]` raw gate inputs (any float dtype).
        dt_bias: `[HV]`.
    Returns:
        g `[..., HV]` log-space decay `-exp(A_log) * softplus(a + dt_bias)` and beta `[..., HV]`
        `sigmoid(b)`, float64 (float32 for a low-precision twin: the gates are fp32 tensors).
    """
    acc = _acc(precision)
    x = a.to(acc) + dt_bias.to(acc)
    if precision == D64:
        sp = softplus(x, threshold)
    else:  # the twin: softplus as the kernels write it, log(1 + exp(x)) in float32 (no log1p)
        sp = torch.where(x > threshold, x, torch.log(1.0 + torch.exp(torch.clamp(x, max=threshold))))
    g = -torch.exp(A_log.to(acc)) * sp
    return g, torch.sigmoid(b.to(acc))


# ---- causal conv1d ---------------------------------------------------------------------------------
def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    cache_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    silu: bool = True,
    precision: torch.dtype = D64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen causal depthwise conv1d over packed tokens, with per-request conv states.

    Args:
        x: `[T, dim]` token-major packed inputs (SGLang passes the `[dim, T]` transposed view of this).
        weight: `[dim, W]`; bias: `[dim]` or None.
        conv_states: `[N, dim, W-1]` pool of the last W-1 raw inputs per slot.
        cache_indices: `[B]` slot of each request; has_initial_state: `[B]` bool (False: zeros).
        query_start_loc: `[B+1]` offsets of each request's tokens in x.
    Returns:
        y `[T, dim]` (float64, or x's dtype for the twin) and the pool after the call (conv_states'
        dtype: the new states are copies of raw inputs, so they are exact).
    """
    acc = _acc(precision)
    low = precision != D64
    W = weight.shape[1]
    y = torch.zeros(x.shape, dtype=x.dtype if low else D64, device=x.device)
    new_states = conv_states.clone()
    w = weight.to(acc)
    starts = query_start_loc.tolist()
    for bi, (idx, init) in enumerate(zip(cache_indices.tolist(), has_initial_state.tolist(), strict=True)):
        qs, qe = starts[bi], starts[bi + 1]
        if idx < 0:
            continue
        prev = conv_states[idx].transpose(0, 1)
        prev = prev if init else torch.zeros_like(prev)
        xt = torch.cat([prev.to(x.dtype), x[qs:qe]], dim=0)  # [W-1 + n, dim], raw inputs
        n = qe - qs
        out = torch.zeros(n, x.shape[1], dtype=acc, device=x.device)
        if bias is not None:
            out = out + bias.to(acc)
        for j in range(W):
            out = out + w[:, j] * xt[j : j + n].to(acc)
        if silu:
            out = out * torch.sigmoid(out)
        y[qs:qe] = out.to(y.dtype)
        new_states[idx] = xt[n:].transpose(0, 1).to(conv_states.dtype)
    return y, new_states


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    cache_indices: torch.Tensor,
    *,
    silu: bool = True,
    precision: torch.dtype = D64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode token per request: `x [B, dim]` against the state of slot `cache_indices[b]`.

    Same as `causal_conv1d` with one token per request and an initial state for every request.
    """
    B = x.shape[0]
    qsl = torch.arange(B + 1, device=x.device)
    init = torch.ones(B, dtype=torch.bool, device=x.device)
    return causal_conv1d(x, weight, bias, conv_states, cache_indices, init, qsl, silu=silu, precision=precision)


def causal_conv1d_verify(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    cache_indices: torch.Tensor,
    parents: torch.Tensor | None = None,
    *,
    silu: bool = True,
    precision: torch.dtype = D64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative verify: T draft tokens per request through the conv, the window after each kept.

    Token t of request b continues from the window after token `parents[b, t]` (-1: the pool state of
    slot `cache_indices[b]`); parents None is the chain t - 1. Its output is
    `silu(bias + sum_j weight[:, j] * [window | x_t][:, j])` and its own window is the last W-1 columns
    of `[window | x_t]`: the W-1 most recent raw inputs along its path (root to t via parents).

    Args:
        x: `[B, T, dim]` draft tokens per request; weight: `[dim, W]`; bias: `[dim]` or None.
        conv_states: `[N, dim, W-1]` pool (only read); cache_indices: `[B]` (negative: padding).
        parents: `[B, T]` int or None.
    Returns:
        y `[B, T, dim]` (float64, or x's dtype for the twin; zeros for padding requests) and the windows
        `[B, T, dim, W-1]` in conv_states' dtype (copies of raw inputs, exact; zeros for padding).
    """
    acc = _acc(precision)
    B, T, D = x.shape
    W = weight.shape[1]
    y = torch.zeros(B, T, D, dtype=x.dtype if precision != D64 else D64, device=x.device)
    windows = torch.zeros(B, T, D, W - 1, dtype=conv_states.dtype, device=x.device)
    w = weight.to(acc)
    for bi, idx in enumerate(cache_indices.tolist()):
        if idx < 0:
            continue
        for t in range(T):
            p = t - 1 if parents is None else int(parents[bi, t])
            before = conv_states[idx] if p < 0 else windows[bi, p]  # [D, W-1]
            full = torch.cat([before, x[bi, t, :, None].to(conv_states.dtype)], dim=1)  # [D, W] raw inputs
            out = (w * full.to(acc)).sum(1)
            if bias is not None:
                out = out + bias.to(acc)
            if silu:
                out = out * torch.sigmoid(out)
            y[bi, t] = out.to(y.dtype)
            windows[bi, t] = full[:, 1:]
    return y, windows


# ---- the gated delta rule on one sequence --------------------------------------------------------------
def _prepare_qk(q, k, HV, scale, normalize, acc):
    """q^, k^ `[T, HV, K]` in `acc`: L2-normalised (optional), q scaled, q/k heads repeated for GVA."""
    qf, kf = q.to(acc), k.to(acc)
    if normalize:
        qf, kf = l2norm(qf), l2norm(kf)
    group = HV // q.shape[1]
    return (qf * scale).repeat_interleave(group, dim=1), kf.repeat_interleave(group, dim=1)


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    parents: list[int] | None = None,
    normalize_qk: bool = True,
    precision: torch.dtype = D64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The recurrence step by step for one sequence (exact in float64).

    Args:
        q, k: `[T, H, K]`; v: `[T, HV, V]`; g, beta: `[T, HV]` (log-space decay, post-sigmoid beta).
        scale: multiplies q^ (default K**-0.5).
        initial_state: `[HV, K, V]` or None (zeros).
        parents: step t starts from the state after step `parents[t]` (-1: the initial state);
            default: the chain `t - 1`.
    Returns:
        o `[T, HV, V]`, final state `[HV, K, V]` (after the last step), and the state after every
        step `[T, HV, K, V]`. Float64, or float32 states and an output in v's dtype for the twin.
    """
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    acc = _acc(precision)
    scale = K**-0.5 if scale is None else scale
    qh, kh = _prepare_qk(q, k, HV, scale, normalize_qk, acc)
    vf, gf, bf = v.to(acc), g.to(acc), beta.to(acc)
    S0 = torch.zeros(HV, K, V, dtype=acc, device=q.device) if initial_state is None else initial_state.to(acc)
    states = torch.empty(T, HV, K, V, dtype=acc, device=q.device)
    o = torch.empty(T, HV, V, dtype=acc, device=q.device)
    for t in range(T):
        p = t - 1 if parents is None else parents[t]
        S = S0 if p < 0 else states[p]
        S = S * torch.exp(gf[t])[:, None, None]
        u = bf[t][:, None] * (vf[t] - torch.einsum("hkv,hk->hv", S, kh[t]))
        S = S + kh[t][:, :, None] * u[:, None, :]
        o[t] = torch.einsum("hkv,hk->hv", S, qh[t])
        states[t] = S
    final = states[-1] if T else S0
    if precision != D64:
        o = o.to(v.dtype)
    return o, final, states


def _chunk_step(S, qc, kc, vc, gc, bc, r, acc):
    """One chunk of the WY / UT form (module docstring) for a batch: S `[B, HV, K, V]`; qc/kc
    `[B, HV, n, K]` (q^, k^, operands already rounded); vc `[B, HV, n, V]`; gc/bc `[B, HV, n]`.
    Returns (o `[B, HV, n, V]`, S after the chunk). A token with q = k = v = g = beta = 0 (padding
    after a sequence's end) changes nothing: its rows and columns of L, W, U and Aqk are 0."""
    n = qc.shape[-2]
    gam = torch.cumsum(gc, dim=-1)  # [B, HV, n]
    diff = gam[..., :, None] - gam[..., None, :]  # gamma_t - gamma_s
    strict = torch.ones(n, n, dtype=torch.bool, device=qc.device).tril(-1)
    causal = torch.ones(n, n, dtype=torch.bool, device=qc.device).tril()
    decay = torch.exp(torch.where(causal, diff, torch.zeros_like(diff)))  # <= 1 where used
    L = torch.where(strict, bc[..., :, None] * decay * (kc @ kc.transpose(-1, -2)), torch.zeros_like(diff))
    eye = torch.eye(n, dtype=acc, device=qc.device).expand_as(L)
    Tm = r(torch.linalg.solve_triangular(eye + L, eye, upper=False, unitriangular=True))
    W = r(Tm @ r(kc * (bc * torch.exp(gam))[..., None]))  # [B, HV, n, K]
    U = r(Tm @ r(vc * bc[..., None]))  # [B, HV, n, V]
    Sr = r(S)
    Unew = r(U - W @ Sr)
    Aqk = r(torch.where(causal, (qc @ kc.transpose(-1, -2)) * decay, torch.zeros_like(diff)))
    o = r(qc * torch.exp(gam)[..., None]) @ Sr + Aqk @ Unew
    last = gam[..., -1:]  # [B, HV, 1]
    S = S * torch.exp(last)[..., None] + kc.transpose(-1, -2) @ r(Unew * torch.exp(last - gam)[..., None])
    return o, S


def _take(x: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Packed `x [T, HV, *]` at positions `pos [B, C]` -> `[B, HV, C, *]`, zero where not `valid`."""
    t = x[pos]
    keep = valid.view(*valid.shape, *([1] * (t.dim() - 2)))
    return torch.where(keep, t, torch.zeros((), dtype=t.dtype, device=t.device)).transpose(1, 2)


def _rounder(precision: torch.dtype):
    """A matmul operand in the kernel's input dtype (the twin), or as it is (float64)."""
    acc = _acc(precision)
    if precision == D64:
        return lambda x: x
    return lambda x: x.to(precision).to(acc)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = CHUNK,
    normalize_qk: bool = True,
    precision: torch.dtype = D64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence in the chunked WY / UT form (module docstring) for one sequence.

    Shapes as `recurrent_gated_delta_rule`. In float64 it equals the recurrent form to rounding.
    With a low `precision` it is the twin of a tensor-core chunk kernel: float32 arithmetic, and
    every matmul operand (q^, k^, T, the W/U right-hand sides, W, U, U', the state, the masked
    q^ k^T) rounded to that dtype first.
    Returns:
        o `[T, HV, V]` and the final state `[HV, K, V]`.
    """
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    low = precision != D64
    acc = _acc(precision)
    r = _rounder(precision)
    scale = K**-0.5 if scale is None else scale
    qh, kh = _prepare_qk(q, k, HV, scale, normalize_qk, acc)
    qh, kh = r(qh).transpose(0, 1)[None], r(kh).transpose(0, 1)[None]  # [1, HV, T, K]
    vf = v.to(acc).transpose(0, 1)[None]  # [1, HV, T, V]
    gf, bf = g.to(acc).transpose(0, 1)[None], beta.to(acc).transpose(0, 1)[None]  # [1, HV, T]
    S = torch.zeros(1, HV, K, V, dtype=acc, device=q.device)
    if initial_state is not None:
        S = initial_state.to(acc).clone()[None]
    o = torch.empty(1, HV, T, V, dtype=acc, device=q.device)
    for c0 in range(0, T, chunk_size):
        c1 = min(T, c0 + chunk_size)
        sl = slice(c0, c1)
        o[:, :, sl], S = _chunk_step(S, qh[:, :, sl], kh[:, :, sl], vf[:, :, sl], gf[:, :, sl], bf[:, :, sl], r, acc)
    o = o[0].transpose(0, 1)
    return (o.to(v.dtype) if low else o), S[0]


# ---- pool-addressed ops ----------------------------------------------------------------------------
def _gather_states(pool: torch.Tensor, indices: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """States of `indices [B]` from `pool [N, HV, K, V]` in `acc`; zeros for padding (index < 0)."""
    idx = indices.long()
    valid = idx >= 0
    S = pool[torch.where(valid, idx, torch.zeros_like(idx))].to(acc)
    return torch.where(valid[:, None, None, None], S, torch.zeros_like(S))


def _scatter_states(
    pool: torch.Tensor, indices: torch.Tensor, states: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """`pool` (converted to `out_dtype`) with `states [B, ...]` written at the valid indices."""
    out = pool.to(out_dtype).clone()
    idx = indices.long()
    valid = idx >= 0
    out[idx[valid]] = states[valid].to(out_dtype)
    return out


def _batched_step(S, qh, kh, v, g, beta):
    """One step for a batch: S `[B, HV, K, V]`, qh/kh `[B, HV, K]`, v `[B, HV, V]`, g/beta `[B, HV]`."""
    S = S * torch.exp(g)[..., None, None]
    u = beta[..., None] * (v - torch.einsum("bhkv,bhk->bhv", S, kh))
    S = S + kh[..., :, None] * u[..., None, :]
    return S, torch.einsum("bhkv,bhk->bhv", S, qh)


def _expand_qk(q, k, HV, scale, acc):
    """L2-normalised, scaled q^ and k^ `[..., HV, K]` from `[..., H, K]` (GVA repeat)."""
    group = HV // q.shape[-2]
    qh = (l2norm(q.to(acc)) * scale).repeat_interleave(group, dim=-2)
    kh = l2norm(k.to(acc)).repeat_interleave(group, dim=-2)
    return qh, kh


def gdn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    *,
    scale: float | None = None,
    precision: torch.dtype = D64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One recurrent step per request, gates from raw inputs, states in a pool.

    Args:
        q, k: `[B, H, K]`; v: `[B, HV, V]`; a, b: `[B, HV]` raw gates; A_log, dt_bias: `[HV]`.
        state_pool: `[N, HV, K, V]` fp32; state_indices: `[B]` (negative: padding).
    Returns:
        o `[B, HV, V]` and the pool after the step (float64, or float32 for the twin).
    """
    acc = _acc(precision)
    HV, K = v.shape[1], q.shape[-1]
    scale = K**-0.5 if scale is None else scale
    g, beta = gating(A_log, a, dt_bias, b, precision=precision)
    qh, kh = _expand_qk(q, k, HV, scale, acc)
    S = _gather_states(state_pool, state_indices, acc)
    S, o = _batched_step(S, qh, kh, v.to(acc), g.to(acc), beta.to(acc))
    pool = _scatter_states(state_pool, state_indices, S, acc)
    return (o.to(v.dtype) if precision != D64 else o), pool


def gdn_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    parents: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    precision: torch.dtype = D64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Target verify: T draft tokens per request, the state after every step kept, the pool untouched.

    Args:
        q, k: `[B, T, H, K]`; v: `[B, T, HV, V]`; a, b: `[B, T, HV]`; A_log, dt_bias: `[HV]`.
        state_pool: `[N, HV, K, V]`; state_indices: `[B]` (negative: padding, starts from zeros).
        parents: `[B, T]` int, step t of request b starts from the state after step `parents[b, t]`
            (-1: the pool state); None: the chain t - 1.
    Returns:
        o `[B, T, HV, V]` and the states after every step `[B, T, HV, K, V]`.
    """
    acc = _acc(precision)
    B, T, HV = v.shape[0], v.shape[1], v.shape[2]
    K = q.shape[-1]
    scale = K**-0.5 if scale is None else scale
    g, beta = gating(A_log, a, dt_bias, b, precision=precision)
    qh, kh = _expand_qk(q, k, HV, scale, acc)
    vf = v.to(acc)
    S0 = _gather_states(state_pool, state_indices, acc)
    states = torch.empty(B, T, *S0.shape[1:], dtype=acc, device=q.device)
    o = torch.empty(B, T, HV, v.shape[-1], dtype=acc, device=q.device)
    rows = torch.arange(B, device=q.device)
    for t in range(T):
        if parents is None:
            S = S0 if t == 0 else states[:, t - 1]
        else:
            p = parents[:, t].long()
            prev = states[rows, p.clamp(min=0)]
            S = torch.where((p < 0)[:, None, None, None], S0, prev)
        S, o[:, t] = _batched_step(S, qh[:, t], kh[:, t], vf[:, t], g[:, t].to(acc), beta[:, t].to(acc))
        states[:, t] = S
    return (o.to(v.dtype) if precision != D64 else o), states


def gdn_extend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
    *,
    scale: float | None = None,
    chunk_size: int = CHUNK,
    precision: torch.dtype = D64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen prefill in the chunked form: initial states from the pool, final states written back.

    Args:
        q, k: `[T, H, K]`; v: `[T, HV, V]`; g, beta: `[T, HV]` fp32 gates; requests packed by
            `cu_seqlens [B+1]`.
        state_pool: `[N, HV, K, V]`; state_indices: `[B]` slots (all valid);
        has_initial_state: `[B]` bool (False: start from zeros, whatever the slot holds).
    Returns:
        o `[T, HV, V]` and the pool after the call (float64, or float32 for the twin).
    """
    acc = _acc(precision)
    r = _rounder(precision)
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    scale = K**-0.5 if scale is None else scale
    starts = cu_seqlens.long()
    lens = starts[1:] - starts[:-1]
    # chunk c of every request still running, at once: requests stay aligned to their own first token,
    # and the positions past a request's end are zero tokens (`_chunk_step`: they change nothing)
    qh, kh = _prepare_qk(q, k, HV, scale, True, acc)
    qh, kh = r(qh), r(kh)
    vf, gf, bf = v.to(acc), g.to(acc), beta.to(acc)
    idx = state_indices.long()
    S = _gather_states(state_pool, torch.where(has_initial_state.to(idx.device), idx, -1), acc)  # zeros: no state
    o = torch.zeros(T, HV, V, dtype=acc, device=q.device)
    steps = torch.arange(chunk_size, device=q.device)
    host_lens = lens.tolist()
    for c0 in range(0, max(host_lens, default=0), chunk_size):
        act = torch.tensor([b for b, n in enumerate(host_lens) if n > c0], device=q.device)  # still running
        at = c0 + steps[None, :]  # [1, C] positions within each request
        valid = at < lens[act, None]  # [A, C]
        pos = torch.where(valid, starts[act, None] + at, torch.zeros_like(at))
        oc, S[act] = _chunk_step(S[act], *(_take(x, pos, valid) for x in (qh, kh, vf, gf, bf)), r, acc)
        o[pos[valid]] = oc.transpose(1, 2)[valid]
    return (o.to(v.dtype) if precision != D64 else o), _scatter_states(state_pool, idx, S, acc)


def gdn_commit(
    inter_states: torch.Tensor,
    inter_conv_windows: torch.Tensor,
    last_accepted: torch.Tensor,
    state_pool: torch.Tensor,
    conv_states: torch.Tensor,
    state_indices: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """After verify: the state and conv window of each request's last accepted token into its pool slots.

    Args:
        inter_states: `[B, T, HV, K, V]` the recurrent state after each draft token (gdn_verify's).
        inter_conv_windows: `[B, T, dim, W-1]` the conv window after each draft token (causal_conv1d's
            verify mode).
        last_accepted: `[B]` int, the draft index of the last accepted token (a chain's accepted length
            minus 1; in a tree, the node that ends the accepted path); -1: none accepted.
        state_pool: `[N, HV, K, V]`; conv_states: `[N, dim, W-1]`; state_indices: `[B]` the slot of each
            request in both pools (negative: padding).
    Returns:
        The two pools after the commit (their own dtypes; copies, so exact): slot `state_indices[b]`
        holds `inter_states[b, last_accepted[b]]` and `inter_conv_windows[b, last_accepted[b]]` where
        both are >= 0; every other slot is as it was.
    """
    pool, conv = state_pool.clone(), conv_states.clone()
    for bi, (slot, last) in enumerate(zip(state_indices.tolist(), last_accepted.tolist(), strict=True)):
        if slot < 0 or last < 0:
            continue
        pool[slot] = inter_states[bi, last].to(pool.dtype)
        conv[slot] = inter_conv_windows[bi, last].to(conv.dtype)
    return pool, conv
