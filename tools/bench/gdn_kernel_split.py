"""Where a gdn_extend call spends its GPU time, kernel by kernel (a diagnosis, like ncu: speed claims
come from `attnbench sweep`). For each backend and case: torch.profiler over 5 calls after 3 warm-up
calls, each kernel's mean device time per call, largest first.

    python tools/bench/gdn_kernel_split.py --plugin tools/bench/gdn_tri_variants.py \
        -b triton -b triton-gdn-tri:once gdn_extend/b1-t32768-h32x32-d128x128-bf16
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from attnbench.backend import all_backends, load_builtin, load_plugin
from attnbench.case import Case


def split(backend, case_id: str, calls: int = 5) -> list[tuple[str, float]]:
    case = Case.from_id(case_id, "cuda")
    x = case.make_inputs()
    run = backend.prepare(case, x)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] += e.device_time_total / calls if hasattr(e, "device_time_total") else e.cuda_time / calls
    return sorted(per.items(), key=lambda kv: -kv[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="+")
    ap.add_argument("-b", "--backend", action="append", required=True)
    ap.add_argument("--plugin", action="append", default=[])
    a = ap.parse_args()
    load_builtin()
    for p in a.plugin:
        load_plugin(p)
    backends = all_backends()
    for case_id in a.cases:
        for name in a.backend:
            rows = split(backends[name], case_id)
            total = sum(t for _, t in rows)
            print(f"== {case_id} {name}: {total:.1f} us of kernels per call")
            for k, t in rows[:8]:
                print(f"   {t:9.1f} us  {k[:90]}")


if __name__ == "__main__":
    main()
