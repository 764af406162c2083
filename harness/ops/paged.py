"""Realistic paged KV caches: shuffled non-repeating page tables, partial last pages, NaN poison.

Every slot that no request owns (the tail of a partial last page, spare pages) and every slot a kernel
is to write (new tokens of an extend with `save`) holds NaN, so a kernel that reads past a sequence
produces NaN and fails its check.

A sliding-window layer's own pool (`kv_pool: swa`, `swa_pool`): pages wholly before a request's window
have been freed and handed to other requests, so they hold other requests' keys and values: finite
(a kernel may load a tile that straddles the window start and mask the keys before it, as real
kernels do, since such pages hold another request's finite data in a server) and wrong for this
request, so a kernel that gives one key outside its window any weight fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedLayout:
    """Where each request's tokens live. Lengths are host-side; tensors are int32 on the device."""

    page_size: int
    num_pages: int
    seq_lens: list[int]
    kv_indptr: torch.Tensor  # [B+1] int32
    kv_page_indices: torch.Tensor  # [nnz] int32
    base: int = 0  # first page of the region the pages are drawn from (`pool_base`); pages before it: spare

    def slots(self, b: int, start: int, stop: int) -> torch.Tensor:
        """Token slots (page * page_size + offset, int64) of positions start..stop-1 of request b."""
        pages = self.kv_page_indices[int(self.kv_indptr[b]) : int(self.kv_indptr[b + 1])].long()
        pos = torch.arange(start, stop, device=pages.device)
        return pages[pos // self.page_size] * self.page_size + pos % self.page_size


def pool_pages(needed: int) -> int:
    """Pages in a pool that holds `needed` pages: ~12% spare (at least 2), never handed to a request."""
    return needed + max(2, needed // 8)


def pool_base(needed: int, pool: int | None) -> int:
    """First page of the region a pool of `pool` pages (None: the default, `pool_pages(needed)`) hands to
    requests that need `needed` pages: its last `pool_pages(needed)` pages, so a production-size pool
    puts every page a request uses past the offsets of a small one (past 2^31 elements where the pool
    is that large); the pages before the region are spare (NaN: a kernel that reads one fails)."""
    region = pool_pages(needed)
    if pool is not None and pool < region:
        raise ValueError(f"a pool of {pool} pages cannot hold {needed} pages and their spares ({region} pages)")
    return 0 if pool is None else pool - region


def make_layout(
    seq_lens: list[int], page_size: int, generator: torch.Generator, device, pool: int | None = None
) -> PagedLayout:
    """A page table with pages drawn at random, without repetition, from a pool with ~12% spare pages;
    `pool` (pages) makes the pool that large with the pages drawn from its end (`pool_base`)."""
    need = [-(-n // page_size) for n in seq_lens]
    total = sum(need)
    base = pool_base(total, pool)
    perm = torch.randperm(pool_pages(total), generator=generator, device="cpu")[:total] + base
    indptr = torch.tensor([0] + need, dtype=torch.int64).cumsum(0).to(torch.int32)
    num_pages = base + pool_pages(total)
    return PagedLayout(page_size, num_pages, list(seq_lens), indptr.to(device), perm.to(torch.int32).to(device), base)


def poisoned_cache(layout: PagedLayout, heads: int, dim: int, dtype, device) -> torch.Tensor:
    """An all-NaN cache `[num_pages, page_size, heads, dim]`."""
    return torch.full((layout.num_pages, layout.page_size, heads, dim), float("nan"), dtype=dtype, device=device)


def fill(cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """Write `values [n, H, D]` into token `slots [n]` of `cache`."""
    cache.view(-1, *cache.shape[2:])[slots] = values.to(cache.dtype)


def swa_pool(layout: PagedLayout, generator: torch.Generator) -> tuple[PagedLayout, torch.Tensor]:
    """The sliding-window layer's pool for the requests of `layout` (whose page ids are the full pool's).

    A request's in-window pages (from `window_start_page` on) hold its keys in the SWA pool; the pages
    before them were freed and now belong to other requests. The SWA pool has as many pages as the full
    one, and `full_to_swa [num_pages]` int32 (SGLang's `full_to_swa_index_mapping`, by page: with page
    size 1 it is SGLang's token mapping) is a random bijection, so a kernel that indexes the SWA pool
    with the full pool's page ids reads another request's page rather than out of bounds.

    Returns (the layout over the SWA pool: `kv_page_indices = full_to_swa[full page ids]`, the same
    `kv_indptr`; freed positions point to pages that now belong to other requests, which the caller
    fills with their data), `full_to_swa`.
    """
    base = layout.base  # a production-size pool: the bijection permutes its end region, the rest maps to itself
    tail = torch.randperm(layout.num_pages - base, generator=generator, device="cpu") + base
    full_to_swa = torch.cat([torch.arange(base), tail]).to(torch.int32)
    table = full_to_swa[layout.kv_page_indices.cpu().long()].to(layout.kv_page_indices.device)
    mapping = full_to_swa.to(layout.kv_page_indices.device)
    swa = PagedLayout(layout.page_size, layout.num_pages, layout.seq_lens, layout.kv_indptr, table, base)
    return swa, mapping


def window_start_page(first_query: int, window: int, page_size: int) -> int:
    """First position of the page that holds `first_query - window` (0 before it): where a request's
    in-window pages start in the SWA pool (SGLang frees whole pages only once every slot is out of window)."""
    return max(0, first_query - window) // page_size * page_size


def _draft_split(prefix_len: int, step: int, page_size: int) -> tuple[int, int]:
    """(pages a request's candidates share, pages each candidate owns) in `draft_layout`."""
    return prefix_len // page_size, -(-(prefix_len % page_size + step) // page_size)


def draft_pages(prefix_lens: list[int], topk: int, step: int, page_size: int) -> tuple[int, int]:
    """(distinct pages, page-table entries) of `draft_layout` for these prefixes."""
    splits = [_draft_split(p, step, page_size) for p in prefix_lens]
    return sum(s + topk * o for s, o in splits), topk * sum(s + o for s, o in splits)


def draft_layout(
    prefix_lens: list[int], topk: int, step: int, page_size: int, generator: torch.Generator, device
) -> PagedLayout:
    """The page tables of an EAGLE draft decode: `topk` candidate rows per request (row b * topk + c).

    Every candidate of request b sees its prefix (`prefix_lens[b]` keys) and then its own `step` draft
    tokens, `prefix_lens[b] + step` keys in all. The prefix's full pages are the request's: every
    candidate's table names the same physical pages. The prefix's last partial page (prefix % page_size
    keys) is copied per candidate, because the candidates append different tokens after it (SGLang's
    `assign_draft_cache_locs` with page_size > 1); the copy and the candidate's draft tokens fill pages
    of its own. With page size 1 the whole prefix is shared and only the draft tokens are per candidate.
    Pages are drawn at random from a pool with ~12% spare pages, as in `make_layout`; the request's
    original partial page (the source of the copies, which no row reads) is not allocated.
    """
    distinct, _ = draft_pages(prefix_lens, topk, step, page_size)
    num_pages = pool_pages(distinct)
    perm = torch.randperm(num_pages, generator=generator, device="cpu")[:distinct].to(torch.int32)
    tables, lens, at = [], [], 0
    for p in prefix_lens:
        n_shared, own = _draft_split(p, step, page_size)
        shared = perm[at : at + n_shared]
        at += n_shared
        for _ in range(topk):
            tables.append(torch.cat([shared, perm[at : at + own]]))
            at += own
            lens.append(p + step)
    indptr = torch.tensor([0] + [t.numel() for t in tables], dtype=torch.int64).cumsum(0).to(torch.int32)
    return PagedLayout(page_size, num_pages, lens, indptr.to(device), torch.cat(tables).to(device))
