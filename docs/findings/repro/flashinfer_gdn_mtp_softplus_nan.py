"""FlashInfer gated_delta_rule_mtp: NaN once a + dt_bias passes float32 exp overflow (~88.7).

The MTP (speculative verify) GDN kernel computes softplus(x), x = a + dt_bias, as
`use_softplus * log(1 + exp(x)) + (1 - use_softplus) * x` with a 0/1 flag (threshold 20). Past
x ~ 88.7 exp(x) is inf, and the unused branch gives 0 * inf = NaN, which reaches o and the
intermediate states. softplus(x) = x there, so the gate g = -exp(A_log) * x is finite and the
state simply decays to ~0. The one-token kernel (gated_delta_rule_decode_pretranspose) branches and
is finite on the same gates.

One request, T draft tokens, HV value heads; head 0 gets x = --gate (default 100), the other heads
x = 0. `--spread` instead draws the gates as attnbench's gdn suite does (every 16th `a` from the 5th
uniform in 20..120, the rest normal) over --batch requests, and the outputs are NaN-filled before the
call (as attnbench fills them), so an output the kernel leaves unwritten shows as NaN too; it then
prints whether the NaN (token, head) items are exactly those with a + dt_bias past exp overflow
(H100, session 13: the sweep's `gdn_verify/b32-t4-h16x32-d128x128-bf16` had 130 NaN items, first at
token 0 head 21, while the default single-head input here gave none). The float64 reference follows
the gated delta rule with L2-normalised q/k. Standalone: torch + flashinfer only (SM90+). Exit 1
while NaN appears, 0 once fixed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import sys

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", type=int, default=2, help="draft tokens T")
    p.add_argument("--v-heads", type=int, default=4, help="value heads HV (query/key heads = HV / 2)")
    p.add_argument("--gate", type=float, default=100.0, help="a + dt_bias of head 0 (> 88.7 overflows exp)")
    p.add_argument(
        "--spread", action="store_true", help="gates as attnbench's gdn suite draws them, NaN-filled outputs"
    )
    p.add_argument("--batch", type=int, default=1, help="requests (with --spread; e.g. 32, --tokens 4 --v-heads 32)")
    return p.parse_args(argv)


def versions():
    return f"torch {torch.__version__}, flashinfer {importlib.metadata.version('flashinfer-python')}"


def reference(q, k, v, h0, A_log, a, dt_bias, b, scale):
    """float64 chain verify: per token t, S = exp(g) S + beta k (v - S^T k)^T ... in K-last form h[v, k]."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    o = torch.zeros(B, T, HV, V, dtype=torch.float64)
    h = h0.double().clone()  # [B, HV, V, K]: request r starts from slot r
    for r in range(B):
        for t in range(T):
            for hv in range(HV):
                hq = hv // (HV // H)
                qt = torch.nn.functional.normalize(q[r, t, hq].double(), dim=0) * scale
                kt = torch.nn.functional.normalize(k[r, t, hq].double(), dim=0)
                x = float(a[r, t, hv].double() + dt_bias[hv].double())
                sp = x if x > 20 else math.log1p(math.exp(x))
                g = -math.exp(A_log[hv].item()) * sp
                beta = torch.sigmoid(b[r, t, hv].double())
                s = h[r, hv] * math.exp(g)
                u = (v[r, t, hv].double() - s @ kt) * beta
                s = s + u[:, None] * kt[None, :]
                h[r, hv] = s
                o[r, t, hv] = s @ qt
    return o


def main(argv=None) -> int:
    a_ = parse_args(argv)
    from flashinfer.gdn_decode import gated_delta_rule_mtp

    print(versions())
    dev, T, HV, K = a_.device, a_.tokens, a_.v_heads, 128
    H, V, B = max(HV // 2, 1), 128, (a_.batch if a_.spread else 1)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, H, K, generator=g).to(torch.bfloat16)
    k = torch.randn(B, T, H, K, generator=g).to(torch.bfloat16)
    v = torch.randn(B, T, HV, V, generator=g).to(torch.bfloat16)
    pool = torch.randn(B, HV, V, K, generator=g) * 0.1  # [pool, HV, V, K], K-last, fp32; request r: slot r
    A_log = torch.full((HV,), -1.0)
    dt_bias = torch.zeros(HV)
    if a_.spread:  # attnbench's gdn gates: normal, every 16th from the 5th uniform in 20..120
        a = torch.randn(B, T, HV, generator=g)
        a.view(-1)[5::16] = 20.0 + 100.0 * torch.rand(a.view(-1)[5::16].numel(), generator=g)
        a = a.to(torch.bfloat16)
    else:
        a = torch.zeros(B, T, HV).to(torch.bfloat16)
        a[:, :, 0] = a_.gate
    b = torch.randn(B, T, HV, generator=g).to(torch.bfloat16)
    scale = K**-0.5
    o_ref = reference(q, k, v, pool, A_log, a, dt_bias, b, scale)

    fill = float("nan") if a_.spread else 0.0  # NaN-filled: an unwritten output shows
    out = torch.full((B, T, HV, V), fill, dtype=torch.bfloat16, device=dev)
    inter = torch.full((B, T, HV, V, K), fill, dtype=torch.float32, device=dev)
    gated_delta_rule_mtp(
        q.to(dev), k.to(dev), v.to(dev), pool.to(dev), torch.arange(B, dtype=torch.int32, device=dev), A_log.to(dev),
        a.to(dev), dt_bias.to(dev), b.to(dev), scale=scale, output=out, intermediate_states_buffer=inter,
        disable_state_update=True, use_qk_l2norm=True,
    )  # fmt: skip
    o = out.double().cpu()
    nan_o = torch.isnan(o).any(dim=-1)  # [B, T, HV]
    nan_s = torch.isnan(inter.cpu()).flatten(3).any(dim=-1)
    x = a.float() + dt_bias  # [B, T, HV]
    if a_.spread:
        over = x > 88.72
        print(f"{B} requests x {T} tokens x {HV} heads; {int(over.sum())} items with a + dt_bias past 88.72")
        print(
            f"NaN o items {int(nan_o.sum())}, NaN state items {int(nan_s.sum())}; NaN o exactly the overflowing items: "
            f"{bool((nan_o == over).all())}; NaN o where x <= 88.72: {int((nan_o & ~over).sum())}"
        )
    else:
        print(f"a + dt_bias of head 0 = {a_.gate} (float32 exp overflows past 88.72); other heads 0")
    print(f"expected: finite o, max|o_ref| = {o_ref.abs().max().item():.4g}")
    print(
        f"actual: NaN in o at (request, token, head) = {nan_o.nonzero().tolist()[:20]}, NaN in intermediate states at "
        f"{nan_s.nonzero().tolist()[:20]} (first 20)"
    )
    finite = ~torch.isnan(o)
    err = (o[finite] - o_ref[finite]).abs().max().item() if finite.any() else float("nan")
    print(f"max |o - ref| over the finite entries: {err:.3g}")
    if nan_o.any() or nan_s.any():
        print("FINDING PRESENT: NaN where softplus(x) = x is finite")
        return 1
    print("FIXED: no NaN past exp overflow")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a crash is not the finding: exit 3, so 1 always means "still there"
        import traceback

        traceback.print_exc()
        sys.exit(3)
