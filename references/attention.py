"""Float64 references for the attention family: paged decode/extend and state merging.

Written from the math in docs/conventions.md ("Canonical semantics"), independent of every backend:

    s[h, i, j] = (q[i, h] . k[j, h // G]) * sm_scale           G = Hq / Hkv (GQA)
    s = cap * tanh(s / cap)                                     soft cap, when cap > 0
    s = -inf where key j is not visible to query i              causal / window / custom mask
    m = max(max_j s, sink[h]);  l = sum_j exp(s - m) + exp(sink[h] - m)
    o[i, h] = sum_j exp(s - m) v[j, h // G] / l;   lse = m + log(l)  (natural log)

Query i of a request with n new tokens over L keys sits at absolute position p = L - n + i. Causal:
key j is visible iff j <= p (bottom-right aligned). Window W >= 0: additionally j >= p - W (W + 1
keys including itself). A custom mask (bool, [n, L] per request, flattened, True = visible) replaces
causality; the window still applies. A row with no visible key and no sink has o = 0, lse = -inf.
A key no query sees contributes nothing whatever the cache holds there (a sliding-window pool's freed
pages hold other requests' data, which may be anything): it is read as zero.

`precision=torch.float64` is the reference. `precision=<the case dtype>` is the native-precision
twin the tolerance rule scales from: scores from the low-precision inputs with float32 accumulation,
softmax in float32, probabilities rounded to the case dtype before the value product (as a flash
kernel does), normalised in float32 and rounded to the case dtype once at the end.
"""

from __future__ import annotations

import math

import torch

__all__ = ["paged_attention", "merge_state", "saved_cache", "gather_paged"]

_SCORE_BUDGET = 1 << 25  # score elements per chunk of queries (256 MB in float64)


def gather_paged(cache: torch.Tensor, page_indices: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one request from a paged cache `[P, page_size, H, D]` -> `[length, H, D]`."""
    return cache[page_indices.long()].flatten(0, 1)[:length]


def saved_cache(cache: torch.Tensor, new: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """`cache` after writing `new [T, H, D]` into token slots `slots [T]` (slot = page * page_size + offset)."""
    out = cache.clone()
    out.view(-1, *cache.shape[2:])[slots.long()] = new
    return out


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_page_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    *,
    sm_scale: float,
    causal: bool = True,
    window: int = -1,
    soft_cap: float = 0.0,
    sinks: torch.Tensor | None = None,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
    precision: torch.dtype = torch.float64,
    magnitude: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Attention of packed queries over paged keys/values.

    Args:
        q: `[T, Hq, Dk]`, requests packed by `qo_indptr [B+1]`.
        k_cache, v_cache: `[P, page_size, Hkv, Dk]`, `[P, page_size, Hkv, Dv]`.
        kv_indptr `[B+1]`, kv_page_indices `[nnz]`: each request's pages in order (CSR).
        seq_lens: `[B]` keys per request, new tokens included.
        k_new, v_new: `[T, Hkv, D*]` keys/values of the new tokens; when given they replace what the
            cache holds at positions `L - n .. L - 1` (the cache is not read there).
        custom_mask, mask_indptr: flattened bool `[n_b, L_b]` blocks and their offsets `[B+1]`.
        sinks: `[Hq]` logits that only add `exp(sink - m)` to the denominator.
        magnitude: also return `[T, Hq, Dv]` (float64 only) the size float32 rounding of each output
            element follows, to first order: `sum_j w_j |v_j|` (the P.V summands, w = p / l) plus
            `sum_j w_j a_j (|v_j| + |o|)`, `a_j = sm_scale sum_i |q_i k_ji|` (a score's rounding,
            relative to a_j, moves w_j by w_j (v_j - o) per unit). |o| itself can be far smaller:
            values of both signs cancel, and large logits amplify score rounding through exp.
    Returns:
        o `[T, Hq, Dv]` (float64, or the case dtype for the twin) and lse `[T, Hq]` (float64 / float32),
        then the magnitude when asked.
    """
    T, Hq, _ = q.shape
    Dv = v_cache.shape[-1]
    low = precision != torch.float64
    o = torch.zeros(T, Hq, Dv, dtype=q.dtype if low else torch.float64, device=q.device)
    lse = torch.full((T, Hq), -math.inf, dtype=torch.float32 if low else torch.float64, device=q.device)
    mag = torch.zeros(T, Hq, Dv, dtype=torch.float64, device=q.device) if magnitude and not low else None
    indptr, qo, lens = kv_indptr.tolist(), qo_indptr.tolist(), seq_lens.tolist()
    for b in range(len(lens)):
        L, qs, qe = lens[b], qo[b], qo[b + 1]
        n = qe - qs
        if n == 0:
            continue
        pages = kv_page_indices[indptr[b] : indptr[b + 1]]
        K, V = gather_paged(k_cache, pages, L), gather_paged(v_cache, pages, L)
        if k_new is not None:
            K, V = K.clone(), V.clone()
            K[L - n :], V[L - n :] = k_new[qs:qe], v_new[qs:qe]
        mask = None
        if custom_mask is not None:
            mask = custom_mask[int(mask_indptr[b]) : int(mask_indptr[b + 1])].view(n, L)
        step = max(1, _SCORE_BUDGET // max(1, Hq * L))
        for i0 in range(0, n, step):
            i1 = min(n, i0 + step)
            rows = torch.arange(L - n + i0, L - n + i1, device=q.device)
            visible = _visible(rows, L, causal, window, None if mask is None else mask[i0:i1])
            ob, lb, mb = _attend(
                q[qs + i0 : qs + i1], K, V, visible, sm_scale, soft_cap, sinks, precision, mag is not None
            )
            o[qs + i0 : qs + i1], lse[qs + i0 : qs + i1] = ob, lb
            if mag is not None:
                mag[qs + i0 : qs + i1] = mb
    return (o, lse) if mag is None else (o, lse, mag)


def _visible(pos: torch.Tensor, L: int, causal: bool, window: int, mask: torch.Tensor | None) -> torch.Tensor:
    """Bool `[rows, L]`: key j visible to the query at absolute position pos[i]."""
    j = torch.arange(L, device=pos.device)[None, :]
    p = pos[:, None]
    if mask is not None:
        vis = mask.bool().clone()
    elif causal:
        vis = j <= p
    else:
        vis = torch.ones(len(pos), L, dtype=torch.bool, device=pos.device)
    if window >= 0:
        vis &= j >= p - window
    return vis


def _attend(q, K, V, visible, sm_scale, soft_cap, sinks, precision, magnitude=False):
    """Softmax attention of `q [n, Hq, Dk]` over `K [L, Hkv, Dk]`, `V [L, Hkv, Dv]` -> o, lse, magnitude or None."""
    Hq, Hkv = q.shape[1], K.shape[1]
    group = Hq // Hkv
    low = precision != torch.float64
    acc = torch.float32 if low else torch.float64
    seen = visible.any(0)[:, None, None]  # keys some query sees; the others may hold poison (0 * NaN = NaN)
    Kh = torch.where(seen, K.to(acc), 0.0).repeat_interleave(group, dim=1)  # [L, Hq, Dk]
    Vh = torch.where(seen, V.to(acc), 0.0).repeat_interleave(group, dim=1)
    s = torch.einsum("nhd,lhd->hnl", q.to(acc), Kh) * sm_scale
    if soft_cap > 0:
        s = soft_cap * torch.tanh(s / soft_cap)
    s = s.masked_fill(~visible[None], -math.inf)
    m = s.amax(dim=-1)  # [Hq, n]
    if sinks is not None:
        sink = sinks.to(acc)[:, None].expand_as(m)
        m = torch.maximum(m, sink)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m_safe[..., None])
    denom = p.sum(dim=-1)
    if sinks is not None:
        denom = denom + torch.exp(sink - m_safe)
    if low:
        p = p.to(q.dtype).to(acc)  # a flash kernel feeds rounded probabilities to the value product
    num = torch.einsum("hnl,lhd->nhd", p, Vh)
    d = denom.transpose(0, 1)[..., None]
    d_safe = torch.where(d > 0, d, torch.ones_like(d))
    o = torch.where(d > 0, num / d_safe, torch.zeros_like(num))
    lse = torch.where(denom > 0, m_safe + torch.log(denom), torch.full_like(denom, -math.inf)).transpose(0, 1)
    mag = None
    if magnitude:  # first-order size of float32 rounding: the P.V summands, and the scores' through exp
        w = p / denom.clamp(min=torch.finfo(acc).tiny)[..., None]  # [Hq, n, L], normalised
        a = torch.einsum("nhd,lhd->hnl", q.to(acc).abs(), Kh.abs()) * sm_scale  # sum_i |q_i k_ji|
        wa = w * a  # |d o / d s_j| <= w_j |v_j - o| <= w_j (|v_j| + |o|)
        mag = torch.einsum("hnl,lhd->nhd", w + wa, Vh.abs()) + o.abs() * wa.sum(-1).transpose(0, 1)[..., None]
    return (o.to(q.dtype) if low else o), lse, mag


def merge_state(
    v_a: torch.Tensor,
    s_a: torch.Tensor,
    v_b: torch.Tensor,
    s_b: torch.Tensor,
    precision: torch.dtype = torch.float64,
    magnitude: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Merge two partial attention states over disjoint key sets.

    `v_* [T, H, D]` are normalised partial outputs, `s_* [T, H]` their natural-log LSEs (-inf: empty).
    Returns `v = (v_a e^{s_a} + v_b e^{s_b}) / (e^{s_a} + e^{s_b})` and `s = log(e^{s_a} + e^{s_b})`;
    two empty states merge to `v = 0`, `s = -inf`. `magnitude` (float64 only) also returns
    `(|v_a| e^{s_a} + |v_b| e^{s_b}) / (e^{s_a} + e^{s_b})`, the size of the summands float32 rounds at
    (|v| can be far smaller where they cancel; see paged_attention).
    """
    low = precision != torch.float64
    acc = torch.float32 if low else torch.float64
    sa, sb = s_a.to(acc), s_b.to(acc)
    m = torch.maximum(sa, sb)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    wa, wb = torch.exp(sa - m_safe), torch.exp(sb - m_safe)
    total = wa + wb
    safe = torch.where(total > 0, total, torch.ones_like(total))
    v = (v_a.to(acc) * (wa / safe)[..., None] + v_b.to(acc) * (wb / safe)[..., None]) * (total > 0)[..., None]
    s = torch.where(total > 0, m_safe + torch.log(safe), torch.full_like(total, -math.inf))
    if magnitude and not low:
        mag = (v_a.to(acc).abs() * (wa / safe)[..., None] + v_b.to(acc).abs() * (wb / safe)[..., None]) * (total > 0)[
            ..., None
        ]
        return v, s, mag
    return (v.to(v_a.dtype) if low else v), s
