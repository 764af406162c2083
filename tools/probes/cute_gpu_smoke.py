"""GPU smoke run of our CuTe DSL kernels (the `cute` backend): compile every variant, report everything.

For each case: compile + first run through `prepare` (compile seconds), the max abs error of o (and
lse / the state pool) against the torch backend on the same inputs, then the harness verdict against
the float64 reference (`run_case`). A failing variant prints its full traceback and the script goes
on, so one GPU call shows every problem. Exit status 1 if any variant failed.

    python tools/probes/cute_gpu_smoke.py            # all variants
    python tools/probes/cute_gpu_smoke.py gdn        # ids containing "gdn"
"""

from __future__ import annotations

import sys
import time
import traceback

import torch

from attnbench.backend import get_backend, load_builtin
from attnbench.case import Case
from attnbench.run.runner import RunOptions, run_case

DECODE = [
    "decode/b4-l300-h8x8-d128-p16-bf16",  # MHA
    "decode/b3-l1000-mixed-h32x8-d128-p16-bf16",  # GQA, mixed lengths
    "decode/b2-l777-h16x1-d64-p1-fp16",  # MQA, page 1, fp16
    "decode/b2-l5000-h8x2-d128-p64-bf16",  # page 64, several splits
    "decode/b1-l8192-h32x8-d128-p16-bf16",  # many splits + merge
    "decode/b3-l500-h8x2-d64-p16-swa100-bf16",  # window
    "decode/b3-l500-h8x2-d64-p16-cap30-bf16",  # soft cap
    "decode/b3-l3000-h8x2-d128-p16-sink-bf16",  # sinks (split + merge)
    "decode/b16-l4096-mixed-h64x8-d64-p16-swa127-sink-bf16",  # gpt-oss-like
    "decode/b3-l5-h32x8-d128-p16-bf16",  # fewer keys than warps x lane groups: empty warps, masked keys
    "decode/b5-l37-mixed-h16x4-d64-p1-fp16",  # short mixed lengths, D = 64 with 4 heads a CTA
    "decode/b64-l4096-h32x8-d128-p16-bf16",  # the speed-target shape
]
GDN = [
    "gdn_decode/b4-h4x4-d128x128-bf16",
    "gdn_decode/b8-h16x32-d128x128-bf16",
    "gdn_decode/b8-h16x32-d128x128-fp16",
    "gdn_decode/b8-h16x32-d128x128-pad2-packed-bf16",
    "gdn_decode/b256-h32x32-d128x128-bf16",  # the speed-target shape
]


def _clone_inputs(x):
    """A deep copy of an inputs dataclass (tensors cloned), so two backends see the same data."""
    import dataclasses

    vals = {}
    for f in dataclasses.fields(x):
        v = getattr(x, f.name)
        vals[f.name] = v.clone() if isinstance(v, torch.Tensor) else v
    y = type(x)(**vals)
    if getattr(x, "mixed_qkv", None) is not None:  # packed gdn: q/k/v are views of mixed_qkv
        B = x.mixed_qkv.shape[0]
        H, K = x.q.shape[1], x.q.shape[2]
        HV, V = x.v.shape[1], x.v.shape[2]
        y.q = y.mixed_qkv[:, : H * K].view(B, H, K)
        y.k = y.mixed_qkv[:, H * K : 2 * H * K].view(B, H, K)
        y.v = y.mixed_qkv[:, 2 * H * K :].view(B, HV, V)
    return y


def _time(run, n=20) -> float:
    run()
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(n):
        run()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) / n * 1e3  # us


def smoke(case_id: str) -> bool:
    cute, ref = get_backend("cute"), get_backend("torch")
    case = Case.from_id(case_id, "cuda")
    print(f"\n=== {case_id}", flush=True)
    why = cute.supports(case)
    if why:
        print(f"  SKIP: {why}")
        return True
    ok = True
    try:
        x = case.make_inputs()
        xr = _clone_inputs(x)
        t0 = time.perf_counter()
        run = cute.prepare(case, x)
        out = run()
        torch.cuda.synchronize()
        print(f"  prepare+first run {time.perf_counter() - t0:.2f}s  info={getattr(run, 'info', {})}")
        run_ref = ref.prepare(case, xr)
        out_ref = run_ref()
        torch.cuda.synchronize()
        for name in out:
            a, b = out[name].float(), out_ref[name].float()
            err = (a - b).abs().nan_to_num(nan=float("inf")).max().item()
            print(f"  {name}: max |cute - torch| = {err:.3e}  (nan in cute: {int(a.isnan().sum())})")
        if hasattr(x, "state_pool"):
            err = (x.state_pool - xr.state_pool).abs().max().item()
            print(f"  state_pool: max |cute - torch| = {err:.3e}")
        x2 = case.make_inputs()
        print(f"  time ~{_time(cute.prepare(case, x2)):.1f} us/call (warm L2, stream of 20)")
    except Exception:
        ok = False
        print("  ERROR in prepare/run:")
        traceback.print_exc(file=sys.stdout)
    try:
        row = run_case(case, [cute], RunOptions(timing=False))[0]
        print(f"  harness: {row.status}  {row.reason or ''}")
        ok = ok and row.status in ("pass", "skip")
    except Exception:
        ok = False
        traceback.print_exc(file=sys.stdout)
    return ok


def main(argv: list[str]) -> int:
    load_builtin()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; cute: {get_backend('cute').available()}")
    ids = [c for c in DECODE + GDN if all(a in c for a in argv)]
    results = {c: smoke(c) for c in ids}
    print("\n==== summary")
    for c, ok in results.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {c}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
