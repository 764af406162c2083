"""GPU experiment: time our Triton extend on the prefill target with launch configs beyond the
autotune candidates (and warp specialisation of the unmasked loop, where Triton supports it), beside FA4."""
import sys, time, torch
from attnbench.backend import load_builtin, get_backend
from attnbench.case import Case
from attnbench.kernels.triton import extend as e

def timeit(run, n=30):
    for _ in range(5): run()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(n): run()
    t1.record(); torch.cuda.synchronize()
    return t0.elapsed_time(t1) / n * 1e3

load_builtin()
for cid in sys.argv[1:] or ["extend/b1-q8192-pre0-h32x8-d128-p16-bf16"]:
    case = Case.from_id(cid, "cuda")
    x = case.make_inputs()
    S, H, D = x.q.shape[0], x.q.shape[1], x.q.shape[2]
    flops = 4 * H * D * S * (S + 1) / 2  # causal
    for name in ("fa4", "triton"):
        try:
            run = get_backend(name).prepare(case, x); out = run()
            if name == "fa4": ref = out["o"].float().clone()
            us = timeit(run); print(f"{cid} {name:8s} {us:8.1f} us {flops/us/1e6:6.1f} TF/s info {getattr(run,'info',{})}", flush=True)
        except Exception as ex:
            print(cid, name, "failed", type(ex).__name__, str(ex)[:200], flush=True)
    C = e.ExtendConfig
    cfgs = [C(128, 64, 8, 3), C(128, 64, 8, 4), C(128, 64, 8, 2), C(128, 128, 8, 2), C(128, 128, 8, 3),
            C(128, 32, 4, 3), C(128, 32, 8, 4), C(64, 64, 4, 3), C(64, 64, 4, 4), C(64, 128, 4, 3), C(128, 64, 4, 3),
            C(256, 64, 16, 3), C(256, 32, 8, 3)]
    fields = getattr(C, "__dataclass_fields__", {})
    if "warp_specialize" in fields:
        cfgs += [C(128, 64, 8, 3, True), C(128, 64, 4, 3, True), C(128, 128, 8, 2, True), C(128, 128, 4, 2, True), C(64, 64, 4, 3, True)]
    for cfg in cfgs:
        try:
            t = time.perf_counter()
            run = e.bind_extend(x, e.plan_extend(x, config=cfg)); out = run(); torch.cuda.synchronize()
            comp = time.perf_counter() - t
            err = (out["o"].float() - ref).abs().max().item()
            us = timeit(run)
            print(f"{cid} {str(cfg):90s} {us:8.1f} us {flops/us/1e6:6.1f} TF/s  compile {comp:4.1f}s  max|o-fa4| {err:.2e}", flush=True)
        except Exception as ex:
            print(cid, cfg, "failed", type(ex).__name__, str(ex).splitlines()[0][:200] if str(ex) else "", flush=True)
