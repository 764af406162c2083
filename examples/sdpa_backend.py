"""A complete attnbench plugin: paged decode through PyTorch's scaled_dot_product_attention.

Run it beside the built-in backends:

    attnbench sweep smoke --op decode --plugin examples/sdpa_backend.py

or install it as a package whose pyproject declares

    [project.entry-points."attnbench.backends"]
    sdpa = "sdpa_backend"

A plugin registers a subclass of `attnbench.Backend` under a name. `supports(case)` returns None or
the reason the case is skipped (it shows in the report's capability matrix). `prepare(case, x)` does
all the work that is not the kernel and returns the closure that attnbench times; the closure reads
the input tensors' current contents and writes the preallocated outputs `x.o` and `x.lse`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import attnbench


@attnbench.register_backend("sdpa")
class SdpaDecode(attnbench.Backend):
    description = "example plugin: decode via torch SDPA over gathered pages (no window, cap or sinks)"

    def supports(self, case):
        p = case.params
        if case.op_name != "decode":
            return f"sdpa example implements decode only, not {case.op_name}"
        if p.window >= 0 or p.soft_cap > 0 or p.sinks:
            return "sdpa example has no sliding window, soft cap or sinks"
        if p.kv_dtype != "auto":
            return "sdpa example reads the cache in the query dtype only (no fp8 KV)"
        return None

    def prepare_decode(self, case, x):
        # Host-side work (page gathering indices) happens here, once; the closure only gathers and attends.
        B, Hq = x.q.shape[0], x.q.shape[1]
        lens = x.seq_lens_host
        Lmax = max(lens)
        ps = x.page_size
        pages_per = -(-Lmax // ps)
        idx = torch.zeros(B, pages_per, dtype=torch.long)
        indptr = x.kv_indptr.tolist()
        for b in range(B):
            own = x.kv_page_indices[indptr[b] : indptr[b + 1]].long().cpu()
            idx[b, : len(own)] = own
        idx = idx.to(x.q.device)
        valid = torch.arange(pages_per * ps, device=x.q.device)[None] < torch.tensor(lens, device=x.q.device)[:, None]
        mask = valid[:, None, None, :]  # [B, 1, 1, L]: True = attend

        def run():
            k = x.k_cache[idx].flatten(1, 2).transpose(1, 2)  # [B, Hkv, L, D]
            v = x.v_cache[idx].flatten(1, 2).transpose(1, 2)
            k = torch.where(mask.transpose(-1, -2), k, 0)  # unused slots hold NaN: zero them
            v = torch.where(mask.transpose(-1, -2), v, 0)
            q = x.q[:, :, None, :]  # [B, Hq, 1, D]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=x.sm_scale, enable_gqa=True)
            x.o.copy_(o[:, :, 0])
            s = torch.einsum("bhd,bhld->bhl", x.q.float(), k.float().repeat_interleave(Hq // k.shape[1], 1))
            s = s * x.sm_scale
            x.lse.copy_(torch.logsumexp(s.masked_fill(~mask[:, :, 0], float("-inf")), dim=-1))
            return {"o": x.o, "lse": x.lse}

        return run
