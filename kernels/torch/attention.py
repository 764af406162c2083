"""Paged attention (decode and extend) in plain PyTorch, vectorised over requests, heads and queries.

Inputs stay in the case dtype; scores and the value product accumulate in float32 (low-precision
values upcast exactly), probabilities are rounded to the case dtype before the value product, and the
output is rounded once. Requests are processed in groups padded to the group's longest sequence, and
queries in row chunks, so memory stays bounded for long prefills and large batches.
"""

from __future__ import annotations

import math

import torch


def _budget(device: torch.device) -> int:
    """Elements per float32 working tensor (scores, gathered keys)."""
    return 1 << (28 if device.type == "cuda" else 23)


def save_new_kv(x) -> None:
    """save_kv_cache: write the new tokens' K/V into their cache slots."""
    k_flat = x.k_cache.view(-1, *x.k_cache.shape[2:])
    k_flat.index_copy_(0, x.slot_mapping, x.k_new)
    if x.v_cache.untyped_storage().data_ptr() != x.k_cache.untyped_storage().data_ptr():  # MLA: V is K's latent
        x.v_cache.view(-1, *x.v_cache.shape[2:]).index_copy_(0, x.slot_mapping, x.v_new)


def paged_attention(x) -> dict[str, torch.Tensor]:
    """Attention of `x.q [T, Hq, Dk]` over each request's paged K/V; writes `x.o`, `x.lse`."""
    if x.save_kv:
        save_new_kv(x)
    device = x.q.device
    lens, qlens = x.seq_lens_host, x.q_lens_host
    Hkv, Dk = x.k_cache.shape[2], x.q.shape[2]
    budget = _budget(device)
    qo = [0]
    for n in qlens:
        qo.append(qo[-1] + n)
    b0 = 0
    while b0 < len(lens):
        # grow the group while its padded keys fit the budget
        b1, lmax = b0 + 1, lens[b0]
        while b1 < len(lens) and (b1 + 1 - b0) * max(lmax, lens[b1]) * Hkv * Dk <= budget:
            lmax = max(lmax, lens[b1])
            b1 += 1
        _group(x, b0, b1, qo, budget)
        b0 = b1
    return {"o": x.o, "lse": x.lse}


def _group(x, b0: int, b1: int, qo: list[int], budget: int) -> None:
    device, dtype = x.q.device, x.q.dtype
    lens = torch.tensor(x.seq_lens_host[b0:b1], device=device)
    qlens = torch.tensor(x.q_lens_host[b0:b1], device=device)
    nb, Lpad, nmax = b1 - b0, int(lens.max()), int(qlens.max())
    Hq, Hkv = x.q.shape[1], x.k_cache.shape[2]
    G, ps = Hq // Hkv, x.k_cache.shape[1]

    # keys/values padded to [nb, Lpad, Hkv, D]; padding positions are zeroed (the cache holds NaN there)
    npages = -(-Lpad // ps)
    starts = x.kv_indptr[b0:b1].long()
    ends = x.kv_indptr[b0 + 1 : b1 + 1].long()
    idx = starts[:, None] + torch.arange(npages, device=device)[None, :]
    pages = x.kv_page_indices[torch.where(idx < ends[:, None], idx, torch.zeros_like(idx))].long()
    K = x.k_cache[pages].flatten(1, 2)[:, :Lpad]
    V = x.v_cache[pages].flatten(1, 2)[:, :Lpad]
    j = torch.arange(Lpad, device=device)
    key_ok = j[None, :] < lens[:, None]  # [nb, Lpad]
    first_new = lens - qlens  # absolute position of each request's first query
    if x.k_new is not None and not x.save_kv:  # attend: new tokens come from k_new/v_new, not the cache
        K, V = K.clone(), V.clone()
        r = torch.arange(nmax, device=device)
        ok = r[None, :] < qlens[:, None]
        bi = torch.arange(nb, device=device)[:, None].expand(nb, nmax)[ok]
        pos = (first_new[:, None] + r[None, :])[ok]
        src = (torch.tensor(qo[b0:b1], device=device)[:, None] + r[None, :])[ok]
        K[bi, pos], V[bi, pos] = x.k_new[src], x.v_new[src]
    zero = torch.zeros((), dtype=dtype, device=device)
    K = torch.where(key_ok[..., None, None], K, zero).float().permute(0, 2, 1, 3)  # [nb, Hkv, Lpad, Dk]
    V = torch.where(key_ok[..., None, None], V, zero).float().permute(0, 2, 1, 3)

    mask_flat = x.custom_mask
    rows_per_chunk = max(1, budget // max(1, nb * Hq * Lpad))
    for i0 in range(0, nmax, rows_per_chunk):
        i1 = min(nmax, i0 + rows_per_chunk)
        r = torch.arange(i0, i1, device=device)
        q_ok = r[None, :] < qlens[:, None]  # [nb, nr]
        src = torch.tensor(qo[b0:b1], device=device)[:, None] + r[None, :]
        src = torch.where(q_ok, src, torch.zeros_like(src))
        Q = x.q[src].float()  # [nb, nr, Hq, Dk]
        nr = i1 - i0
        Q = Q.view(nb, nr, Hkv, G, -1).permute(0, 2, 3, 1, 4).reshape(nb, Hkv, G * nr, -1)
        s = torch.matmul(Q, K.transpose(-1, -2)) * x.sm_scale  # [nb, Hkv, G*nr, Lpad]
        s = s.view(nb, Hkv, G, nr, Lpad)
        if x.soft_cap > 0:
            s = torch.tanh(s / x.soft_cap) * x.soft_cap
        pos = first_new[:, None] + r[None, :]  # [nb, nr]
        if mask_flat is not None:
            off = x.mask_indptr[b0:b1][:, None, None] + r[None, :, None] * lens[:, None, None] + j[None, None, :]
            inside = q_ok[..., None] & key_ok[:, None, :]
            vis = mask_flat[torch.where(inside, off, torch.zeros_like(off))] & inside
        else:
            vis = key_ok[:, None, :].expand(nb, nr, Lpad).clone()
            if x.causal:
                vis &= j[None, None, :] <= pos[..., None]
        if x.window >= 0:
            vis &= j[None, None, :] >= pos[..., None] - x.window
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
        o = torch.matmul(p.to(dtype).float().view(nb, Hkv, G * nr, Lpad), V).view(nb, Hkv, G, nr, -1)
        o = o / torch.where(l > 0, l, torch.ones_like(l))[..., None]
        lse = torch.where(l > 0, m + torch.log(l), torch.full_like(l, -math.inf))
        # back to packed [T, Hq, ...] rows
        o = o.permute(0, 3, 1, 2, 4).reshape(nb, nr, Hq, -1)
        lse = lse.permute(0, 3, 1, 2).reshape(nb, nr, Hq)
        dst = src[q_ok]
        x.o[dst] = o[q_ok].to(x.o.dtype)
        x.lse[dst] = lse[q_ok]
