"""A float64 model of SGLang's Triton extend kernels over an fp8 KV cache, written from what their
installed source (sglang 0.5.10.post1, `triton_ops/extend_attention.py`) computes, not from its code:

- the query is rounded to the cache's fp8 dtype, without a scale, before the score dot with the
  stored fp8 keys; the score is then multiplied by `sm_scale * k_scale`;
- per key block of `block_n` keys, the probabilities `exp(s - running max)` are rounded to the
  cache's fp8 dtype before the P.V dot with the stored fp8 values; the softmax sum takes them unrounded;
- `extend_attention_fwd` (two stages): the prefix as above, with `v_scale` on each block's P.V;
  then the new tokens from `k_extend`/`v_extend` in the query dtype (not from the cache, whatever
  `save` stored there), P rounded to that dtype;
- `extend_attention_fwd_unified`: every key (the new tokens' too, as `save` stored them) from the cache
  as above, `v_scale` once on the final `acc / deno`.

The fp8 and query-dtype roundings go through Triton's own cast (`triton_round`), so the model rounds as
the kernel does where it runs: the hardware's round-to-nearest-even on a GPU, the interpreter's cast
under TRITON_INTERPRET=1 (which, triton 3.6, drops the carry when the mantissa rounds up past its
width: 1.96 -> 1.0 in e4m3, not 2.0). Everything else is exact (float64).

Scope: per-tensor scales, causal or custom masks, no window, soft cap or sinks (ValueError otherwise).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnbench.ops.attention.inputs import quantize


@triton.jit
def _cast_kernel(src, dst, n, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = i < n
    tl.store(dst + i, tl.load(src + i, mask=keep).to(DTYPE).to(tl.float32), mask=keep)


_TL = {
    torch.float8_e4m3fn: tl.float8e4nv,
    torch.float8_e5m2: tl.float8e5,
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
}


def triton_round(t: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """`t` (in the dtype the kernel holds it in) cast to `dtype` by Triton on `device` (where the kernel
    runs); float64 values on the CPU."""
    src = t.contiguous().reshape(-1).to(device)
    out = torch.empty(src.shape, dtype=torch.float32, device=src.device)
    if src.numel():
        _cast_kernel[(triton.cdiv(src.numel(), 1024),)](src, out, src.numel(), _TL[dtype], 1024)
    return out.reshape(t.shape).double().cpu()


def _visible(x, b: int) -> torch.Tensor:
    """`[n, L]` bool: which of request b's keys (prefix, then new) each of its new tokens sees."""
    L, n = x.seq_lens_host[b], x.q_lens_host[b]
    if x.custom_mask is not None:
        lo = int(x.mask_indptr[b])
        return x.custom_mask[lo : lo + n * L].view(n, L).cpu()
    i, j = torch.arange(n)[:, None] + (L - n), torch.arange(L)[None, :]
    return j <= i if x.causal else torch.ones(n, L, dtype=torch.bool)


def _cache_rows(x, b: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stored K `[end - start, Hkv, Dk]`, V `[.., Hkv, Dv]` of request b's keys [start, end), as in the cache."""
    ps = x.page_size
    pages = x.kv_page_indices[int(x.kv_indptr[b]) : int(x.kv_indptr[b + 1])].long().cpu()
    pos = torch.arange(start, end)
    slots = pages[pos // ps] * ps + pos % ps
    k = x.k_cache.reshape(-1, *x.k_cache.shape[2:]).cpu()[slots]
    v = x.v_cache.reshape(-1, *x.v_cache.shape[2:]).cpu()[slots]
    return k, v


class _Online:
    """One query row's online softmax over key blocks, as the kernels keep it (max, sum, acc)."""

    def __init__(self, dv: int, device):
        self.device = device
        self.m, self.deno, self.acc = float("-inf"), 0.0, torch.zeros(dv, dtype=torch.float64)

    def block(self, s: torch.Tensor, v: torch.Tensor, p_dtype: torch.dtype, v_mul: float = 1.0) -> None:
        """Scores `s` [keys] (-inf: masked), values `v` [keys, Dv] float64; P rounded to `p_dtype`."""
        if s.numel() == 0:
            return
        m = max(self.m, float(s.max()) if torch.isfinite(s).any() else -1e20)
        p = torch.exp(s - m)
        keep = torch.exp(torch.tensor(self.m - m, dtype=torch.float64))
        self.deno = self.deno * keep + float(p.float().sum())
        self.acc = self.acc * keep + (triton_round(p.float(), p_dtype, self.device) @ v) * v_mul
        self.m = m


def sglang_fp8_extend(x, unified: bool, block_n: int) -> torch.Tensor:
    """`o` `[T, Hq, Dv]` float64 of SGLang's extend (`unified`: `extend_attention_fwd_unified`, else
    `extend_attention_fwd`) on the extend/tree_verify inputs `x` over an fp8 cache, as modelled above."""
    if x.window >= 0 or x.soft_cap > 0 or x.sinks is not None:
        raise ValueError("the model covers no window, soft cap or sinks")
    if unified and not x.save_kv:
        raise ValueError("the unified kernel reads the new tokens from the cache: the model needs new_kv save")
    if x.k_scale is None or x.k_scale.numel() != 1:
        raise ValueError("the model needs an fp8 cache with per-tensor scales")
    fp8, qdt = x.k_cache.dtype, x.q.dtype
    ks, vs = float(x.k_scale), float(x.v_scale)
    Hq, Hkv, Dv = x.q.shape[1], x.k_cache.shape[2], x.v_cache.shape[-1]
    dev = x.q.device
    q8 = triton_round(x.q, fp8, dev)  # q.to(k.dtype) before the dot with the cached keys
    o = torch.zeros(x.q.shape[0], Hq, Dv, dtype=torch.float64)
    for b in range(len(x.seq_lens_host)):
        L, n = x.seq_lens_host[b], x.q_lens_host[b]
        P, r0 = L - n, int(x.qo_indptr[b])
        vis = _visible(x, b)
        k_c, v_c = _cache_rows(x, b, 0, P)
        if unified:  # the new tokens as `save` stores them (torch's cast: the adapter saves them so)
            new = slice(r0, r0 + n)
            k_c = torch.cat([k_c, quantize(x.k_new[new], x.k_scale, fp8).cpu()])
            v_c = torch.cat([v_c, quantize(x.v_new[new], x.v_scale, fp8).cpu()])
        k_c, v_c = k_c.double(), v_c.double()
        if not unified:
            k_e, v_e = x.k_new[r0 : r0 + n].cpu().double(), x.v_new[r0 : r0 + n].cpu().double()
        for h in range(Hq):
            kh = h // (Hq // Hkv)
            for i in range(n):
                row = _Online(Dv, dev)
                cached = k_c.shape[0]
                for s0 in range(0, cached, block_n):
                    blk = slice(s0, min(s0 + block_n, cached))
                    s = (k_c[blk, kh] @ q8[r0 + i, h]) * (x.sm_scale * ks)
                    s = s.masked_fill(~vis[i, blk], float("-inf"))
                    row.block(s, v_c[blk, kh], fp8, 1.0 if unified else vs)
                if not unified:
                    qi = x.q[r0 + i, h].cpu().double()
                    for s0 in range(0, n, block_n):
                        blk = slice(s0, min(s0 + block_n, n))
                        s = (k_e[blk, kh] @ qi) * x.sm_scale
                        s = s.masked_fill(~vis[i, P + s0 : P + blk.stop], float("-inf"))
                        row.block(s, v_e[blk, kh], qdt)
                o[r0 + i, h] = row.acc / row.deno * (vs if unified else 1.0)
    return o
