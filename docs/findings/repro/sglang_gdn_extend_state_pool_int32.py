"""SGLang's chunked GDN extend casts the slot index to int32 before `slot * HV * V * K`: slots past 2^31
elements of the state pool are read and written at a wrapped offset, whatever the indices' dtype.

`chunk_gated_delta_rule_fwd_kernel_h_blockdim64` (sglang/srt/layers/attention/fla/chunk_delta_h.py)
loads `index = tl.load(initial_state_indices + i_n).to(tl.int32)` and points at
`initial_state + index * stride_h` (stride_h = H * V * K, a constexpr), both for the initial state it
reads and the final state it writes in place. With 32 heads of 128 x 128 fp32 the product passes 2^31 at
slot 4096 (the other offsets of the kernel are cast to int64 first). SGLang's `chunk_gated_delta_rule`
(prefill / extend of a GDN layer) runs it over the server's mamba state pool.

A few requests of --tokens tokens each extend from states in a 4224-slot pool (8.9 GB; the other slots
NaN, so a read of a wrong slot there shows), three runs each in a subprocess (an illegal memory access
poisons the CUDA context): int64 slots at the pool's start (the control), int32 and int64 slots at its end,
each against a float64 reference of o and the final states. Standalone: torch + sglang, a GPU with 10 GB
free. Exit 1 while a run at the pool's end crashes or is wrong and the control is right, 0 once all
three pass, 3 when it cannot run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

import torch

RUNS = (("start", "int64"), ("end", "int32"), ("end", "int64"))  # (where the slots are, their dtype)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--slots", type=int, default=4224, help="pool slots (4224 x 32 x 128 x 128 fp32 = 8.9 GB)")
    p.add_argument("--batch", type=int, default=4, help="requests")
    p.add_argument("--tokens", type=int, default=24, help="new tokens per request")
    p.add_argument("--run", choices=[f"{w}-{d}" for w, d in RUNS], help="run one case in this process (the child)")
    return p.parse_args(argv)


def versions():
    import triton

    return f"torch {torch.__version__}, triton {triton.__version__}, sglang {importlib.metadata.version('sglang')}"


def reference(q, k, v, g, beta, h0, cu, scale):
    """float64 gated delta rule, token by token, per request from h0 [B, HV, V, K] (state[v, k]):
    S = exp(g) S; S += beta (v - S k) k^T; o = S q with L2-normalised q, k. Returns (o [T, HV, V], final h)."""
    rep = v.shape[1] // q.shape[1]
    o = torch.zeros(v.shape, dtype=torch.float64)
    hs = []
    for r in range(len(cu) - 1):
        h = h0[r].double().clone()
        for t in range(int(cu[r]), int(cu[r + 1])):
            qt = torch.nn.functional.normalize(q[t].double(), dim=-1).repeat_interleave(rep, 0) * scale
            kt = torch.nn.functional.normalize(k[t].double(), dim=-1).repeat_interleave(rep, 0)
            h = h * g[t].double().exp()[:, None, None]
            u = (v[t].double() - torch.einsum("hvk,hk->hv", h, kt)) * beta[t].double()[:, None]
            h = h + u[..., None] * kt[:, None, :]
            o[t] = torch.einsum("hvk,hk->hv", h, qt)
        hs.append(h)
    return o, torch.stack(hs)


def run_one(args) -> int:
    """The child: one extend; 0 right, 1 wrong (a CUDA error exits 2)."""
    from sglang.srt.layers.attention.fla.chunk import chunk_gated_delta_rule

    where, dtype = args.run.split("-")
    dev, B, L, N = args.device, args.batch, args.tokens, args.slots
    H, HV, K, V = 16, 32, 128, 128
    T = B * L
    g = torch.Generator().manual_seed(0)
    q = torch.randn(T, H, K, generator=g).to(torch.bfloat16)
    k = torch.randn(T, H, K, generator=g).to(torch.bfloat16)
    v = torch.randn(T, HV, V, generator=g).to(torch.bfloat16)
    gate = -0.02 * torch.rand(T, HV, generator=g)  # log decay, mild: the initial state stays in o and the state
    beta = torch.rand(T, HV, generator=g)
    h0 = torch.randn(B, HV, V, K, generator=g) * 0.3
    cu = torch.arange(0, T + 1, L)
    slots = list(range(N - B, N)) if where == "end" else list(range(B))
    scale = K**-0.5
    o_ref, h_ref = reference(q, k, v, gate, beta, h0, cu, scale)
    pool = torch.full((N, HV, V, K), float("nan"), dtype=torch.float32, device=dev)  # SGLang's [N, HV, V, K]
    pool[slots] = h0.to(dev)
    idx = torch.tensor(slots, dtype=getattr(torch, dtype), device=dev)
    print(f"pool {tuple(pool.shape)} fp32 ({pool.numel():.3g} elements, 2^31 = {2**31:.3g}), other slots NaN; "
          f"{B} requests x {L} tokens on slots {slots[0]}..{slots[-1]} ({dtype}): first element of slot "
          f"{slots[-1]} at {slots[-1] * HV * V * K:.4g}")  # fmt: skip
    o, _, _ = chunk_gated_delta_rule(
        q[None].to(dev), k[None].to(dev), v[None].to(dev), gate[None].to(dev), beta[None].to(dev), scale=scale,
        initial_state=pool, initial_state_indices=idx, cu_seqlens=cu.to(dev, torch.int32),
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    if pool.is_cuda:
        torch.cuda.synchronize(pool.device)
    eo = (o[0].double().cpu() - o_ref).abs().max().item()  # NaN when any is NaN
    eh = (pool[slots].double().cpu() - h_ref).abs().max().item()
    tol_o, tol_h = 2**-5 * o_ref.abs().max().item(), 2**-5 * h_ref.abs().max().item()
    ok = eo <= tol_o and eh <= tol_h
    print(f"{args.run}: max|o - ref| {eo:.3g} (tol {tol_o:.3g}), max|final state - ref| {eh:.3g} (tol {tol_h:.3g}): "
          + ("right" if ok else "WRONG"))  # fmt: skip
    return 0 if ok else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.run:
        try:
            return run_one(args)
        except Exception as e:  # an illegal memory access surfaces here (or at the next CUDA call)
            msg = (str(e).splitlines() or [type(e).__name__])[0]
            if "out of memory" in msg or not any(w in msg for w in ("CUDA", "cuda", "illegal", "Triton Error")):
                raise  # not the finding: the parent reports "could not run"
            print(f"{args.run}: CUDA error: {msg}")
            return 2
    import subprocess

    print(versions())
    verdict = {}
    for where, dtype in RUNS:
        name = f"{where}-{dtype}"
        cmd = [sys.executable, __file__, "--device", args.device, "--slots", str(args.slots), "--batch",
               str(args.batch), "--tokens", str(args.tokens), "--run", name]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        out = (r.stdout + r.stderr).strip().splitlines()
        print("\n".join(line for line in out if "Warning" not in line and line.strip()))
        verdict[name] = {0: "right", 1: "wrong", 2: "crash"}.get(r.returncode, f"could not run (exit {r.returncode})")
        print(f"-> slots at the pool's {where}, {dtype}: {verdict[name]}")
    if any(v.startswith("could not run") for v in verdict.values()) or verdict["start-int64"] != "right":
        print("CANNOT RUN: a child did not reach a verdict, or the control (slots at the pool's start) is not right")
        return 3
    if verdict["end-int32"] != "right" or verdict["end-int64"] != "right":
        print(f"FINDING PRESENT: slots past 2^31 elements: int32 {verdict['end-int32']}, int64 "
              f"{verdict['end-int64']} (the kernel casts the slot to int32 before slot * stride)")  # fmt: skip
        return 1
    print("FIXED: slots past 2^31 elements are addressed right")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a crash is not the finding: exit 3, so 1 always means "still there"
        import traceback

        traceback.print_exc()
        sys.exit(3)
