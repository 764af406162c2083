"""Check the Gluon prefill kernel (kernels/triton/prefill_ws.py) on a Hopper GPU against float64.

Runs without an installed attnbench (torch and triton only). Ragged batches, causal and not, head dims
64 and 128, GQA and MHA, bf16 and fp16, with and without a cached prefix (pages of 1 to 256 slots, shuffled,
every slot outside the prefixes NaN); one line per case (max abs error of o and lse against float64,
and the bound: 4 bf16/fp16 ulps of the output's scale for o, 1e-4 for the LSE) and exit 1 if any is over.
Correctness only: speed is measured by `attnbench sweep`.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkout_packages  # noqa: E402, F401  (attnbench's kernel modules from this checkout, uninstalled)
import torch  # noqa: E402

from attnbench.kernels.triton import prefill_ws  # noqa: E402
from attnbench.kernels.triton.common import bind_launches  # noqa: E402


def make(lens, hq, hkv, d, causal=True, dtype=torch.bfloat16, seed=0, prefix=None, page=16):
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    prefix = prefix or [0] * len(lens)
    q = torch.randn(T, hq, d, generator=g).to(dtype).cuda()
    k = torch.randn(T, hkv, d, generator=g).to(dtype).cuda()
    v = torch.randn(T, hkv, d, generator=g).to(dtype).cuda()
    indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32).cuda()
    # the cached prefixes: shuffled pages of a pool whose every other slot is NaN
    n_pages = [-(-n // page) for n in prefix]
    perm = torch.randperm(sum(n_pages) + 3, generator=g)[: sum(n_pages)]
    k_cache = torch.full((sum(n_pages) + 3, page, hkv, d), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    k_pre, v_pre, p0 = [], [], 0
    for n, m in zip(prefix, n_pages):
        kp, vp = (torch.randn(n, hkv, d, generator=g).to(dtype) for _ in range(2))
        for i in range(n):
            pg = perm[p0 + i // page]
            k_cache[pg, i % page], v_cache[pg, i % page] = kp[i], vp[i]
        k_pre.append(kp.cuda())
        v_pre.append(vp.cuda())
        p0 += m
    kv_indptr = torch.tensor([0] + list(torch.tensor(n_pages).cumsum(0).tolist()), dtype=torch.int32).cuda()
    return SimpleNamespace(
        q=q,
        k_new=k,
        v_new=v,
        k_cache=k_cache.cuda(),
        v_cache=v_cache.cuda(),
        k_pre=k_pre,
        v_pre=v_pre,
        kv_page_indices=perm.to(torch.int32).cuda(),
        kv_indptr=kv_indptr,
        seq_lens=torch.tensor([p + n for p, n in zip(prefix, lens)], dtype=torch.int32).cuda(),
        qo_indptr=indptr,
        q_lens_host=tuple(lens),
        seq_lens_host=tuple(p + n for p, n in zip(prefix, lens)),
        causal=causal,
        window=-1,
        soft_cap=0.0,
        sinks=None,
        custom_mask=None,
        save_kv=False,
        sm_scale=d**-0.5,
        o=torch.full((T, hq, d), float("nan"), dtype=dtype).cuda(),
        lse=torch.full((T, hq), float("nan")).cuda(),
    )


def reference(x):
    o, lse = [], []
    G = x.q.shape[1] // x.k_new.shape[1]
    for b, n in enumerate(x.q_lens_host):
        r0 = int(x.qo_indptr[b])
        p = x.seq_lens_host[b] - n
        q = x.q[r0 : r0 + n].double()
        k = torch.cat([x.k_pre[b], x.k_new[r0 : r0 + n]]).double().repeat_interleave(G, 1)
        v = torch.cat([x.v_pre[b], x.v_new[r0 : r0 + n]]).double().repeat_interleave(G, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) * x.sm_scale
        if x.causal:
            s = s.masked_fill(torch.ones(n, p + n, dtype=torch.bool, device=s.device).triu(p + 1), float("-inf"))
        lse.append(torch.logsumexp(s, -1).T)
        o.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v))
    return torch.cat(o), torch.cat(lse)


CASES = [
    ("b1 s128 causal d128 gqa4", dict(lens=[128], hq=8, hkv=2, d=128)),
    ("b1 s1000 causal d128 gqa4", dict(lens=[1000], hq=8, hkv=2, d=128)),
    ("b3 ragged causal d128", dict(lens=[300, 17, 513], hq=4, hkv=4, d=128)),
    ("b2 ragged noncausal d128", dict(lens=[700, 129], hq=8, hkv=2, d=128, causal=False)),
    ("b2 ragged causal d64 fp16", dict(lens=[640, 100], hq=8, hkv=1, d=64, dtype=torch.float16)),
    ("b1 s4096 causal llama3", dict(lens=[4096], hq=32, hkv=8, d=128)),
    ("b3 prefix page16 causal d128", dict(lens=[300, 17, 513], prefix=[1000, 128, 7], hq=8, hkv=2, d=128)),
    ("b2 prefix page1 causal d64", dict(lens=[200, 129], prefix=[301, 64], hq=4, hkv=1, d=64, page=1)),
    ("b2 prefix page64 noncausal", dict(lens=[256, 100], prefix=[640, 33], hq=8, hkv=2, d=128, causal=False, page=64)),
    (
        "b2 prefix page128 fp16",
        dict(lens=[130, 400], prefix=[256, 1500], hq=4, hkv=4, d=128, page=128, dtype=torch.float16),
    ),
    ("b2 prefix page256 ragged", dict(lens=[128, 1], prefix=[700, 2048], hq=8, hkv=2, d=64, page=256)),
    ("b3 prefix page24 (gathered)", dict(lens=[90, 200, 5], prefix=[100, 0, 47], hq=8, hkv=2, d=128, page=24)),
    ("b1 chunk s2048 pre6144", dict(lens=[2048], prefix=[6144], hq=32, hkv=8, d=128, page=64)),
]


def main() -> int:
    print(torch.cuda.get_device_name(), torch.__version__, __import__("triton").__version__)
    bad = 0
    for label, kw in CASES:
        for stages, persistent in [(2, False), (3, False), (2, True), (3, True)]:
            x = make(**kw)
            why = prefill_ws.prefill_unsupported(x)
            assert why is None, why
            tiles = prefill_ws.plan_prefill(x)
            bind_launches(prefill_ws.prefill_launches(x, tiles, stages, persistent), {"o": x.o, "lse": x.lse})()
            torch.cuda.synchronize()
            ro, rl = reference(x)
            eo = (x.o.double() - ro).abs().max().item()
            el = (x.lse.double() - rl).abs().max().item()
            ulp = 2.0**-8 if x.q.dtype == torch.bfloat16 else 2.0**-11
            ok = eo <= 4 * ulp * ro.abs().max().item() and el <= 1e-4 and bool(torch.isfinite(x.o).all())
            bad += not ok
            print(
                f"{label}, {stages} stages{', persistent' if persistent else ''}: o err {eo:.3g} lse err {el:.3g} {'ok' if ok else 'FAIL'}",
                flush=True,
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
