"""Check the Gluon MLA decode kernels (kernels/triton/decode_mla_ws.py, decode_mla_gluon.py) on a Hopper GPU
against float64.

Runs without an installed attnbench (torch and triton only): the kernel modules are imported from this
checkout. Cases cover whole pages, a partial last page (masked tail), a window start inside a block
(masked head), split requests (partials and the merge) and one-split requests (final outputs). Prints
one line per case (max abs error of o and lse against float64, and against the Triton MLA kernel) and
exits 1 if any case is over its bound (twice the Triton MLA kernel's error, at least 1e-2 for o and 1e-4
for the LSE) or has a non-finite output. Correctness only: speed is measured by `attnbench sweep`.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dataclasses import replace  # noqa: E402

import checkout_packages  # noqa: E402, F401  (attnbench's kernel modules from this checkout, uninstalled)
import torch  # noqa: E402

from attnbench.kernels.triton import decode_mla, decode_mla_gluon  # noqa: E402
from attnbench.kernels.triton.common import bind_launches  # noqa: E402


def make(B, L, H=128, page=64, window=-1, seed=0, lens=None):
    g = torch.Generator().manual_seed(seed)
    lens = lens or [L] * B
    pages_per = [-(-n // page) for n in lens]
    P = sum(pages_per) + 3
    perm = torch.randperm(P, generator=g)
    kv = torch.randn(P, page, 1, 576, generator=g).to(torch.bfloat16)
    # slots past each sequence hold NaN, as a server's freed pages may
    q = (torch.randn(B, H, 576, generator=g) * 0.5).to(torch.bfloat16)
    idx, indptr, used = [], [0], 0
    for n, k in zip(lens, pages_per):
        ps = perm[used : used + k].tolist()
        used += k
        idx += ps
        indptr.append(len(idx))
        last = ps[-1]
        tail = n - (k - 1) * page
        kv[last, tail:] = float("nan")
    dev = "cuda"
    kv = kv.to(dev)
    x = SimpleNamespace(
        q=q.to(dev),
        k_cache=kv,
        v_cache=kv[..., :512],
        kv_page_indices=torch.tensor(idx, dtype=torch.int32, device=dev),
        kv_indptr=torch.tensor(indptr, dtype=torch.int32, device=dev),
        qo_indptr=torch.arange(B + 1, dtype=torch.int32, device=dev),
        q_lens_host=[1] * B,
        seq_lens_host=lens,
        window=window,
        soft_cap=0.0,
        sinks=None,
        sm_scale=576**-0.5,
        o=torch.empty(B, H, 512, dtype=torch.bfloat16, device=dev),
        lse=torch.empty(B, H, dtype=torch.float32, device=dev),
    )
    return x


def reference(x):
    o, lse = [], []
    for b, n in enumerate(x.seq_lens_host):
        ps = x.kv_page_indices[x.kv_indptr[b] : x.kv_indptr[b + 1]].long()
        kv = x.k_cache[ps, :, 0].reshape(-1, 576)[:n].double()
        lo = max(0, n - 1 - x.window) if x.window >= 0 else 0
        kv = kv[lo:]
        s = x.q[b].double() @ kv.T * x.sm_scale
        lse.append(torch.logsumexp(s, -1))
        o.append(torch.softmax(s, -1) @ kv[:, :512])
    return torch.stack(o), torch.stack(lse)


def plan_for(x, impl: str, splits=None):
    """The plan of `x` on MLA kernel `impl` ("triton", "wgmma", "ws"), the same schedule for each."""
    config = replace(decode_mla.mla_config(x.q.shape[1], x.k_cache.shape[1], 90), impl=impl)
    return decode_mla.plan_mla_decode(x, config=config, splits=splits)


def run(x, impl: str, splits=None):
    plan = plan_for(x, impl, splits)
    launches = decode_mla._launches(x, plan)
    x.o.fill_(float("nan"))
    x.lse.fill_(float("nan"))
    bind_launches(launches, {"o": x.o, "lse": x.lse})()
    torch.cuda.synchronize()
    return x.o.clone(), x.lse.clone(), plan


CASES = [
    ("b1 L64", dict(B=1, L=64)),
    ("b1 L100 tail", dict(B=1, L=100)),
    ("b2 L1000 window 300 (masked head)", dict(B=2, L=1000, window=300)),
    ("b3 mixed lens", dict(B=3, L=0, lens=[1, 777, 4096])),
    ("b32 L4096", dict(B=32, L=4096)),
    ("b4 L8192 split 4", dict(B=4, L=8192), 4),
    ("b16 L8192 H64", dict(B=16, L=8192, H=64)),
    ("b8 L2048 page128", dict(B=8, L=2048, page=128)),
    ("b5 mixed lens split 3", dict(B=5, L=0, lens=[65, 3000, 129, 4097, 64]), 3),
    ("b2 L5000 window 700 split 8", dict(B=2, L=5000, window=700), 8),
]


def main() -> int:
    print(torch.cuda.get_device_name(), torch.__version__, __import__("triton").__version__)
    bad = 0
    for case in CASES:
        label, kw = case[0], case[1]
        splits = case[2] if len(case) > 2 else None
        x = make(**kw)
        ro, rl = reference(x)
        why = decode_mla_gluon.gluon_unsupported(x)
        if why:
            print(f"{label}: skipped ({why})")
            continue
        to, tl_, _ = run(x, "triton", splits)
        teo = (to.double() - ro).abs().max().item()
        tel = (tl_.double() - rl).abs().max().item()
        for impl in ("ws", "wgmma"):
            go, gl_, plan = run(x, impl, splits)
            assert plan.config.impl == impl
            eo = (go.double() - ro).abs().max().item()
            el = (gl_.double() - rl).abs().max().item()
            ok = eo <= max(2 * teo, 1e-2) and el <= max(2 * tel, 1e-4) and bool(torch.isfinite(go).all())
            bad += not ok
            print(
                f"{label} {impl}: splits {max(plan.splits)} o err {eo:.3g} (triton {teo:.3g}) "
                f"lse err {el:.3g} (triton {tel:.3g}) {'ok' if ok else 'FAIL'}",
                flush=True,
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
