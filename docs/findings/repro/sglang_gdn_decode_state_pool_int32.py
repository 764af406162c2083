"""SGLang's Triton GDN decode addresses its state pool with `slot * HV * K * V` in the slot indices' dtype:
int32 slots (what SGLang's server allocates) wrap past 2^31 elements.

`fused_sigmoid_gating_delta_rule_update_kernel` loads `idx = tl.load(h0_indices + i_n)` and reads
`h0_source + idx * HV * K * V + ...`; with int32 indices the product is int32. A pool of 4224 fp32 slots of
32 x 128 x 128 (8.9 GB, 2.2e9 elements) puts slots 4096 and later past 2^31. SGLang's server holds its
mamba slot indices as int32 (`req_index_to_mamba_index_mapping`, the CUDA-graph `state_indices_list`).

One decode step of a few requests on the last slots of such a pool, once with int32 and once with int64
slot indices, each in a subprocess (an illegal memory access poisons the CUDA context), each compared with
a float64 reference of those slots. Standalone: torch + sglang, a GPU with 10 GB free. Exit 1 while the
int32 run crashes or is wrong, 0 once it passes, 3 when it cannot run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--slots", type=int, default=4224, help="pool slots (4224 x 32 x 128 x 128 fp32 = 8.9 GB)")
    p.add_argument("--batch", type=int, default=4, help="requests, on the last slots of the pool")
    p.add_argument("--index-dtype", choices=("int32", "int64"), help="run one dtype in this process (the child)")
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


def run_one(args) -> int:
    """The child: one decode step with `args.index_dtype` slots; 0 right, 1 wrong (a CUDA error exits 2)."""
    from sglang.srt.layers.attention.fla.fused_sigmoid_gating_recurrent import fused_sigmoid_gating_delta_rule_update

    dev, B, N = args.device, args.batch, args.slots
    H, HV, K, V = 16, 32, 128, 128
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, K, generator=g).to(torch.bfloat16)
    k = torch.randn(B, H, K, generator=g).to(torch.bfloat16)
    v = torch.randn(B, HV, V, generator=g).to(torch.bfloat16)
    a = torch.randn(B, HV, generator=g).to(torch.bfloat16)
    b = torch.randn(B, HV, generator=g).to(torch.bfloat16)
    A_log = torch.randn(HV, generator=g) * 0.5
    dt_bias = (torch.randn(HV, generator=g) * 0.5).to(torch.bfloat16)
    h0 = torch.randn(B, HV, V, K, generator=g) * 0.3
    slots = list(range(N - B, N))
    scale = K**-0.5
    o_ref, h_ref = reference(q, k, v, h0, A_log, a, dt_bias, b, scale)
    pool = torch.zeros(N, HV, V, K, dtype=torch.float32, device=dev)  # SGLang's [N, HV, V, K] ssm_states
    pool[slots] = h0.to(dev)
    d = {n: t.to(dev) for n, t in dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias).items()}
    idx = torch.tensor(slots, dtype=getattr(torch, args.index_dtype), device=dev)
    print(f"pool {tuple(pool.shape)} fp32 ({pool.numel():.3g} elements, 2^31 = {2**31:.3g}); slots {slots} "
          f"{args.index_dtype}: first element of slot {slots[-1]} at {slots[-1] * HV * V * K:.4g}")  # fmt: skip
    o = fused_sigmoid_gating_delta_rule_update(
        d["A_log"], d["a"], d["dt_bias"], 1.0, 20.0, d["q"][None], d["k"][None], d["v"][None], d["b"], pool, idx,
        scale=scale, use_qk_l2norm_in_kernel=True, cu_seqlens=torch.arange(B + 1, dtype=torch.int32, device=dev),
    ).view(B, HV, V)  # fmt: skip
    if pool.is_cuda:
        torch.cuda.synchronize(pool.device)
    eo = (o.double().cpu() - o_ref).abs().max().item()
    eh = (pool[slots].double().cpu() - h_ref).abs().max().item()
    tol_o, tol_h = 2**-6 * o_ref.abs().max().item(), 1e-4 * h_ref.abs().max().item()
    ok = eo <= tol_o and eh <= tol_h
    print(f"{args.index_dtype}: max|o - ref| {eo:.3g} (tol {tol_o:.3g}), max|state - ref| {eh:.3g} (tol {tol_h:.3g}): "
          + ("right" if ok else "WRONG"))  # fmt: skip
    return 0 if ok else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.index_dtype:
        try:
            return run_one(args)
        except RuntimeError as e:  # an illegal memory access surfaces here (or at the next CUDA call)
            print(f"{args.index_dtype}: CUDA error: {str(e).splitlines()[0]}")
            return 2 if "out of memory" not in str(e) else 3
    import subprocess

    print(versions())
    verdict = {}
    for dtype in ("int32", "int64"):
        cmd = [sys.executable, __file__, "--device", args.device, "--slots", str(args.slots),
               "--batch", str(args.batch), "--index-dtype", dtype]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        out = (r.stdout + r.stderr).strip().splitlines()
        print("\n".join(line for line in out if "Warning" not in line and line.strip()))
        verdict[dtype] = {0: "right", 1: "wrong", 2: "crash"}.get(r.returncode, f"could not run (exit {r.returncode})")
        print(f"-> {dtype} slot indices: {verdict[dtype]}")
    if any(v.startswith("could not run") for v in verdict.values()):
        print("CANNOT RUN: a child did not reach a verdict")
        return 3
    if verdict["int32"] != "right":
        print(f"FINDING PRESENT: int32 slot indices {verdict['int32']}, int64 {verdict['int64']}: "
              "the slot offset is computed in the indices' dtype")  # fmt: skip
        return 1
    print("FIXED: int32 slot indices address the whole pool")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a crash is not the finding: exit 3, so 1 always means "still there"
        import traceback

        traceback.print_exc()
        sys.exit(3)
