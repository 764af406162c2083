"""SGLang's CuTe DSL GDN decode reads the state pool as [N, HV, K, V]; its server hands it [N, HV, V, K].

`CuteDSLGDNKernel.decode` passes the server's `ssm_states` unchanged to
`cutedsl_fused_sigmoid_gating_delta_rule_update`, whose kernel addresses `h0_source[pool, hv, k, v]`.
SGLang's Triton GDN kernels (extend, decode, verify), which write that same pool, address it as
[N, HV, V, K] (K contiguous). With K = V = 128 the shapes agree and nothing fails loudly: the CuTe
decode reads every state transposed. (SGLang's own CuTe-vs-Triton precision test passes one buffer
to both kernels and is skipped as "precision currently unstable".)

One decode step on one pool in SGLang's server layout [N, HV, V, K] (random, not symmetric), run
through the Triton decode and the CuTe decode, each compared with a float64 reference in that layout.
Standalone: torch + sglang + nvidia-cutlass-dsl (SM90+). Exit 1 while the CuTe decode disagrees with
the reference where the Triton decode agrees, 0 once they agree.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=2, help="q/k heads H (value heads HV = 2H)")
    return p.parse_args(argv)


def versions():
    import triton

    return f"torch {torch.__version__}, triton {triton.__version__}, sglang {importlib.metadata.version('sglang')}"


def reference(q, k, v, h0, A_log, a, dt_bias, b, scale):
    """float64 one-step gated delta rule on h0 [B, HV, V, K] (state[v, k]); returns (o [B, HV, V], h)."""
    rep = v.shape[1] // q.shape[1]
    qn = torch.nn.functional.normalize(q.double(), dim=-1).repeat_interleave(rep, 1) * scale
    kn = torch.nn.functional.normalize(k.double(), dim=-1).repeat_interleave(rep, 1)
    x = a.double() + dt_bias.double()
    g = -A_log.double().exp() * torch.where(x <= 20, torch.log1p(torch.exp(x)), x)
    h = h0.double() * g.exp()[..., None, None]
    u = (v.double() - torch.einsum("bhvk,bhk->bhv", h, kn)) * torch.sigmoid(b.double())[..., None]
    h = h + u[..., None] * kn[..., None, :]
    return torch.einsum("bhvk,bhk->bhv", h, qn), h


def main(argv=None) -> int:
    args = parse_args(argv)
    from sglang.jit_kernel.cutedsl_gdn import cutedsl_fused_sigmoid_gating_delta_rule_update
    from sglang.srt.layers.attention.fla.fused_sigmoid_gating_recurrent import fused_sigmoid_gating_delta_rule_update

    print(versions(), f"nvidia-cutlass-dsl {importlib.metadata.version('nvidia-cutlass-dsl')}")
    dev, B, H, K = args.device, args.batch, args.heads, 128
    HV, V = 2 * H, 128
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, K, generator=g).to(torch.bfloat16)
    k = torch.randn(B, H, K, generator=g).to(torch.bfloat16)
    v = torch.randn(B, HV, V, generator=g).to(torch.bfloat16)
    a = torch.randn(B, HV, generator=g).to(torch.bfloat16)
    b = torch.randn(B, HV, generator=g).to(torch.bfloat16)
    A_log = torch.randn(HV, generator=g) * 0.5
    dt_bias = (torch.randn(HV, generator=g) * 0.5).to(torch.bfloat16)
    pool = torch.randn(B, HV, V, K, generator=g) * 0.3  # SGLang's server layout [N, HV, V, K]
    scale = K**-0.5
    o_ref, h_ref = reference(q, k, v, pool, A_log, a, dt_bias, b, scale)
    d = {n: t.to(dev) for n, t in dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias).items()}
    idx = torch.arange(B, dtype=torch.int32, device=dev)

    pool_t = pool.to(dev)
    o_t = fused_sigmoid_gating_delta_rule_update(
        d["A_log"], d["a"], d["dt_bias"], 1.0, 20.0, d["q"][None], d["k"][None], d["v"][None], d["b"], pool_t, idx,
        scale=scale, use_qk_l2norm_in_kernel=True, cu_seqlens=torch.arange(B + 1, dtype=torch.int32, device=dev),
    ).view(B, HV, V)  # fmt: skip
    pool_c = pool.to(dev)
    o_c = cutedsl_fused_sigmoid_gating_delta_rule_update(
        d["A_log"], d["dt_bias"], d["q"][:, None], d["k"][:, None], d["v"][:, None], d["a"], d["b"], pool_c, idx,
        scale=scale, use_qk_l2norm_in_kernel=True,
    ).view(B, HV, V)  # fmt: skip
    torch.cuda.synchronize()
    tol_o = 2**-6 * o_ref.abs().max().item()  # a few bf16 ulps of max|o|
    tol_h = 1e-4 * h_ref.abs().max().item()
    res = {}
    for name, o, h in (("triton", o_t, pool_t), ("cute", o_c, pool_c)):
        eo, eh = (o.double().cpu() - o_ref).abs().max().item(), (h.double().cpu() - h_ref).abs().max().item()
        res[name] = eo <= tol_o and eh <= tol_h
        print(f"{name:6s} decode on the [N, HV, V, K] pool: max|o - ref| {eo:.3g} (tol {tol_o:.3g}), "
              f"max|state - ref| {eh:.3g} (tol {tol_h:.3g})")  # fmt: skip
    eh_t = pool_c.double().cpu() - reference(q, k, v, pool.transpose(-1, -2), A_log, a, dt_bias, b, scale)[1].transpose(
        -1, -2
    )
    print(f"cute state vs the reference on the transposed pool: max err {eh_t.abs().max().item():.3g}")
    if res["triton"] and not res["cute"]:
        print("FINDING PRESENT: the CuTe decode does not compute the server's [N, HV, V, K] states")
        return 1
    if not res["triton"]:
        print("INCONCLUSIVE: the Triton decode disagrees with the reference too")
        return 1
    print("FIXED: both decodes agree with the reference on the server's pool layout")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a crash is not the finding: exit 3, so 1 always means "still there"
        import traceback

        traceback.print_exc()
        sys.exit(3)
