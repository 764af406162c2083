"""The GDN family in plain PyTorch, vectorised over requests and heads (float32 math, case-dtype outputs).

- gating and conv1d: elementwise / gathered windows, no per-request loop; conv verify loops over the
  draft steps only (each step continues its parent's window).
- decode: one step for the whole batch; verify: a loop over the draft steps only.
- commit: one gather-scatter per pool over the requests that accepted a token.
- extend: the chunked WY form (chunk 64). Requests are padded to whole chunks (padding tokens have
  beta = 0 and g = 0, so they change nothing); everything inside a chunk is batched over (request,
  chunk, head), and only the chunk-to-chunk state recurrence loops, over chunk positions.

Pool semantics: a negative state index is padding (zero state in, nothing written back).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2_EPS = 1e-6
CHUNK = 64


# ---- pool writes -----------------------------------------------------------------------------------
def _write_slots(pool: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, keep=None) -> None:
    """`pool[indices[b]] = values[b]` for the rows b whose index is >= 0 (and `keep[b]`), with no host
    sync, so that the closure can be captured in a CUDA graph (a boolean-mask write counts the rows on
    the host). Every row writes: a row that must not is sent to slot 0 carrying the value slot 0 ends
    with (the row that owns it, else slot 0's own), so all writes to one slot carry one value and the
    order they land in does not matter. Real rows' slots are distinct (a batch's)."""
    idx = indices.long()
    if idx.numel() == 0:
        return
    real = idx >= 0 if keep is None else (idx >= 0) & keep
    slot = torch.where(real, idx, torch.zeros_like(idx))
    owns0 = real & (idx == 0)
    owner = values.index_select(0, owns0.to(torch.uint8).argmax().view(1))[0]
    v0 = torch.where(owns0.any(), owner, pool[0].to(values.dtype))
    pool[slot] = torch.where(real.view(-1, *[1] * (values.dim() - 1)), values, v0)


# ---- gating ---------------------------------------------------------------------------------------
def _gates(A_log, a, dt_bias, b) -> tuple[torch.Tensor, torch.Tensor]:
    sp = F.softplus(a.float() + dt_bias.float(), beta=1.0, threshold=20.0)  # x itself above 20
    return -torch.exp(A_log.float()) * sp, torch.sigmoid(b.float())


def gdn_gating(x) -> dict[str, torch.Tensor]:
    g, beta = _gates(x.A_log, x.a, x.dt_bias, x.b)
    x.g.copy_(g)
    x.beta.copy_(beta)
    return {"g": x.g, "beta": x.beta}


# ---- causal conv1d --------------------------------------------------------------------------------
def causal_conv1d(x) -> dict[str, torch.Tensor]:
    """Varlen prefill or one-token update: writes `x.y [T, dim]` and the new conv states."""
    if x.update:
        return _conv_update(x)
    if x.verify:
        return _conv_verify(x)
    dev = x.x.device
    T, D = x.x.shape
    W = x.weight.shape[1]
    B = x.cache_indices.shape[0]
    qsl = x.query_start_loc.long()
    idx = x.cache_indices.long()
    lens = qsl[1:] - qsl[:-1]
    # extended rows, per request [W-1 state rows | its tokens]: token rows start at qsl[b] + (b+1)(W-1)
    init = x.conv_states[idx].transpose(1, 2)  # [B, W-1, D]
    init = torch.where(x.has_initial_state[:, None, None], init, torch.zeros_like(init))
    ext = torch.empty(T + B * (W - 1), D, dtype=x.x.dtype, device=dev)
    req_of_token = torch.repeat_interleave(torch.arange(B, device=dev), lens, output_size=T)
    tok_rows = torch.arange(T, device=dev) + (req_of_token + 1) * (W - 1)
    ext[tok_rows] = x.x
    state_rows = (qsl[:-1] + torch.arange(B, device=dev) * (W - 1))[:, None] + torch.arange(W - 1, device=dev)
    ext[state_rows.flatten()] = init.reshape(-1, D)
    taps = tok_rows[:, None] - (W - 1) + torch.arange(W, device=dev)  # [T, W] rows of each window
    win = ext[taps].float()  # [T, W, D]
    y = (win * x.weight.float().t()[None]).sum(1) + x.bias.float()
    x.y.copy_(F.silu(y))
    ends = qsl[1:] + (torch.arange(B, device=dev) + 1) * (W - 1)  # one past each request's last extended row
    last = ends[:, None] - (W - 1) + torch.arange(W - 1, device=dev)
    x.conv_states[idx] = ext[last].transpose(1, 2)  # [B, D, W-1]
    return {"y": x.y}


def _conv_update(x) -> dict[str, torch.Tensor]:
    """One token per request from its slot's window; padding rows (slot -1) read a zero window and write
    no slot."""
    idx = x.cache_indices.long()
    real = idx >= 0
    prev = x.conv_states[idx.clamp(min=0)]  # [B, D, W-1]
    prev = torch.where(real[:, None, None], prev, torch.zeros_like(prev))
    win = torch.cat([prev, x.x[:, :, None]], dim=2)  # [B, D, W]
    y = (win.float() * x.weight.float()[None]).sum(-1) + x.bias.float()
    x.y.copy_(F.silu(y))
    _write_slots(x.conv_states, idx, win[:, :, 1:])
    return {"y": x.y}


def _conv_verify(x) -> dict[str, torch.Tensor]:
    """Draft tokens per request from the slot's window (or a tree parent's); the pool is only read."""
    windows = x.intermediate_conv_windows  # [B, T, D, W-1]
    B, T, D = windows.shape[0], windows.shape[1], windows.shape[2]
    idx = x.cache_indices.long()
    win0 = x.conv_states[idx.clamp(min=0)]  # [B, D, W-1]
    win0 = torch.where((idx >= 0)[:, None, None], win0, torch.zeros_like(win0))  # padding: zeros
    xs, y = x.x.view(B, T, D), x.y.view(B, T, D)
    w, bias = x.weight.float()[None], x.bias.float()
    rows = torch.arange(B, device=idx.device)
    for t in range(T):
        if x.parents is None:
            prev = win0 if t == 0 else windows[:, t - 1]
        else:
            p = x.parents[:, t].long()
            prev = torch.where((p < 0)[:, None, None], win0, windows[rows, p.clamp(min=0)])
        full = torch.cat([prev, xs[:, t, :, None]], dim=2)  # [B, D, W] raw inputs
        y[:, t] = F.silu((full.float() * w).sum(-1) + bias)
        windows[:, t] = full[:, :, 1:]
    return {"y": x.y, "intermediate_conv_windows": windows}


# ---- speculative commit ---------------------------------------------------------------------------
def gdn_commit(x) -> dict[str, torch.Tensor]:
    """The state and conv window after each request's last accepted token into its pool slots."""
    slot, last = x.state_indices.long(), x.last_accepted.long()
    rows, at = torch.arange(slot.shape[0], device=slot.device), last.clamp(min=0)
    _write_slots(x.state_pool, slot, x.inter_states[rows, at], keep=last >= 0)
    _write_slots(x.conv_states, slot, x.inter_conv_windows[rows, at], keep=last >= 0)
    return {}


# ---- the delta rule -------------------------------------------------------------------------------
def _norm_qk(q, k, HV, scale):
    """L2-normalised, scaled q^ and k^ `[..., HV, K]` in float32 (GVA: head hv reads hv // (HV / H))."""
    group = HV // q.shape[-2]
    qf, kf = q.float(), k.float()
    qf = qf * torch.rsqrt((qf * qf).sum(-1, keepdim=True) + L2_EPS) * scale
    kf = kf * torch.rsqrt((kf * kf).sum(-1, keepdim=True) + L2_EPS)
    return qf.repeat_interleave(group, dim=-2), kf.repeat_interleave(group, dim=-2)


def _load_states(pool: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    idx = indices.long()
    valid = idx >= 0
    S = pool[idx.clamp(min=0)]
    return torch.where(valid[:, None, None, None], S, torch.zeros_like(S)), valid


def _step(S, qh, kh, v, g, beta):
    """One step batched over leading dims: S `[..., K, V]`, qh/kh `[..., K]`, v `[..., V]`, g/beta `[...]`."""
    S = S * torch.exp(g)[..., None, None]
    u = beta[..., None] * (v - (S * kh[..., :, None]).sum(-2))
    S = S + kh[..., :, None] * u[..., None, :]
    return S, (S * qh[..., :, None]).sum(-2)


def gdn_decode(x) -> dict[str, torch.Tensor]:
    """One step per request; writes `x.o [B, HV, V]` and the pool slots of real requests."""
    HV = x.v.shape[1]
    g, beta = _gates(x.A_log, x.a, x.dt_bias, x.b)
    qh, kh = _norm_qk(x.q, x.k, HV, x.scale)
    S, _ = _load_states(x.state_pool, x.state_indices)
    S, o = _step(S, qh, kh, x.v.float(), g, beta)
    x.o.copy_(o)
    _write_slots(x.state_pool, x.state_indices, S)
    return {"o": x.o}


def gdn_verify(x) -> dict[str, torch.Tensor]:
    """`draft` steps per request from its pool state (or a tree parent's state); the pool is only read."""
    B, T, HV = x.batch, x.draft, x.v.shape[1]
    g, beta = _gates(x.A_log, x.a, x.dt_bias, x.b)
    qh, kh = _norm_qk(x.q, x.k, HV, x.scale)
    qh, kh = qh.view(B, T, HV, -1), kh.view(B, T, HV, -1)
    v, g, beta = x.v.float().view(B, T, HV, -1), g.view(B, T, HV), beta.view(B, T, HV)
    S0, _ = _load_states(x.state_pool, x.state_indices)
    o = x.o.view(B, T, HV, -1)
    rows = torch.arange(B, device=S0.device)
    for t in range(T):
        if x.parents is None:
            S = S0 if t == 0 else x.inter_states[:, t - 1]
        else:
            p = x.parents[:, t].long()
            S = torch.where((p < 0)[:, None, None, None], S0, x.inter_states[rows, p.clamp(min=0)])
        S, ot = _step(S, qh[:, t], kh[:, t], v[:, t], g[:, t], beta[:, t])
        x.inter_states[:, t] = S
        o[:, t] = ot
    return {"o": x.o, "inter_states": x.inter_states}


def gdn_extend(x) -> dict[str, torch.Tensor]:
    """Chunked WY form over padded chunks; writes `x.o [T, HV, V]` and every request's final state."""
    dev = x.q.device
    HV, V = x.v.shape[1], x.v.shape[2]
    B = x.state_indices.shape[0]
    cu = x.cu_seqlens.long()
    lens = cu[1:] - cu[:-1]
    nc = int(((lens + CHUNK - 1) // CHUNK).max()) if B else 0
    Tp = max(nc, 1) * CHUNK
    T = x.q.shape[0]
    # scatter packed tokens into [B, Tp, ...] (padding: q = k = v = 0, g = 0, beta = 0)
    req = torch.repeat_interleave(torch.arange(B, device=dev), lens, output_size=T)
    pos = torch.arange(T, device=dev) - cu[req]
    qh, kh = _norm_qk(x.q, x.k, HV, x.scale)

    def padded(t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(B, Tp, *t.shape[1:], dtype=torch.float32, device=dev)
        out[req, pos] = t.float()
        return out.view(B, nc, CHUNK, *t.shape[1:]).transpose(2, 3)  # [B, nc, HV, C, ...]

    q, k, v = padded(qh), padded(kh), padded(x.v)  # [B, nc, HV, C, K|V]
    g, beta = padded(x.g), padded(x.beta)  # [B, nc, HV, C]
    gam = g.cumsum(-1)
    causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=dev).tril()
    diff = gam[..., :, None] - gam[..., None, :]
    decay = torch.exp(torch.where(causal, diff, torch.zeros_like(diff)))
    kk = k @ k.transpose(-1, -2)
    L = torch.where(causal.tril(-1), beta[..., None] * decay * kk, torch.zeros_like(kk))
    eye = torch.eye(CHUNK, device=dev).expand_as(L)
    Tm = torch.linalg.solve_triangular(eye + L, eye, upper=False, unitriangular=True)
    W = Tm @ (k * (beta * torch.exp(gam))[..., None])  # [B, nc, HV, C, K]
    U = Tm @ (v * beta[..., None])  # [B, nc, HV, C, V]
    Aqk = torch.where(causal, (q @ k.transpose(-1, -2)) * decay, torch.zeros_like(kk))
    qg = q * torch.exp(gam)[..., None]
    last = gam[..., -1]  # [B, nc, HV]
    kdec = k * torch.exp(last[..., None] - gam)[..., None]  # k scaled by the decay to the chunk's end
    S, _ = _load_states(x.state_pool, x.state_indices)
    S = torch.where(x.has_initial_state[:, None, None, None], S, torch.zeros_like(S))
    o = torch.empty(B, nc, HV, CHUNK, V, dtype=torch.float32, device=dev)
    for c in range(nc):  # the state recurrence, all requests and heads at once
        Unew = U[:, c] - W[:, c] @ S
        o[:, c] = qg[:, c] @ S + Aqk[:, c] @ Unew
        S = S * torch.exp(last[:, c])[..., None, None] + kdec[:, c].transpose(-1, -2) @ Unew
    x.o.copy_(o.transpose(2, 3).reshape(B, Tp, HV, V)[req, pos])
    x.state_pool[x.state_indices.long()] = S
    return {"o": x.o}
