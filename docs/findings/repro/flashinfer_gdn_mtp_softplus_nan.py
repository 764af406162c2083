"""FlashInfer gated_delta_rule_mtp (warp-specialized kernel, B * HV > 128): NaN once a + dt_bias passes exp overflow.

`run_mtp_decode` (flashinfer/gdn_kernels/gdn_decode_mtp.py) launches the inline kernel
`gdn_verify_kernel_mtp_inline` when B * HV <= 128 and the warp-specialized `gdn_verify_kernel_mtp`
otherwise. The inline kernel (and the ReplaySSM precompute) compute softplus(x), x = a + dt_bias, with a
branch ("A masked 0 * exp(large_x) would still produce NaN", says its comment); the warp-specialized
kernel's warp-0 precompute still blends both branches with a 0/1 flag,
`use_softplus * log(1 + exp(x)) + (1 - use_softplus) * x`. Past x ~ 88.72 exp(x) is inf and the unused
branch gives 0 * inf = NaN in g, so that token's state, o and intermediate state are NaN, and the state
carries the NaN to every later token of the same (request, head). softplus(x) = x there: the reference
state simply decays.

Default: B = 8 requests, T = 4 tokens, HV = 32 heads (B * HV = 256: the warp-specialized kernel); head 0
of every request gets x = --gate (default 100) at token --gate-token (default 1), every other x = 0.
`--spread` draws the gates as attnbench's gdn suite does (every 16th `a` from the 5th uniform in 20..120,
the rest normal). Outputs are NaN-filled before the call, so an item the kernel leaves unwritten shows
too. Then the first 128 // HV requests run again alone (B * HV <= 128: the inline kernel), which
branches and stays finite. Printed: whether the NaN (request, token, head) items of o and of the
intermediate states are exactly the overflowing items and the later tokens of their (request, head).
(Session 11 and 13's runs of this file used B = 1, HV = 4: the inline kernel, no NaN.)
Standalone: torch + flashinfer only (SM90+). Exit 1 while NaN appears, 0 once fixed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

import torch

EXP_OVERFLOW = 88.72  # float32 exp(x) is inf past ln(FLT_MAX) = 88.7228


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=8, help="requests B (B * HV > 128: the warp-specialized kernel)")
    p.add_argument("--tokens", type=int, default=4, help="draft tokens T")
    p.add_argument("--v-heads", type=int, default=32, help="value heads HV (query/key heads = HV / 2)")
    p.add_argument("--gate", type=float, default=100.0, help="a + dt_bias of head 0 (> 88.72 overflows exp)")
    p.add_argument("--gate-token", type=int, default=1, help="the token that gets --gate (later tokens carry it)")
    p.add_argument("--spread", action="store_true", help="gates as attnbench's gdn suite draws them")
    return p.parse_args(argv)


def versions():
    return f"torch {torch.__version__}, flashinfer {importlib.metadata.version('flashinfer-python')}"


def kernel_name(B, HV):
    """The kernel run_mtp_decode picks (flashinfer 0.7.2.post1: `use_inline_kernel = (B * HV) <= 128`)."""
    return "gdn_verify_kernel_mtp_inline" if B * HV <= 128 else "gdn_verify_kernel_mtp (warp-specialized)"


def reference(q, k, v, h0, A_log, a, dt_bias, b, scale):
    """float64 chain verify from h0 [B, HV, V, K] (K-last, state[v, k]): per token t,
    S = exp(g) S; S += beta (v - S k) k^T; o = S q, with g = -exp(A_log) softplus(a + dt_bias)
    (softplus threshold 20) and L2-normalised q, k. Returns o [B, T, HV, V]."""
    B, T, H, K = q.shape
    HV = v.shape[2]
    rep = HV // H
    h = h0.double().clone()
    o = torch.zeros(B, T, HV, v.shape[3], dtype=torch.float64)
    for t in range(T):
        qt = torch.nn.functional.normalize(q[:, t].double(), dim=-1).repeat_interleave(rep, 1) * scale
        kt = torch.nn.functional.normalize(k[:, t].double(), dim=-1).repeat_interleave(rep, 1)
        x = a[:, t].double() + dt_bias.double()
        sp = torch.where(x > 20, x, torch.log1p(torch.exp(x.clamp(max=20))))
        g = -A_log.double().exp() * sp  # [B, HV]
        h = h * g.exp()[..., None, None]
        u = (v[:, t].double() - torch.einsum("bhvk,bhk->bhv", h, kt)) * torch.sigmoid(b[:, t].double())[..., None]
        h = h + u[..., None] * kt[..., None, :]
        o[:, t] = torch.einsum("bhvk,bhk->bhv", h, qt)
    return o


def run(args, inputs, B):
    """The first B requests through gated_delta_rule_mtp with NaN-filled outputs: (o, intermediate states) on the CPU."""
    from flashinfer.gdn_decode import gated_delta_rule_mtp

    dev = args.device
    q, k, v, pool, A_log, a, dt_bias, b, scale = inputs
    T, HV, V, K = v.shape[1], v.shape[2], v.shape[3], q.shape[3]
    out = torch.full((B, T, HV, V), float("nan"), dtype=torch.bfloat16, device=dev)
    inter = torch.full((B, T, HV, V, K), float("nan"), dtype=torch.float32, device=dev)
    gated_delta_rule_mtp(
        q[:B].to(dev), k[:B].to(dev), v[:B].to(dev), pool[:B].to(dev), torch.arange(B, dtype=torch.int32, device=dev),
        A_log.to(dev), a[:B].to(dev), dt_bias.to(dev), b[:B].to(dev), scale=scale, output=out,
        intermediate_states_buffer=inter, disable_state_update=True, use_qk_l2norm=True,
    )  # fmt: skip
    return out.double().cpu(), inter.cpu()


def nan_items(o, inter):
    """[B, T, HV] masks: (request, token, head) items with a NaN in o, in the intermediate state."""
    return torch.isnan(o).any(dim=-1), torch.isnan(inter).flatten(3).any(dim=-1)


def main(argv=None) -> int:
    args = parse_args(argv)
    import flashinfer.gdn_decode  # noqa: F401  (the library; a missing one is exit 3)

    print(versions())
    B, T, HV, K, V = args.batch, args.tokens, args.v_heads, 128, 128
    H = max(HV // 2, 1)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, H, K, generator=g).to(torch.bfloat16)
    k = torch.randn(B, T, H, K, generator=g).to(torch.bfloat16)
    v = torch.randn(B, T, HV, V, generator=g).to(torch.bfloat16)
    pool = torch.randn(B, HV, V, K, generator=g) * 0.1  # [pool, HV, V, K], K-last, fp32; request r: slot r
    A_log = torch.full((HV,), -1.0)
    dt_bias = torch.zeros(HV)
    if args.spread:  # attnbench's gdn gates: normal, every 16th from the 5th uniform in 20..120
        a = torch.randn(B, T, HV, generator=g)
        a.view(-1)[5::16] = 20.0 + 100.0 * torch.rand(a.view(-1)[5::16].numel(), generator=g)
    else:
        a = torch.zeros(B, T, HV)
        a[:, min(args.gate_token, T - 1), 0] = args.gate
    a = a.to(torch.bfloat16)
    b = torch.randn(B, T, HV, generator=g).to(torch.bfloat16)
    scale = K**-0.5
    inputs = (q, k, v, pool, A_log, a, dt_bias, b, scale)
    o_ref = reference(*inputs)

    over = (a.float() + dt_bias) > EXP_OVERFLOW  # [B, T, HV]
    carried = over.int().cummax(dim=1).values.bool()  # the overflowing items and the later tokens of their (r, h)
    print(f"{B} requests x {T} tokens x {HV} heads; {int(over.sum())} items with a + dt_bias past {EXP_OVERFLOW}, "
          f"{int(carried.sum())} counting the later tokens of their (request, head)")  # fmt: skip
    print(f"expected: finite o and intermediate states, max|o_ref| = {o_ref.abs().max().item():.4g}")

    present = False
    b_inline = max(1, min(B, 128 // HV))
    for n in dict.fromkeys((B, b_inline)):  # the whole batch, then the inline kernel's share (once if the same)
        o, inter = run(args, inputs, n)
        nan_o, nan_s = nan_items(o, inter)
        want = carried[:n]
        print(f"B = {n}, B * HV = {n * HV}: {kernel_name(n, HV)}")
        print(f"  NaN o items {int(nan_o.sum())}, NaN state items {int(nan_s.sum())}; NaN o where x <= "
              f"{EXP_OVERFLOW}: {int((nan_o & ~over[:n]).sum())}")  # fmt: skip
        print(f'  "NaN items == overflowing items and the later tokens of their (request, head)": '
              f"{bool((nan_o == want).all() and (nan_s == want).all())}")  # fmt: skip
        if nan_o.any():
            print(f"  NaN in o at (request, token, head) = {nan_o.nonzero().tolist()[:12]} (first 12)")
        finite = ~torch.isnan(o)
        err = (o[finite] - o_ref[:n][finite]).abs().max().item() if finite.any() else float("nan")
        print(f"  max |o - ref| over the finite entries: {err:.3g}")
        present |= bool(nan_o.any() or nan_s.any())
    if present:
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
