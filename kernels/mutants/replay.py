"""A decode that is right eagerly and wrong on CUDA-graph replay: the replay check's mutant.

`graph_decode(x, keys)` is a paged decode in torch that a CUDA graph can capture: every request visits
`keys` key positions (a host number, frozen into the graph with the grid it sizes), reads its pages,
lengths and window from the device tensors, and masks the positions past its length. It is right for
any batch whose longest request has at most `keys` keys.

- `GraphSafeDecode` visits the page table's capacity (`len(kv_page_indices) * page_size`): any batch
  of the same shapes fits, so it follows a replay (the check's control in tests).
- `BakedLengthDecode` (the mutant) visits the longest length of the batch it was prepared on, taken
  from the host lengths in `prepare`: what a kernel does that sizes its grid, split count or loop from
  `max(seq_lens)` once. Eagerly, and under every other check (the stale check holds lengths), it is
  right; replayed on a batch whose longest request is longer, it misses that request's last keys.

Both declare themselves graph-safe (the mutant wrongly, as the kernels it stands for do).
"""

from __future__ import annotations

import math

import torch

from attnbench.backend import Backend, implements


def graph_decode(x, keys: int) -> dict[str, torch.Tensor]:
    """Decode of `x` (one query per request) over `keys` key positions per request, no host sync."""
    B, Hq, Dk = x.q.shape
    _, page, Hkv, _ = x.k_cache.shape
    Dv = x.v_cache.shape[-1]
    j = torch.arange(keys, device=x.q.device)
    last = x.kv_page_indices.shape[0] - 1
    at = (x.kv_indptr[:-1, None].long() + j // page).clamp(max=last)
    slot = x.kv_page_indices[at].long() * page + j % page  # [B, keys]
    length = x.seq_lens[:, None].long()
    seen = j < length
    if x.window >= 0:
        seen = seen & (j >= length - 1 - x.window)
    k = x.k_cache.flatten(0, 1)[slot].float()  # [B, keys, Hkv, Dk]
    v = x.v_cache.flatten(0, 1)[slot].float()
    if x.k_scale is not None:
        k = k * x.k_scale.float().view(1, 1, -1, 1)
        v = v * x.v_scale.float().view(1, 1, -1, 1)
    mask = seen[:, :, None, None]
    k, v = torch.where(mask, k, 0.0), torch.where(mask, v, 0.0)  # slots past a length may hold NaN
    q = x.q.float().view(B, Hkv, Hq // Hkv, Dk)
    s = torch.einsum("bhgd,bnhd->bhgn", q, k) * x.sm_scale
    if x.soft_cap > 0:
        s = x.soft_cap * torch.tanh(s / x.soft_cap)
    s = s.masked_fill(~seen[:, None, None, :], -math.inf)
    lse = torch.logsumexp(s, -1)  # [B, Hkv, G]
    if x.sinks is not None:
        lse = torch.logaddexp(lse, x.sinks.float().view(Hkv, -1))
    o = torch.einsum("bhgn,bnhd->bhgd", torch.exp(s - lse[..., None]), v)
    x.o.copy_(o.reshape(B, Hq, Dv))
    x.lse.copy_(lse.reshape(B, Hq))
    return {"o": x.o, "lse": x.lse}


GATHER_MAX_BYTES = 2**30  # the K and V `graph_decode` gathers (float32): a test backend, for small cases


def _capacity_keys(p) -> int:
    """At most the keys of the page table of a decode case (every row's pages at `kv_len`)."""
    return p.batch * p.draft_topk * -(-p.kv_len // p.page_size) * p.page_size


def _gathered(p, keys: int) -> int:
    return p.batch * p.draft_topk * keys * p.heads_kv * (p.head_dim + p.dv) * 4


def _capacity_fits(backend, case) -> str | None:
    p = case.params
    n = _gathered(p, _capacity_keys(p))
    return f"would gather {n / 2**30:.1f} GiB of K/V (a test backend: at most 1 GiB)" if n > GATHER_MAX_BYTES else None


def _longest_fits(backend, case) -> str | None:
    p = case.params
    n = _gathered(p, p.kv_len)
    return f"would gather {n / 2**30:.1f} GiB of K/V (a test backend: at most 1 GiB)" if n > GATHER_MAX_BYTES else None


class GraphSafeDecode(Backend):
    """`graph_decode` over the page table's capacity: follows any batch of the same shapes."""

    name = "graph-safe-decode"

    @implements("decode", graph_safe=True, limits=_capacity_fits)
    def prepare_decode(self, case, x):
        keys = x.kv_page_indices.shape[0] * x.k_cache.shape[1]
        return lambda: graph_decode(x, keys)


class BakedLengthDecode(Backend):
    """`graph_decode` over the longest length of the batch seen at `prepare` (the mutant)."""

    name = "replay-baked-max-len"

    @implements("decode", graph_safe=True, limits=_longest_fits)
    def prepare_decode(self, case, x):
        keys = max(x.seq_lens_host)
        return lambda: graph_decode(x, keys)
