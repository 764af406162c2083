"""The inputs of `decode` and `extend` (`AttentionInputs`) and how they are drawn from a case: per-request
lengths, the paged pool and its layout, fp8 quantisation, custom masks."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import torch

from attnbench.buffers import alloc_output, output_bytes
from attnbench.ops import rng
from attnbench.ops.attention.params import AttentionParams
from attnbench.ops.base import (
    tensor_bytes,
)
from attnbench.ops.distributions import Sampler
from attnbench.ops.paged import (
    draft_layout,
    draft_pages,
    fill,
    make_layout,
    poisoned_cache,
    pool_pages,
    swa_pool,
    window_start_page,
)
from attnbench.references import spec as spec_ref


@dataclass
class AttentionInputs:
    """Inputs of decode and extend (decode: one query per request, T = B, no new K/V).

    Tensors are on the case device; `*_host` are the same lengths as Python lists (no device sync).
    The fields come in groups (the comments below); they stay flat because every backend adapter
    (kernels/) and the checks (perturbations and `held` name fields) read them by these names.
    """

    # queries, the paged cache and its CSR page table
    q: torch.Tensor  # [T, Hq, Dk] case dtype
    k_cache: torch.Tensor  # [P, page_size, Hkv, Dk]
    v_cache: torch.Tensor  # [P, page_size, Hkv, Dv]  (MLA: k_cache[..., :512], a view)
    kv_indptr: torch.Tensor  # [B+1] int32, pages of request b: kv_page_indices[kv_indptr[b]:kv_indptr[b+1]]
    kv_page_indices: torch.Tensor  # [nnz] int32
    seq_lens: torch.Tensor  # [B] int32, keys per request (prefix + new)
    qo_indptr: torch.Tensor  # [B+1] int32, queries of request b: q[qo_indptr[b]:qo_indptr[b+1]]
    # outputs
    o: torch.Tensor  # [T, Hq, Dv] case dtype, output (NaN-filled, canary-padded)
    lse: torch.Tensor  # [T, Hq] fp32, output, natural log
    # score semantics
    sm_scale: float
    causal: bool = True
    window: int = -1
    soft_cap: float = 0.0
    sinks: torch.Tensor | None = None  # [Hq] fp32 logits
    # fp8 caches
    k_scale: torch.Tensor | None = None  # fp8 caches: [1] or [Hkv] fp32, real value = stored * scale
    v_scale: torch.Tensor | None = None  # (powers of two, so quantising k_new is exact to define)
    # extend: the new tokens' keys and values, saved into the cache or not
    k_new: torch.Tensor | None = None  # [T, Hkv, Dk] extend: keys of the new tokens (case dtype)
    v_new: torch.Tensor | None = None  # [T, Hkv, Dv]            (MLA: k_new[..., :512])
    save_kv: bool = False  # write k_new/v_new into slot_mapping before attending
    slot_mapping: torch.Tensor | None = None  # [T] int64 cache slot (page * page_size + offset) per new token
    # extend: a custom mask
    custom_mask: torch.Tensor | None = None  # bool, [q_len_b, seq_len_b] per request, flattened; True = visible
    mask_indptr: torch.Tensor | None = None  # [B+1] int64 offsets into custom_mask
    # the lengths on the host
    seq_lens_host: tuple[int, ...] = ()
    q_lens_host: tuple[int, ...] = ()
    # kv_pool swa: k_cache/v_cache are the sliding-window layer's own pool and kv_page_indices its page
    # table (= full_to_swa[full_page_indices]); pages before each request's window belong to other
    # requests (their data). A backend may take kv_page_indices, or translate the full table itself.
    full_page_indices: torch.Tensor | None = None  # [nnz] int32, the full pool's pages (same kv_indptr)
    full_to_swa: torch.Tensor | None = None  # [P] int32, full pool page -> SWA pool page
    # decode draft_topk > 1: rows b * draft_topk + c are the candidates of request b; their tables name
    # the same prefix pages (kernels may exploit that; the reference reads each row's table as is)
    draft_topk: int = 1
    # pool_pages: the first page of the region requests' pages are drawn from (0 for a default pool); the
    # pages before it are spare. The reference reads only the region, so a pool past 2^31 elements costs
    # no float64 copy (`written_rows`)
    pool_base: int = 0

    @property
    def page_size(self) -> int:
        return self.k_cache.shape[1]


def _generators(seed: int, device: torch.device) -> tuple[torch.Generator, torch.Generator]:
    """(generator for tables and lengths, generator for data), both on the CPU, from the case seed."""
    host = torch.Generator().manual_seed(seed)
    data = torch.Generator().manual_seed(seed + 7919)  # CPU: the same data on any device (ops/rng.py)
    return host, data


def _randn(shape, dtype, gen: torch.Generator, device) -> torch.Tensor:
    return rng.randn(shape, gen).to(device=device, dtype=dtype)


def _lengths(n: int, most: int, kind: str, host: torch.Generator, least: int = 1) -> list[int]:
    """Per-request lengths whose maximum is `most`, so ids name the longest.

    `mixed` (random in least..most) and `skewed` (one long, the rest most/16) put the longest request
    at a seeded position, not always first: a kernel that derives every request's offsets from
    request 0 must not meet a batch where that happens to be right. `serving` keeps its order (one
    long chunk, then decodes and short chunks in turn, as a mixed prefill/decode batch is laid out).
    """
    if kind == "equal" or n == 1:
        return [most] * n
    if kind == "serving":
        return [most] + [max(least, most // 8) if i % 3 == 2 else max(least, 1) for i in range(1, n)]
    if kind == "skewed":
        rest = [max(least, most // 16)] * (n - 1)
    else:
        rest = torch.randint(least, most + 1, (n - 1,), generator=host).tolist()
    at = int(torch.randint(0, n, (1,), generator=host))
    return rest[:at] + [most] + rest[at:]


def _shares_k(x: AttentionInputs) -> bool:
    """MLA: the values are the keys' latent part (v_cache is a view of k_cache)."""
    return x.v_cache.untyped_storage().data_ptr() == x.k_cache.untyped_storage().data_ptr()


def _pool_region(x: AttentionInputs) -> AttentionInputs:
    """`x` over the pool's pages from `pool_base` on (views; page ids and slots relative to them): what
    the reference reads, so a pool past 2^31 elements is never copied or converted whole."""
    base = x.pool_base
    if not base:
        return x
    k = x.k_cache[base:]
    v = k[..., : x.v_cache.shape[-1]] if _shares_k(x) else x.v_cache[base:]
    slots = None if x.slot_mapping is None else x.slot_mapping - base * x.page_size
    return dataclasses.replace(
        x, k_cache=k, v_cache=v, kv_page_indices=x.kv_page_indices - base, slot_mapping=slots, pool_base=0
    )


FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def _fp8_scale(tensors: list[torch.Tensor], fp8: torch.dtype, per: str, spread: int = 0) -> torch.Tensor:
    """Power-of-two scales (so x / scale is exact) putting each tensor's (or kv head's) amax within fp8 range.

    Returns `[1]` (per tensor) or `[Hkv]` (per head) float32; real value = stored * scale. The scales
    are made to differ on purpose (a larger scale only costs precision): head h's is multiplied by
    2^((h + spread) % 3), and `spread` differs between K and V, so a kernel that swaps k_scale and
    v_scale, or collapses per-head scales to one, gets different numbers.
    """
    every = torch.cat(tensors).abs()  # [tokens, H, D]
    amax = (every.amax(dim=(0, 2)) if per == "head" else every.amax().reshape(1)).clamp_min(1e-30)
    bump = torch.exp2((torch.arange(amax.numel()) + spread) % 3)
    return (torch.exp2(torch.ceil(torch.log2(amax / torch.finfo(fp8).max))) * bump).float()


def quantize(x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """`[..., H, D]` values -> stored cache entries: x / scale rounded to the fp8 dtype (or cast, without a scale)."""
    if scale is None:
        return x.to(dtype)
    return (x.float() / scale.view(-1, 1)).to(dtype)


def dequantize(stored: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Stored fp8 cache entries `[..., H, D]` -> their float32 values (exact: the scales are powers of two)."""
    return stored.float() * scale.view(-1, 1)


def _custom_mask(kv_lens, q_lens, host: torch.Generator, device, empty_rows: bool = False):
    """Random visibility (p = 1/2) with each query's own key visible, flattened per request.

    With `empty_rows`, each request's first query sees nothing (its output is 0, its LSE -inf).
    """
    blocks = []
    for L, n in zip(kv_lens, q_lens):
        block = torch.rand(n, L, generator=host) < 0.5
        block[torch.arange(n), torch.arange(L - n, L)] = True
        if empty_rows:
            block[0] = False
        blocks.append(block.flatten())
    sizes = [n * L for L, n in zip(kv_lens, q_lens)]
    indptr = torch.tensor([0] + sizes, dtype=torch.int64).cumsum(0)
    return torch.cat(blocks).to(device), indptr.to(device)


def _tree_mask(parents: list[list[int] | None], kv_lens, q_lens, device):
    """The custom mask of a batch of tree requests and causal ones (`ExtendParams.trees`): a tree request's
    tokens see its whole prefix, then its root, their ancestors and themselves; a causal request's (null)
    see its prefix and the new tokens up to their own, i.e. the chain of its new tokens."""
    masks = [
        torch.ones(n, n, dtype=torch.bool).tril() if par is None else spec_ref.tree_mask_from_parents(par)
        for par, n in zip(parents, q_lens, strict=True)
    ]
    mask, indptr = spec_ref.tree_custom_mask(masks, [L - n for L, n in zip(kv_lens, q_lens)])
    return mask.to(device), indptr.to(device)


def build_paged_inputs(
    p: AttentionParams,
    dtype,
    seed,
    device,
    kv_lens,
    q_lens,
    new_kv: str,
    draft: tuple[int, int] | None = None,
) -> AttentionInputs:
    """`draft` (decode only): (topk, step): kv_lens/q_lens are per candidate row, `topk` rows per request."""
    host, gen = _generators(seed, device)
    draw = Sampler(p.distribution, gen, device, dtype)
    T = sum(q_lens)
    Hkv, Dk, Dv = p.heads_kv, p.head_dim, p.dv
    if draft:
        topk, step = draft
        prefix = [L - step for L in kv_lens[::topk]]
        layout = draft_layout(prefix, topk, step, p.page_size, host, device)
        sizes = [P + topk * step for P in prefix]  # per request: its prefix, then every candidate's own tokens
    else:
        layout = make_layout(kv_lens, p.page_size, host, device, p.pool_pages)
        sizes = kv_lens
    swa = getattr(p, "kv_pool", "full") == "swa"
    full_pages = full_to_swa = None
    if swa:
        full_pages = layout.kv_page_indices
        layout, full_to_swa = swa_pool(layout, host)
    # every request's keys/values in float32, new tokens included, shaped by the distribution
    keys = [draw.structure_keys(k) for k in draw.draw_many("k", [(L, Hkv, Dk) for L in sizes])]
    values = [k[..., :Dv] for k in keys] if p.mla else draw.draw_many("v", [(L, Hkv, Dv) for L in sizes])
    cache_dtype = FP8.get(p.kv_dtype, dtype)
    k_scale = v_scale = None
    if p.kv_dtype != "auto":
        k_scale = _fp8_scale(keys, cache_dtype, p.kv_scale)
        v_scale = k_scale if p.mla else _fp8_scale(values, cache_dtype, p.kv_scale, spread=1)
    k_cache = poisoned_cache(layout, Hkv, Dk, cache_dtype, device)
    v_cache = k_cache[..., :Dv] if p.mla else poisoned_cache(layout, Hkv, Dv, cache_dtype, device)
    new_slots = []
    if swa:  # every request's keys and values in one sequence: freed pages take other requests' data
        starts = [0, *itertools.accumulate(kv_lens)]
        every_k, every_v = torch.cat(keys), (None if p.mla else torch.cat(values))
    if draft:
        for b, P in enumerate(prefix):
            for c in range(topk):
                # candidate 0 writes the shared full pages (once); every candidate writes its own copy of
                # the partial last prefix page, then its own draft tokens
                r, start = b * topk + c, (0 if c == 0 else P // p.page_size * p.page_size)
                own = slice(P + c * step, P + (c + 1) * step)
                slots = layout.slots(r, start, P + step)
                fill(k_cache, slots, quantize(torch.cat([keys[b][start:P], keys[b][own]]), k_scale, cache_dtype))
                if not p.mla:
                    row_v = torch.cat([values[b][start:P], values[b][own]])
                    fill(v_cache, slots, quantize(row_v, v_scale, cache_dtype))
    else:
        for b, (L, n) in enumerate(zip(kv_lens, q_lens)):
            cached = L - n if new_kv != "shared" else L
            kept = min(cached, window_start_page(L - n, p.window, p.page_size)) if swa else 0
            slots = layout.slots(b, kept, cached)
            fill(k_cache, slots, quantize(keys[b][kept:cached], k_scale, cache_dtype))
            if not p.mla:
                fill(v_cache, slots, quantize(values[b][kept:cached], v_scale, cache_dtype))
            if kept:  # freed pages now hold other requests' keys: finite, and wrong for this one
                other = (torch.arange(kept) + starts[b + 1]) % starts[-1]
                freed = layout.slots(b, 0, kept)
                fill(k_cache, freed, quantize(every_k[other], k_scale, cache_dtype))
                if not p.mla:
                    fill(v_cache, freed, quantize(every_v[other], v_scale, cache_dtype))
            new_slots.append(layout.slots(b, L - n, L))
    k_new = v_new = slot_mapping = None
    if new_kv in ("save", "attend"):
        k_new = torch.cat([k[L - n :] for k, L, n in zip(keys, kv_lens, q_lens)]).to(dtype)
        v_new = (
            k_new[..., :Dv] if p.mla else torch.cat([v[L - n :] for v, L, n in zip(values, kv_lens, q_lens)]).to(dtype)
        )
        if new_kv == "save":
            slot_mapping = torch.cat(new_slots)
    q = draw.draw("q", (T, p.heads_q, Dk)).to(dtype)
    sinks = _randn((p.heads_q,), torch.float32, gen, device) * 2 if p.sinks else None
    qo = torch.tensor([0] + list(q_lens), dtype=torch.int64).cumsum(0).to(torch.int32)
    mask = mask_indptr = None
    if getattr(p, "trees", None) is not None:
        mask, mask_indptr = _tree_mask(p.tree_parents(), kv_lens, q_lens, device)
    elif getattr(p, "mask", "causal") == "custom":
        mask, mask_indptr = _custom_mask(kv_lens, q_lens, host, device, getattr(p, "empty_rows", False))
    return AttentionInputs(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        kv_indptr=layout.kv_indptr,
        kv_page_indices=layout.kv_page_indices,
        seq_lens=torch.tensor(kv_lens, dtype=torch.int32, device=device),
        qo_indptr=qo.to(device),
        o=alloc_output((T, p.heads_q, Dv), dtype, device),
        lse=alloc_output((T, p.heads_q), torch.float32, device),
        sm_scale=p.scale,
        causal=getattr(p, "mask", "causal") != "bidirectional",
        window=p.window,
        soft_cap=p.soft_cap,
        sinks=sinks,
        k_scale=k_scale,
        v_scale=v_scale,
        k_new=k_new,
        v_new=v_new,
        save_kv=new_kv == "save",
        slot_mapping=slot_mapping,
        custom_mask=mask,
        mask_indptr=mask_indptr,
        seq_lens_host=tuple(kv_lens),
        q_lens_host=tuple(q_lens),
        full_page_indices=full_pages,
        full_to_swa=full_to_swa,
        draft_topk=draft[0] if draft else 1,
        pool_base=layout.base,
    )


def paged_input_bytes(p: AttentionParams, dtype, kv_lens, q_lens, new_kv: str, mask: bool) -> int:
    """`input_bytes` of `build_paged_inputs` with these lengths (`mask`: a custom mask over every request)."""
    B, T, Hq, Hkv, Dk, Dv = len(kv_lens), sum(q_lens), p.heads_q, p.heads_kv, p.head_dim, p.dv
    need = sum(-(-n // p.page_size) for n in kv_lens)  # page-table entries
    distinct = need
    if (topk := getattr(p, "draft_topk", 1)) > 1:  # candidates share their request's full prefix pages
        distinct, _ = draft_pages([L - p.draft_step for L in kv_lens[::topk]], topk, p.draft_step, p.page_size)
    pages = pool_pages(distinct) if p.pool_pages is None else p.pool_pages
    slots = pages * p.page_size * Hkv
    cache = FP8.get(p.kv_dtype, dtype)
    total = tensor_bytes((slots, Dk), cache) + (0 if p.mla else tensor_bytes((slots, Dv), cache))
    total += tensor_bytes((T, Hq, Dk), dtype) + output_bytes((T, Hq, Dv), dtype) + output_bytes((T, Hq), torch.float32)
    total += 4 * (need + 3 * B + 2)  # page indices, kv_indptr, seq_lens, qo_indptr (int32)
    if new_kv in ("save", "attend"):
        total += tensor_bytes((T, Hkv, Dk), dtype) + (0 if p.mla else tensor_bytes((T, Hkv, Dv), dtype))
        total += 8 * T if new_kv == "save" else 0  # slot_mapping
    if p.kv_dtype != "auto":
        total += 4 * (Hkv if p.kv_scale == "head" else 1) * (1 if p.mla else 2)
    if p.sinks:
        total += 4 * Hq
    if mask:
        total += sum(n * L for n, L in zip(q_lens, kv_lens)) + 8 * (B + 1)
    if getattr(p, "kv_pool", "full") == "swa":
        total += 4 * (need + pages)  # full_page_indices, full_to_swa (int32)
    return total
