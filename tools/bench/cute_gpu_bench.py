"""Time the schedule variants of our CuTe kernels on the two speed-target cases (GPU only).

CUDA events around 50 back-to-back calls after 5 warm-up calls (the 1 GB KV cache and the 512 MB
state pool dwarf the L2, so warm and cold L2 agree). Each variant prints µs, TB/s of its byte model
and the max |o - o of the first variant|. With `--old DIR`, the decode.py / gdn_decode.py in DIR (e.g.
`git show edcbfa0:kernels/cute/decode.py`) are timed first, for a before/after on one GPU.

    python tools/bench/cute_gpu_bench.py [--old DIR] [decode|gdn]
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time

import torch

from attnbench.backend import load_builtin
from attnbench.case import Case
from attnbench.kernels.cute import decode, gdn_decode
from helpers import cuda_mean_us

DECODE_CASE = "decode/b64-l4096-h32x8-d128-p16-bf16"
GDN_CASE = "gdn_decode/b256-h32x32-d128x128-bf16"
# label: module settings (decode.schedule reads them at prepare time; they are in the compile key)
DECODE_VARIANTS = {
    "vpl2 u2 s4 (default)": {},
    "vpl1 u4 s4": {"VECS_PER_LANE": 1},
    "vpl1 u4 s3 minctas4": {"VECS_PER_LANE": 1, "ASYNC_STAGES": 3, "MIN_CTAS": 4},
    "vpl2 u1 s4": {"UNROLL": 1},
    "vpl2 u2 s2": {"ASYNC_STAGES": 2},
    "vpl1 u4 registers": {"ASYNC_STAGES": 0, "PIPELINE": False, "VECS_PER_LANE": 1},
    "default, 4 CTAs/SM plan, min split 512": {"CTAS_PER_SM": 4, "MIN_SPLIT": 512},
}
GDN_VARIANTS = {"bv32 (default)": 32, "bv64": 64, "bv128": 128}


def load_old(folder: str, name: str):
    spec = importlib.util.spec_from_file_location(f"old_{name}", os.path.join(folder, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench_decode(old: str | None) -> None:
    case = Case.from_id(DECODE_CASE, "cuda")
    x = case.make_inputs()
    nbytes = x.k_cache.element_size() * 2 * sum(x.seq_lens_host) * x.k_cache.shape[2] * x.k_cache.shape[3]
    runs = ([("old", load_old(old, "decode"), {})] if old else []) + [
        (label, decode, patch) for label, patch in DECODE_VARIANTS.items()
    ]
    first = None
    for label, mod, patch in runs:
        saved = {k: getattr(mod, k) for k in patch}
        for k, v in patch.items():
            setattr(mod, k, v)
        try:
            t = time.perf_counter()
            run = mod.prepare(case, x)
            run()
            torch.cuda.synchronize()
            prep = time.perf_counter() - t
            o = x.o.float().clone()
            first = o if first is None else first
            us = cuda_mean_us(run)
            print(f"decode {label:40s} {us:8.1f} us {nbytes / us / 1e6:6.2f} TB/s  prepare {prep:5.1f} s  "
                  f"items {run.info.get('work_items')}  max|o - o0| {(o - first).abs().max().item():.2e}",
                  flush=True)  # fmt: skip
        except Exception as e:  # a variant that fails is reported, the others still run
            print(f"decode {label}: {type(e).__name__}: {e}", flush=True)
        finally:
            for k, v in saved.items():
                setattr(mod, k, v)


def bench_gdn(old: str | None) -> None:
    case = Case.from_id(GDN_CASE, "cuda")
    x = case.make_inputs()
    pool0 = x.state_pool.clone()
    B, HV, V = x.v.shape
    nbytes = 2 * B * HV * x.q.shape[2] * V * 4  # the state read and written once
    runs = ([("old", load_old(old, "gdn_decode"), None)] if old else []) + [
        (label, gdn_decode, bv) for label, bv in GDN_VARIANTS.items()
    ]
    first = None
    saved = gdn_decode.BV
    for label, mod, bv in runs:
        try:
            if bv is not None:
                mod.BV = bv
            x.state_pool.copy_(pool0)
            run = mod.prepare(case, x)
            run()
            torch.cuda.synchronize()
            o = x.o.float().clone()
            first = o if first is None else first
            us = cuda_mean_us(run)
            print(f"gdn {label:20s} {us:8.1f} us {nbytes / us / 1e6:6.2f} TB/s  "
                  f"max|o - o0| {(o - first).abs().max().item():.2e}", flush=True)  # fmt: skip
        except Exception as e:
            print(f"gdn {label}: {type(e).__name__}: {e}", flush=True)
        finally:
            gdn_decode.BV = saved


def main(argv: list[str]) -> int:
    old = None
    if "--old" in argv:
        i = argv.index("--old")
        old = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
    load_builtin()
    print(torch.cuda.get_device_name(), flush=True)
    if not argv or "decode" in argv:
        bench_decode(old)
        torch.cuda.empty_cache()
    if not argv or "gdn" in argv:
        bench_gdn(old)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
