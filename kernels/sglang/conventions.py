"""Conversions from attnbench's canonical semantics to SGLang's (pure PyTorch, tested on the CPU).

SGLang's Triton attention kernels address the KV cache by token slot (page size 1: `req_to_token`
rows flattened into `kv_indptr` / `kv_indices`), take the sliding window as `sliding_window_size`
and hold GDN states as `[N, HV, V, K]` (kernels/native_states.py converts those). attnbench's caches
are paged `[P, page_size, Hkv, D]` with page tables, its window is `window_left` W.
Every function here is one such conversion; `prepare` calls them, never the timed closure.
"""

from __future__ import annotations

import math

import torch


def token_slots(
    kv_indptr: torch.Tensor, kv_page_indices: torch.Tensor, page_size: int, starts: list[int], ends: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level page table (SGLang's `kv_indptr` int32, `kv_indices` int64: the dtypes its server
    allocates, triton_backend.py) for key positions
    `[starts[b], ends[b])` of each request b.

    A paged cache `[P, page_size, Hkv, D]` viewed as `[P * page_size, Hkv, D]` (a view, no copy) holds
    position j of request b at slot `pages_b[j // page_size] * page_size + j % page_size`, where
    `pages_b = kv_page_indices[kv_indptr[b]:kv_indptr[b + 1]]`. That view with these indices is what
    SGLang's `req_to_token` describes with page size 1.
    """
    indptr, pages = kv_indptr.tolist(), kv_page_indices.cpu().to(torch.int64)
    rows = []
    for b, (s, e) in enumerate(zip(starts, ends)):
        if not 0 <= s <= e:
            raise ValueError(f"request {b}: key range [{s}, {e}) is not a range of positions")
        own = pages[indptr[b] : indptr[b + 1]]
        if e > own.numel() * page_size:
            raise ValueError(f"request {b}: {e} keys do not fit its {own.numel()} pages of {page_size}")
        pos = torch.arange(s, e, dtype=torch.int64)
        rows.append(own[pos // page_size] * page_size + pos % page_size)
    counts = torch.tensor([0] + [r.numel() for r in rows], dtype=torch.int64)
    flat = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64)
    # int64 slots as SGLang's server has them: SGLang's Triton kernels multiply a slot by the row stride
    # in the indices' dtype, which wraps past 2^31 elements for int32 (suites/large.yaml)
    return counts.cumsum(0).to(torch.int32).to(kv_indptr.device), flat.to(kv_indptr.device)


def token_view(cache: torch.Tensor) -> torch.Tensor:
    """A paged cache `[P, page_size, H, D]` as SGLang's token buffer `[P * page_size, H, D]` (a view:
    writes through it land in `cache`; MLA's `v_cache = k_cache[..., :512]` views too)."""
    P, ps = cache.shape[:2]
    if cache.stride(0) != ps * cache.stride(1):
        raise ValueError(f"cache strides {tuple(cache.stride())}: pages are not consecutive token rows")
    return cache.as_strided((P * ps, *cache.shape[2:]), (cache.stride(1), *cache.stride()[2:]))


def decode_key_range(seq_len: int, window: int) -> tuple[int, int]:
    """Keys a decode query at position `seq_len - 1` sees: `[seq_len - 1 - W, seq_len)` clipped at 0
    under the canonical window W (W + 1 keys including its own), else all of `[0, seq_len)`.

    SGLang's decode kernel has no window argument: its Triton backend builds a windowed token table
    (`update_sliding_window_buffer`) instead, which is what `token_slots` over this range is.
    """
    return (max(0, seq_len - 1 - window) if window >= 0 else 0, seq_len)


def extend_prefix_range(prefix_len: int, window: int) -> tuple[int, int]:
    """Cached prefix positions an extend's queries can see: `[prefix_len - W, prefix_len)` clipped at 0
    under the canonical window W (the first query, at position `prefix_len`, sees back to
    `prefix_len - W`; later ones see less), else the whole prefix `[0, prefix_len)`.

    SGLang's Triton backend hands a sliding-window layer's extend this windowed prefix table
    (`window_kv_indices`) with its start as `window_kv_offsets` (the custom mask keeps its full
    `[q_len, prefix + q_len]` rows; the kernel offsets its columns). The kernel's window test is
    relative (query index minus key index), so dropping the prefix before the start changes no score;
    in a sliding-window layer's own pool those positions are freed pages and must not be read.
    """
    return (max(0, prefix_len - window) if window >= 0 else 0, prefix_len)


def sliding_window_size(window: int) -> int:
    """Canonical window W -> `extend_attention_fwd(sliding_window_size=)`.

    SGLang keeps key j for the query at absolute position i when `i <= j + sliding_window_size`,
    i.e. keys `[i - W, i]` for `sliding_window_size = W`: the same W. Its "no window" is any value
    <= 0, so W = 0 (each query sees only itself) cannot be said: ValueError.
    """
    if window < 0:
        return -1
    if window == 0:
        raise ValueError("SGLang's extend reads sliding_window_size 0 as no window: window 0 cannot be expressed")
    return window


def num_kv_splits(
    seq_lens: list[int], heads_q: int, heads_kv: int, max_kv_splits: int, core_count: int, group: int = 1
) -> list[int]:
    """SGLang's decode split count per request (`TritonAttnBackend.get_num_kv_splits`, 0.5.10), as a
    pure function: its module imports `transformers`, so the rule is restated here and tested.

    With no core count (`core_count <= 0`, or SGLang's static mode) every request gets
    `max_kv_splits`. Otherwise two candidate chunk sizes: one from the length spread (lengths within
    25% of the longest count as equal; at most `max_kv_splits` chunks of the longest), one from
    filling the device (`core_count * max(log2(longest / 64), 1)` programs over the decode grid,
    `batch * group * heads_q` for MHA, `batch * group * ceil(heads_q / min(16, heads_q / heads_kv))`
    otherwise); a request gets `max(ceil(L / chunk1), ceil(L / chunk2))` splits.
    """
    if core_count <= 0:
        return [max_kv_splits] * len(seq_lens)

    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    longest, shortest = max(seq_lens), min(seq_lens)
    if longest * 8 < shortest * 10:
        shortest = longest
    chunk1 = cdiv(longest, min(cdiv(longest, shortest), max_kv_splits))
    programs = int(core_count * max(math.log2(longest / 64.0), 1.0))
    ratio = heads_q // heads_kv
    n = len(seq_lens)
    grid = n * group * heads_q if ratio == 1 else n * group * cdiv(heads_q, min(16, ratio))
    chunk2 = cdiv(longest, min(cdiv(programs, grid), max_kv_splits))
    return [max(cdiv(L, chunk1), cdiv(L, chunk2)) for L in seq_lens]


def eagle_links(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A draft tree's parents `[B, T]` (token 0 the root, -1; every other token's parent earlier) as
    SGLang's `retrieve_next_token` (each token's first child) and `retrieve_next_sibling` (the next
    token with the same parent), both `[B, T]` int32, -1 for none.

    SGLang's `causal_conv1d_update` rebuilds each token's parent from these two lists in token order
    (a first child gets its parent's index, a next sibling its sibling's parent), so first children
    and next siblings are the smallest later indices: exactly what the ordered parents say.
    """
    B, T = parents.shape
    idx = torch.arange(T, device=parents.device)
    none = torch.full((), T, device=parents.device)
    child = parents.long()[:, None, :] == idx[None, :, None]  # [B, i, j]: j is a child of i
    sibling = (parents[:, :, None] == parents[:, None, :]) & (idx[None, None, :] > idx[None, :, None])
    first = torch.where(child, idx, none).amin(-1)
    nxt = torch.where(sibling, idx, none).amin(-1)
    return (
        torch.where(first < T, first, -1).to(torch.int32),
        torch.where(nxt < T, nxt, -1).to(torch.int32),
    )
