"""Time the variants of the GDN T kernel (`gdn_chunk.TRI` knobs) on the Qwen-size extend case (GPU only).

For each variant: the T kernel alone (`launch_tri`, CUDA events around 50 back-to-back calls after 5
warm-up calls) and the whole gdn_extend call, in µs, plus max |T - T0| and max |o - o0| against the
first variant, the kernel on main (sixteen 16 x 16 blocks, IEEE float32 dots, 4 warps). Accuracy
against float64 is what tests/kernels/test_gdn_gpu.py checks (set gdn_chunk.TRI to the winner first);
tools/probes/gdn_tri_numerics.py gives the CPU emulation of each precision's error.

    python tools/bench/gdn_tri_bench.py [case id]
"""

from __future__ import annotations

import sys

import torch

from attnbench.backend import get_backend, load_builtin
from attnbench.case import Case
from attnbench.kernels.triton import gdn_chunk
from helpers import cuda_mean_us

CASE = "gdn_extend/b1-t32768-h32x32-d128x128-bf16"
X3 = "tf32x3"


def tri(batched: bool, warps: int, neumann: str, newton: str, merge: str) -> dict:
    return dict(batched=batched, num_warps=warps, neumann=neumann, newton=newton, merge=merge)


VARIANTS = {
    "main: 16 blocks, ieee, 4w": tri(False, 4, "ieee", "ieee", "ieee"),
    "16 blocks, tf32x3, 4w": tri(False, 4, X3, X3, X3),
    "16 blocks, tf32x3, 8w": tri(False, 8, X3, X3, X3),
    "16 blocks, tf32x3, 2w": tri(False, 2, X3, X3, X3),
    "batched, ieee, 4w": tri(True, 4, "ieee", "ieee", "ieee"),
    "batched, tf32x3, 4w (default)": tri(True, 4, X3, X3, X3),
    "batched, tf32x3, 8w": tri(True, 8, X3, X3, X3),
    "batched, tf32x3, 2w": tri(True, 2, X3, X3, X3),
    "batched, ieee, 8w": tri(True, 8, "ieee", "ieee", "ieee"),
    "batched, neumann tf32 + tf32x3, 4w": tri(True, 4, "tf32", X3, X3),
    # less accurate than the float32 twin (tools/probes/gdn_tri_numerics.py): for the record, not a candidate
    "batched, tf32 everywhere, 4w (inaccurate)": tri(True, 4, "tf32", "tf32", "tf32"),
}


def main(argv: list[str]) -> int:
    load_builtin()
    print(torch.cuda.get_device_name(), flush=True)
    case = Case.from_id(argv[0] if argv else CASE, "cuda")
    x = case.make_inputs()
    pool0 = x.state_pool.clone()
    run = get_backend("triton").prepare(case, x)  # the whole gdn_extend call; reads gdn_chunk.TRI per call
    # a plan of our own for the T kernel alone: one full call fills its gcum
    H, K, HV, V = x.q.shape[1], x.q.shape[2], x.v.shape[1], x.v.shape[2]
    p = gdn_chunk.plan(list(x.lens_host), H, HV, K, V, x.q.dtype, x.q.device)
    o = torch.empty_like(x.o)
    gdn_chunk.chunk_gated_delta_rule(
        x.q, x.k, x.v, x.g, x.beta, pool0.clone(), x.state_indices, x.has_initial_state, x.cu_seqlens, o, p,
        scale=x.scale,
    )  # fmt: skip
    saved = dict(gdn_chunk.TRI)
    t_ref = o_ref = None
    try:
        for label, knobs in VARIANTS.items():
            try:
                gdn_chunk.TRI.clear()
                gdn_chunk.TRI.update(knobs)
                x.state_pool.copy_(pool0)
                run()
                torch.cuda.synchronize()
                out = x.o.float().clone()
                gdn_chunk.launch_tri(x.k, x.beta, x.cu_seqlens, p, knobs)
                torch.cuda.synchronize()
                tm = p.tmat.float().clone()
                t_ref = tm if t_ref is None else t_ref
                o_ref = out if o_ref is None else o_ref
                us_tri = cuda_mean_us(lambda: gdn_chunk.launch_tri(x.k, x.beta, x.cu_seqlens, p, knobs))  # noqa: B023
                us_all = cuda_mean_us(run)
                print(f"{label:44s} T kernel {us_tri:8.1f} us  extend {us_all:8.1f} us  "
                      f"max|T - T0| {(tm - t_ref).abs().max().item():.2e}  "
                      f"max|o - o0| {(out - o_ref).abs().max().item():.2e}", flush=True)  # fmt: skip
            except Exception as e:  # a variant that fails to compile or run is reported, the others still run
                print(f"{label}: {type(e).__name__}: {e}", flush=True)
    finally:
        gdn_chunk.TRI.clear()
        gdn_chunk.TRI.update(saved)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
