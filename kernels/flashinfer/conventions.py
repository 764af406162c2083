"""Conversions between attnbench's canonical semantics and FlashInfer's (pure PyTorch, CPU-testable).

Each function names the convention it implements and the line of
`shared/notes/verified-conventions.md` (checked on an H200 against float64 math) it relies on, so a
FlashInfer result that fails its float64 check can be traced to one conversion.
"""

from __future__ import annotations

import math

import torch

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2


def window_left(window: int) -> int:
    """Canonical window W (a query at p sees keys [p - W, p]) -> FlashInfer `window_left`.

    The identity: FlashInfer's `window_left=W` also keeps W + 1 keys including the query's own.
    Verified: "FlashInfer single_decode_with_kv_cache(..., window_left=W) | query at position p sees
    keys [p-W, p]" (prefill composes the same way: "window composes as above"). No window: -1.
    """
    return window if window >= 0 else -1


def soft_cap(cap: float) -> float | None:
    """Canonical soft cap (`cap * tanh(s / cap)` on scaled scores; 0 = none) -> `logits_soft_cap`.

    Verified: "FlashInfer logits_soft_cap=cap | cap * tanh(sm_scale * q.k / cap) (scale applied
    before the cap)", i.e. the canonical order. None switches the soft-cap kernel variant off.
    """
    return cap if cap > 0 else None


def last_page_len(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    """Keys in each request's last page, in 1..page_size (int32), from `seq_lens [B]` (all >= 1).

    FlashInfer describes a paged request by its pages (CSR) plus this count; attnbench by its
    length. A length that fills its last page exactly gives page_size, not 0.
    """
    return ((seq_lens.to(torch.int64) - 1) % page_size + 1).to(torch.int32)


def lse_log2_to_ln_(lse: torch.Tensor) -> torch.Tensor:
    """In place: FlashInfer's base-2 LSE (log2 sum 2^x over log2e-scaled logits) -> natural log.

    Verified: "FlashInfer decode / single prefill return_lse=True | LSE is base 2: multiply by ln 2
    for natural log". -inf (an empty row) stays -inf.
    """
    return lse.mul_(LN2)


def lse_ln_to_log2(lse: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Canonical natural-log LSE -> the base-2 LSE that `flashinfer.merge_state` consumes, into `out`.

    merge_state's kernels take and return base-2 LSE (cascade.cuh: "Both s and s_other are
    logsumexp values with base 2"); -inf stays -inf.
    """
    return torch.mul(lse, LOG2E, out=out)


def mla_split(q: torch.Tensor, k_cache: torch.Tensor, latent: int = 512):
    """Zero-copy views for FlashInfer's MLA wrapper from the canonical absorbed-MLA tensors.

    Args:
        q: `[T, Hq, latent + rope]` -> `q_nope [T, Hq, latent]`, `q_pe [T, Hq, rope]`.
        k_cache: `[P, page_size, 1, latent + rope]` -> `ckv [P, page_size, latent]`,
            `kpe [P, page_size, rope]` (V is the latent, so there is no separate value cache).

    Returns:
        `((q_nope, q_pe), (ckv, kpe))`: strided views (last dim contiguous). FlashInfer's fa2/fa3
        MLA kernels read every row through its strides (batch_mla_run.cu takes stride(0)/stride(1)
        of each tensor), so no copy is made and none is timed.
    """
    if k_cache.shape[2] != 1:
        raise ValueError(f"absorbed MLA has one latent head per token, got k_cache {tuple(k_cache.shape)}")
    kv = k_cache[:, :, 0, :]
    return (q[..., :latent], q[..., latent:]), (kv[..., :latent], kv[..., latent:])


def prefix_page_table(
    kv_indptr: list[int], kv_page_indices: torch.Tensor, prefix_lens: list[int], page_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The page table of each request's cached prefix alone (its first pages), for a cascade.

    Args:
        kv_indptr: `[B+1]` host ints, pages of request b: `kv_page_indices[kv_indptr[b]:kv_indptr[b+1]]`.
        kv_page_indices: `[nnz]` int32 page ids (any device).
        prefix_lens: `[B]` host ints, cached tokens before the new ones; each >= 1.
        page_size: tokens per page.

    Returns:
        `(indptr [B+1] int32, indices [nnz'] int32, last_page_len [B] int32)` on `kv_page_indices`'
        device, covering positions `0 .. prefix_len - 1` of every request.
    """
    if any(p < 1 for p in prefix_lens):
        raise ValueError(f"every request needs a prefix of at least one token, got {prefix_lens}")
    keep = [-(-p // page_size) for p in prefix_lens]
    rows = [torch.arange(kv_indptr[b], kv_indptr[b] + n, dtype=torch.int64) for b, n in enumerate(keep)]
    idx = torch.cat(rows).to(kv_page_indices.device)
    indices = kv_page_indices[idx].to(torch.int32)
    indptr = torch.tensor([0] + keep, dtype=torch.int64).cumsum(0).to(torch.int32)
    last = torch.tensor([(p - 1) % page_size + 1 for p in prefix_lens], dtype=torch.int32)
    dev = kv_page_indices.device
    return indptr.to(dev), indices, last.to(dev)
