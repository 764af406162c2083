"""Paged attention (decode and extend) in plain PyTorch, vectorised over requests, heads and queries.

Inputs stay in the case dtype; scores and the value product accumulate in float32 (low-precision
values upcast exactly), probabilities are rounded to the case dtype before the value product, and the
output is rounded once. Requests are processed in groups padded to the group's longest sequence, and
queries in row chunks, so memory stays bounded for long prefills and large batches.

`prepare` turns the page tables and lengths into device index tensors once; the closure it returns
only gathers and computes (no host synchronisation), so it can be captured in a CUDA graph.

A sliding-window layer's own pool (`kv_pool: swa`): `prepare` translates each request's full-pool
pages through `full_to_swa` (as SGLang's attention backends do once per batch), and keys before a
request's first window start are never used (they are zeroed after the gather: their pages were freed
and hold another request's data).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def _budget(device: torch.device) -> int:
    """Elements per float32 working tensor (scores, gathered keys)."""
    return 1 << (28 if device.type == "cuda" else 23)


@dataclass
class _Chunk:
    """Query rows i0..i1 of every request of a group."""

    src: torch.Tensor  # [nb, nr] packed query row (clamped where not a query)
    sel: torch.Tensor  # [n_valid] flat (request, row) positions that are real queries (no bool masks: capturable)
    dst: torch.Tensor  # [n_valid] packed rows to write
    vis: torch.Tensor | None  # [nb, nr, Lpad] bool visibility when it needs no data (no custom mask)
    mask_idx: torch.Tensor | None  # [nb, nr, Lpad] index into the flat custom mask
    inside: torch.Tensor | None  # [nb, nr, Lpad] bool, valid (query, key) pairs for the custom mask


@dataclass
class _Group:
    """Requests b0..b1 padded to Lpad keys."""

    pages: torch.Tensor  # [nb, npages] long
    key_ok: torch.Tensor  # [nb, Lpad] bool
    Lpad: int
    chunks: list[_Chunk]
    new_at: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # attend mode: (batch, position, source row)


def _stored(new: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """New K/V `[T, H, D]` as the cache stores them (fp8 caches: divided by the per-tensor/per-head scale)."""
    return new.to(dtype) if scale is None else (new.float() / scale.view(-1, 1)).to(dtype)


def _loaded(cached: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """Cache entries `[..., H, D]` as float32 values (fp8 caches: times their scale)."""
    return cached.float() if scale is None else cached.float() * scale.view(-1, 1)


def save_new_kv(x) -> None:
    """save_kv_cache: write the new tokens' K/V into their cache slots."""
    k_flat = x.k_cache.view(-1, *x.k_cache.shape[2:])
    k_flat[x.slot_mapping] = _stored(x.k_new, x.k_scale, x.k_cache.dtype)  # index_put: fp8 has no index_copy on CPU
    if x.v_cache.untyped_storage().data_ptr() != x.k_cache.untyped_storage().data_ptr():  # MLA: V is K's latent
        v_flat = x.v_cache.view(-1, *x.v_cache.shape[2:])
        v_flat[x.slot_mapping] = _stored(x.v_new, x.v_scale, x.v_cache.dtype)


def prepare_paged_attention(x):
    """The closure computing attention of `x.q [T, Hq, Dk]` over each request's paged K/V into `x.o`, `x.lse`."""
    lens, qlens = x.seq_lens_host, x.q_lens_host
    Hkv, Dk = x.k_cache.shape[2], x.q.shape[2]
    budget = _budget(x.q.device)
    qo = [0]
    for n in qlens:
        qo.append(qo[-1] + n)
    pages = _page_table(x)
    groups, b0 = [], 0
    while b0 < len(lens):
        b1, lmax = b0 + 1, lens[b0]  # grow the group while its padded keys fit the budget
        while b1 < len(lens) and (b1 + 1 - b0) * max(lmax, lens[b1]) * Hkv * Dk <= budget:
            lmax = max(lmax, lens[b1])
            b1 += 1
        groups.append(_plan_group(x, pages, b0, b1, qo, budget))
        b0 = b1

    def run():
        if x.save_kv:
            save_new_kv(x)
        for g in groups:
            _attend_group(x, g)
        return {"o": x.o, "lse": x.lse}

    return run


def _page_table(x) -> torch.Tensor:
    """Pages of the cache that k_cache/v_cache are: an SWA pool's translated from the full pool's pages."""
    if x.full_to_swa is None:
        return x.kv_page_indices
    return x.full_to_swa[x.full_page_indices.long()]


def _plan_group(x, table: torch.Tensor, b0: int, b1: int, qo: list[int], budget: int) -> _Group:
    device = x.q.device
    lens = torch.tensor(x.seq_lens_host[b0:b1], device=device)
    qlens = torch.tensor(x.q_lens_host[b0:b1], device=device)
    nb, Lpad, nmax = b1 - b0, max(x.seq_lens_host[b0:b1]), max(x.q_lens_host[b0:b1])
    Hq, ps = x.q.shape[1], x.k_cache.shape[1]
    npages = -(-Lpad // ps)
    starts, ends = x.kv_indptr[b0:b1].long(), x.kv_indptr[b0 + 1 : b1 + 1].long()
    idx = starts[:, None] + torch.arange(npages, device=device)[None, :]
    pages = table[torch.where(idx < ends[:, None], idx, torch.zeros_like(idx))].long()
    j = torch.arange(Lpad, device=device)
    key_ok = j[None, :] < lens[:, None]
    first_new = lens - qlens  # absolute position of each request's first query
    if x.window >= 0:  # keys before the first query's window are seen by no query (freed in an SWA pool)
        key_ok &= j[None, :] >= (first_new - x.window)[:, None]
    q_start = torch.tensor(qo[b0:b1], device=device)
    new_at = None
    if x.k_new is not None and not x.save_kv:  # attend: new tokens come from k_new/v_new, not the cache
        r = torch.arange(nmax, device=device)
        ok = r[None, :] < qlens[:, None]
        bi = torch.arange(nb, device=device)[:, None].expand(nb, nmax)[ok]
        new_at = (bi, (first_new[:, None] + r[None, :])[ok], (q_start[:, None] + r[None, :])[ok])
    chunks = []
    rows_per_chunk = max(1, budget // max(1, nb * Hq * Lpad))
    for i0 in range(0, nmax, rows_per_chunk):
        r = torch.arange(i0, min(nmax, i0 + rows_per_chunk), device=device)
        q_ok = r[None, :] < qlens[:, None]
        src = torch.where(q_ok, q_start[:, None] + r[None, :], torch.zeros_like(q_ok, dtype=torch.long))
        pos = first_new[:, None] + r[None, :]  # [nb, nr]
        vis = mask_idx = inside = None
        if x.custom_mask is not None:
            off = x.mask_indptr[b0:b1][:, None, None] + r[None, :, None] * lens[:, None, None] + j[None, None, :]
            inside = q_ok[..., None] & key_ok[:, None, :]
            mask_idx = torch.where(inside, off, torch.zeros_like(off))
        else:
            vis = key_ok[:, None, :] & q_ok[..., None]
            if x.causal:
                vis = vis & (j[None, None, :] <= pos[..., None])
        if x.window >= 0:
            win = j[None, None, :] >= pos[..., None] - x.window
            vis = vis & win if vis is not None else None
            inside = inside & win if inside is not None else None
        sel = q_ok.flatten().nonzero().flatten()
        chunks.append(_Chunk(src, sel, src.flatten()[sel], vis, mask_idx, inside))
    return _Group(pages, key_ok, Lpad, chunks, new_at)


def _attend_group(x, g: _Group) -> None:
    dtype = x.q.dtype
    nb = g.pages.shape[0]
    Hq, Hkv = x.q.shape[1], x.k_cache.shape[2]
    G = Hq // Hkv
    K = _loaded(x.k_cache[g.pages].flatten(1, 2)[:, : g.Lpad], x.k_scale)  # float32 [nb, Lpad, Hkv, Dk]
    V = _loaded(x.v_cache[g.pages].flatten(1, 2)[:, : g.Lpad], x.v_scale)
    if g.new_at is not None:
        bi, pos, src = g.new_at
        K[bi, pos], V[bi, pos] = x.k_new[src].float(), x.v_new[src].float()
    K = torch.where(g.key_ok[..., None, None], K, 0.0).permute(0, 2, 1, 3)  # [nb, Hkv, Lpad, Dk]; NaN slots -> 0
    V = torch.where(g.key_ok[..., None, None], V, 0.0).permute(0, 2, 1, 3)
    for c in g.chunks:
        nr = c.src.shape[1]
        Q = x.q[c.src].float()  # [nb, nr, Hq, Dk]
        Q = Q.view(nb, nr, Hkv, G, -1).permute(0, 2, 3, 1, 4).reshape(nb, Hkv, G * nr, -1)
        s = (torch.matmul(Q, K.transpose(-1, -2)) * x.sm_scale).view(nb, Hkv, G, nr, g.Lpad)
        if x.soft_cap > 0:
            s = torch.tanh(s / x.soft_cap) * x.soft_cap
        vis = c.vis if c.vis is not None else x.custom_mask[c.mask_idx] & c.inside
        s = s.masked_fill(~vis[:, None, None], -math.inf)
        m = s.amax(-1)  # [nb, Hkv, G, nr]
        if x.sinks is not None:
            sink = x.sinks.float().view(1, Hkv, G, 1)
            m = torch.maximum(m, sink)
        m = torch.nan_to_num(m, neginf=0.0)
        p = torch.exp(s - m[..., None])
        l = p.sum(-1)
        if x.sinks is not None:
            l = l + torch.exp(sink - m)
        o = torch.matmul(p.to(dtype).float().view(nb, Hkv, G * nr, g.Lpad), V).view(nb, Hkv, G, nr, -1)
        o = o / torch.where(l > 0, l, torch.ones_like(l))[..., None]
        lse = torch.where(l > 0, m + torch.log(l), torch.full_like(l, -math.inf))
        o = o.permute(0, 3, 1, 2, 4).reshape(nb, nr, Hq, -1)  # back to packed [T, Hq, ...] rows
        lse = lse.permute(0, 3, 1, 2).reshape(nb, nr, Hq)
        x.o[c.dst] = o.flatten(0, 1)[c.sel].to(x.o.dtype)
        x.lse[c.dst] = lse.flatten(0, 1)[c.sel]


def paged_attention(x) -> dict[str, torch.Tensor]:
    """Plan and run in one call (for wrappers that change the inputs per call, e.g. the mutants)."""
    return prepare_paged_attention(x)()
