"""SGLang fused_recurrent_gated_delta_rule_packed_decode rounds beta = sigmoid(b) to bf16.

The packed decode kernel computes `beta = sigmoid(b).to(b.dtype).to(float32)`: with bf16 b the
update gate is rounded to bf16 (relative error up to 2^-9) before the state update, so the written
state differs from the float32 update; SGLang's unpacked decode
(`fused_sigmoid_gating_delta_rule_update`) keeps beta in float32. The rounding matches the model's
reference (`beta = b.sigmoid()` on bf16 b in Qwen3-Next), so this is a design difference between
SGLang's two decode paths, not an overflow or indexing bug.

Runs the packed kernel on one decode step and compares the written state with two float64
references: beta exact, and beta rounded to bf16 as the kernel does. Standalone: torch + sglang
(CUDA only: the packed kernel does not run under TRITON_INTERPRET). Exit 1 while the state follows
the bf16-rounded beta (off the exact one beyond float32 level), 0 if it follows exact beta.
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
    p.add_argument("--head-dim", type=int, default=128, help="K = V")
    return p.parse_args(argv)


def versions():
    import triton

    return f"torch {torch.__version__}, triton {triton.__version__}, sglang {importlib.metadata.version('sglang')}"


def reference(q, k, v, h0, A_log, a, dt_bias, beta, scale):
    """float64 one-step gated delta rule; h0 [B, HV, V, K] (SGLang's layout); returns (o, h)."""
    B, H, K = q.shape
    HV = v.shape[1]
    rep = HV // H
    qn = torch.nn.functional.normalize(q.double(), dim=-1).repeat_interleave(rep, 1) * scale
    kn = torch.nn.functional.normalize(k.double(), dim=-1).repeat_interleave(rep, 1)
    x = a.double() + dt_bias.double()
    g = -A_log.double().exp() * torch.where(x <= 20, torch.log1p(torch.exp(x)), x)
    h = h0.double() * g.exp()[..., None, None]
    u = (v.double() - torch.einsum("bhvk,bhk->bhv", h, kn)) * beta[..., None]
    h = h + u[..., None] * kn[..., None, :]
    return torch.einsum("bhvk,bhk->bhv", h, qn), h


def main(argv=None) -> int:
    args = parse_args(argv)
    from sglang.srt.layers.attention.fla.fused_recurrent import fused_recurrent_gated_delta_rule_packed_decode

    print(versions())
    dev, B, H, K = args.device, args.batch, args.heads, args.head_dim
    HV, V = 2 * H, K
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, K, generator=g).to(torch.bfloat16)
    k = torch.randn(B, H, K, generator=g).to(torch.bfloat16)
    v = torch.randn(B, HV, V, generator=g).to(torch.bfloat16)
    a = torch.randn(B, HV, generator=g).to(torch.bfloat16)
    b = torch.randn(B, HV, generator=g).to(torch.bfloat16)
    A_log = torch.randn(HV, generator=g) * 0.5
    dt_bias = torch.randn(HV, generator=g) * 0.5
    pool = torch.randn(B, HV, V, K, generator=g) * 0.1  # [N, HV, V, K], request i in slot i
    scale = K**-0.5
    beta_exact = torch.sigmoid(b.double())
    beta_bf16 = torch.sigmoid(b.float()).to(torch.bfloat16).double()
    _, h_exact = reference(q, k, v, pool, A_log, a, dt_bias, beta_exact, scale)
    _, h_round = reference(q, k, v, pool, A_log, a, dt_bias, beta_bf16, scale)

    mixed = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1).to(dev)
    pool_d = pool.to(dev)
    out = torch.empty(B, 1, HV, V, dtype=torch.bfloat16, device=dev)
    idx = torch.arange(B, dtype=torch.int32, device=dev)
    fused_recurrent_gated_delta_rule_packed_decode(
        mixed,
        a.to(dev),
        b.to(dev),
        A_log.to(dev),
        dt_bias.to(dev),
        scale,
        pool_d,
        out,
        idx,
        use_qk_l2norm_in_kernel=True,
    )
    h = pool_d.double().cpu()
    e_exact, e_round = (h - h_exact).abs().max().item(), (h - h_round).abs().max().item()
    bound = 1e-5 * h_exact.abs().max().item()  # float32 level for a K-long update
    print(f"max|state| = {h_exact.abs().max().item():.4g}; float32-level bound {bound:.3g}")
    print(f"written state vs float64 with exact beta:        max err {e_exact:.3g}")
    print(f"written state vs float64 with beta rounded bf16: max err {e_round:.3g}")
    if e_exact > bound and e_round <= bound:
        print("FINDING PRESENT: the state follows beta rounded to bf16")
        return 1
    if e_exact > bound:
        print("FINDING PRESENT, but not (only) beta rounding: the state is off both references")
        return 1
    print("FIXED: the state follows exact beta")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a crash is not the finding: exit 3, so 1 always means "still there"
        import traceback

        traceback.print_exc()
        sys.exit(3)
