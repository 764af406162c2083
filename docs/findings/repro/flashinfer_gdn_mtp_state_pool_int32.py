"""FlashInfer gated_delta_rule_mtp addresses its state pool with a 32-bit slot offset: int32 slots past
2^31 elements read the wrong memory.

The MTP verify kernels (flashinfer/gdn_kernels/gdn_decode_mtp.py, `gdn_verify_kernel_mtp` and
`gdn_verify_kernel_mtp_inline`) take `cache_idx = h0_indices[i_n]` in the indices' dtype and index the
flattened pool `h0_source [pool * HV, V, K]` at `flat_state_idx = cache_idx * HV + i_hv`, so the element
offset `flat_state_idx * V * K` is 32-bit with int32 indices. With 32 heads of 128 x 128 fp32 it passes
2^31 at slot 4096. The one-token decode (`gated_delta_rule_decode_pretranspose`) widens the index to
Int64 first (PR #3230) and the MTP kernel's per-token scatter path does too (`fla_idx`), but the verify's
read (and write-back) views do not. SGLang's server passes int32 mamba slot indices.

A few requests verify T draft tokens from the last slots of a 4224-slot pool (8.9 GB; the slots before them
NaN, so a read of a wrong slot there shows), once with int32 and once with int64 slot indices, each in a
subprocess (an illegal memory access poisons the CUDA context), against a float64 chain-verify reference of
o and the intermediate states. --batch above 128 // HV runs the warp-specialized kernel, at or below it
the inline one. Standalone: torch + flashinfer (SM90+), a GPU with 10 GB free. Exit 1 while the int32
run crashes or is wrong, 0 once it passes, 3 when it cannot run.
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
    p.add_argument("--batch", type=int, default=8, help="requests, on the last slots (8 x 32 heads: warp kernel)")
    p.add_argument("--tokens", type=int, default=4, help="draft tokens T")
    p.add_argument("--index-dtype", choices=("int32", "int64"), help="run one dtype in this process (the child)")
    return p.parse_args(argv)


def versions():
    return f"torch {torch.__version__}, flashinfer {importlib.metadata.version('flashinfer-python')}"


def reference(q, k, v, h0, A_log, a, dt_bias, b, scale):
    """float64 chain verify from h0 [B, HV, V, K] (state[v, k]); returns o [B, T, HV, V] and the state
    after each token [B, T, HV, V, K]."""
    B, T, H, _ = q.shape
    rep = v.shape[2] // H
    h = h0.double().clone()
    o, hs = [], []
    for t in range(T):
        qt = torch.nn.functional.normalize(q[:, t].double(), dim=-1).repeat_interleave(rep, 1) * scale
        kt = torch.nn.functional.normalize(k[:, t].double(), dim=-1).repeat_interleave(rep, 1)
        x = a[:, t].double() + dt_bias.double()
        g = -A_log.double().exp() * torch.where(x > 20, x, torch.log1p(torch.exp(x.clamp(max=20))))
        h = h * g.exp()[..., None, None]
        u = (v[:, t].double() - torch.einsum("bhvk,bhk->bhv", h, kt)) * torch.sigmoid(b[:, t].double())[..., None]
        h = h + u[..., None] * kt[..., None, :]
        o.append(torch.einsum("bhvk,bhk->bhv", h, qt))
        hs.append(h.clone())
    return torch.stack(o, 1), torch.stack(hs, 1)


def run_one(args) -> int:
    """The child: one verify with `args.index_dtype` slots; 0 right, 1 wrong (a CUDA error exits 2)."""
    from flashinfer.gdn_decode import gated_delta_rule_mtp

    dev, B, T, N = args.device, args.batch, args.tokens, args.slots
    H, HV, K, V = 16, 32, 128, 128
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, H, K, generator=g).to(torch.bfloat16)
    k = torch.randn(B, T, H, K, generator=g).to(torch.bfloat16)
    v = torch.randn(B, T, HV, V, generator=g).to(torch.bfloat16)
    a = torch.randn(B, T, HV, generator=g).to(torch.bfloat16)
    b = torch.randn(B, T, HV, generator=g).to(torch.bfloat16)
    A_log = torch.randn(HV, generator=g) * 0.5
    dt_bias = torch.randn(HV, generator=g) * 0.5
    h0 = torch.randn(B, HV, V, K, generator=g) * 0.3
    slots = list(range(N - B, N))
    scale = K**-0.5
    o_ref, h_ref = reference(q, k, v, h0, A_log, a, dt_bias, b, scale)
    pool = torch.full((N, HV, V, K), float("nan"), dtype=torch.float32, device=dev)  # [pool, HV, V, K], K-last
    pool[slots] = h0.to(dev)
    d = {n: t.to(dev) for n, t in dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias).items()}
    idx = torch.tensor(slots, dtype=getattr(torch, args.index_dtype), device=dev)
    out = torch.full((B, T, HV, V), float("nan"), dtype=torch.bfloat16, device=dev)
    inter = torch.full((B, T, HV, V, K), float("nan"), dtype=torch.float32, device=dev)
    kernel = "gdn_verify_kernel_mtp_inline" if B * HV <= 128 else "gdn_verify_kernel_mtp (warp-specialized)"
    print(f"pool {tuple(pool.shape)} fp32 ({pool.numel():.3g} elements, 2^31 = {2**31:.3g}), spare slots NaN; "
          f"slots {slots[0]}..{slots[-1]} {args.index_dtype}: first element of slot {slots[-1]} at "
          f"{slots[-1] * HV * V * K:.4g}; B * HV = {B * HV}: {kernel}")  # fmt: skip
    gated_delta_rule_mtp(
        d["q"], d["k"], d["v"], pool, idx, d["A_log"], d["a"], d["dt_bias"], d["b"], scale=scale, output=out,
        intermediate_states_buffer=inter, disable_state_update=True, use_qk_l2norm=True,
    )  # fmt: skip
    if pool.is_cuda:
        torch.cuda.synchronize(pool.device)
    o, s = out.double().cpu(), inter.double().cpu()
    eo, eh = (o - o_ref).abs().max().item(), (s - h_ref).abs().max().item()  # NaN when any is NaN
    tol_o, tol_h = 2**-6 * o_ref.abs().max().item(), 1e-4 * h_ref.abs().max().item()
    ok = eo <= tol_o and eh <= tol_h
    print(f"{args.index_dtype}: max|o - ref| {eo:.3g} (tol {tol_o:.3g}; NaN items "
          f"{int(torch.isnan(o).any(-1).sum())} of {B * T * HV}), max|intermediate state - ref| {eh:.3g} "
          f"(tol {tol_h:.3g}): " + ("right" if ok else "WRONG"))  # fmt: skip
    return 0 if ok else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.index_dtype:
        try:
            return run_one(args)
        except Exception as e:  # an illegal memory access surfaces here (or at the next CUDA call)
            msg = (str(e).splitlines() or [type(e).__name__])[0]
            if "out of memory" in msg or not any(w in msg for w in ("CUDA", "cuda", "illegal", "Triton Error")):
                raise  # not the finding: the parent reports "could not run"
            print(f"{args.index_dtype}: CUDA error: {msg}")
            return 2
    import subprocess

    print(versions())
    verdict = {}
    for dtype in ("int32", "int64"):
        cmd = [sys.executable, __file__, "--device", args.device, "--slots", str(args.slots),
               "--batch", str(args.batch), "--tokens", str(args.tokens), "--index-dtype", dtype]  # fmt: skip
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
