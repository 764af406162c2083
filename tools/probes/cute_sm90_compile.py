"""Cross-compile our CuTe DSL kernels for sm_90a on a machine without a GPU and check their code.

Compiles every static configuration below with fake tensors (`cute.runtime.make_fake_tensor`, shapes
and strides dynamic as `common.dynamic` marks them, the K/V cache compact as `common.compact` does),
keeps the PTX and cubin (CUTE_DSL_KEEP), and prints one JSON line per kernel: registers and stack
(cuobjdump -res-usage, when a cuobjdump is found), and how many 128-bit global loads and cp.async
copies its PTX holds. Exit status 1 if a main kernel has no 128-bit loads or spills to the stack.

    CUTE_DSL_ARCH=sm_90a python tools/probes/cute_sm90_compile.py          # needs nvidia-cutlass-dsl, torch
    python tools/probes/cute_sm90_compile.py decode                         # names containing "decode"
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
DUMP = tempfile.mkdtemp(prefix="cute-sm90-")  # the DSL reads its settings once, at import
os.environ["CUTE_DSL_KEEP"] = "ptx,cubin"
os.environ["CUTE_DSL_DUMP_DIR"] = DUMP

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_tensor  # noqa: E402
from cutlass.cute.typing import sym_int32, sym_int64  # noqa: E402

from attnbench.kernels.cute import decode, decode_plan, gdn_decode  # noqa: E402

F32, I32, BF16 = cutlass.Float32, cutlass.Int32, cutlass.BFloat16

# name: (HB, G, D, PAGE, HKV, sm_scale, soft_cap, sinks), as prepare() derives them from a case
DECODE = {
    "decode-gqa4-d128-p16": (4, 4, 128, 16, 8, 0.0884, 0.0, False),  # the speed-target shape
    "decode-mha-d128-p16": (1, 1, 128, 16, 8, 0.0884, 0.0, False),
    "decode-mqa16-d64-p1-sink": (8, 16, 64, 1, 1, 0.125, 0.0, True),
    "decode-gqa4-d64-p16-cap": (4, 4, 64, 16, 2, 0.125, 30.0, False),
    "decode-gqa8-d64-p64-sink": (8, 8, 64, 64, 8, 0.125, 0.0, True),
}
GDN = {"gdn-bv32": 32, "gdn-bv64": 64, "gdn-bv128": 128}


def fake(dtype, shape, align=None):
    """A fake tensor with dynamic extents where `shape` says None and dynamic strides (last one 1)."""
    shape = tuple(sym_int32() if s is None else s for s in shape)
    stride = tuple(sym_int64() for _ in shape[:-1]) + (1,)
    return make_fake_tensor(dtype, shape, stride, assumed_align=align)


def compile_decode(cfg) -> None:
    HB, G, D, PAGE, HKV, scale, cap, sinks = cfg
    q_mul, post_mul = decode_plan.score_multipliers(scale, cap)
    vpl, U, pipe, stages = decode_plan.schedule(HB)
    split_launch, merge_launch = decode._build(
        HB, G, D, PAGE, HKV, q_mul, post_mul, cap > 0, sinks, U, pipe, decode_plan.DEFAULT.min_ctas, vpl, stages
    )
    # the fake cache's stride order counts from the innermost mode: (3, 2, 1, 0) is row-major
    kv = [make_fake_compact_tensor(BF16, (sym_int32(), PAGE, HKV, D), stride_order=(3, 2, 1, 0), assumed_align=16)
          for _ in range(2)]  # fmt: skip
    args = [fake(BF16, (None, None, D), 16), *kv, fake(I32, (None,)), fake(I32, (None,)), fake(I32, (None, 4)),
            fake(F32, (None,)), fake(BF16, (None, None, D)), fake(F32, (None, None)), fake(F32, (None, None, D)),
            fake(F32, (None, None))]  # fmt: skip
    stream = cuda.CUstream(0)
    cute.compile(split_launch, *args, stream, options="--enable-tvm-ffi")
    margs = [fake(I32, (None, 3)), fake(F32, (None,)), fake(F32, (None, None, D)), fake(F32, (None, None)),
             fake(BF16, (None, None, D)), fake(F32, (None, None))]  # fmt: skip
    cute.compile(merge_launch, *margs, stream, options="--enable-tvm-ffi")


def compile_gdn(bv: int) -> None:
    launch = gdn_decode._build(bv)
    args = [fake(BF16, (None, 32, 128)), fake(BF16, (None, 32, 128)), fake(BF16, (None, 32, 128)),
            fake(BF16, (None, 32)), fake(BF16, (None, 32)), fake(F32, (32,)), fake(BF16, (32,)),
            fake(F32, (None, 32, 128, 128), 16), fake(I32, (None,)), fake(BF16, (None, 32, 128))]  # fmt: skip
    cute.compile(launch, *args, scale=0.0884, H=32, HV=32, K=128, V=128, stream=cuda.CUstream(0),
                 options="--enable-tvm-ffi")  # fmt: skip


def cuobjdump() -> str | None:
    """A cuobjdump: $CUOBJDUMP, the one bundled with triton, or one on PATH."""
    if os.environ.get("CUOBJDUMP"):
        return os.environ["CUOBJDUMP"]
    try:
        import triton

        path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        if os.path.exists(path):
            return path
    except ImportError:
        pass
    return shutil.which("cuobjdump")


def report(name: str, ptxs: list[str], tool: str | None) -> list[dict]:
    rows = []
    for ptx in sorted(ptxs):
        text = open(ptx).read()
        kernel = "merge" if "merge_launch" in ptx else "main"
        row = {
            "config": name,
            "kernel": kernel,
            "ld_global_v4": len(re.findall(r"ld\.global(?:\.\w+)*\.v4\.", text)),
            "st_global_v4": len(re.findall(r"st\.global(?:\.\w+)*\.v4\.", text)),
            "cp_async_16": len(re.findall(r"cp\.async\.\w+\.shared\.global \[[^]]+\], \[[^]]+\], 16", text)),
            "regs": None,
            "stack": None,
        }
        cubin = ptx[: -len(".ptx")] + ".cubin"
        if tool and os.path.exists(cubin):
            usage = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True).stdout
            m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
            if m:
                row["regs"], row["stack"] = int(m.group(1)), int(m.group(2))
        rows.append(row)
    return rows


def main(argv: list[str]) -> int:
    tool = cuobjdump()
    jobs = [(n, compile_decode, c) for n, c in DECODE.items()] + [(n, compile_gdn, b) for n, b in GDN.items()]
    bad = []
    for name, fn, cfg in jobs:
        if not all(a in name for a in argv):
            continue
        for f in glob.glob(os.path.join(DUMP, "*")):  # file names repeat across configurations
            os.remove(f)
        fn(cfg)
        for row in report(name, glob.glob(os.path.join(DUMP, "*.ptx")), tool):
            print(json.dumps(row), flush=True)
            if row["kernel"] == "main" and (row["ld_global_v4"] + row["cp_async_16"] == 0 or (row["stack"] or 0) > 0):
                bad.append(name)
    shutil.rmtree(DUMP, ignore_errors=True)
    if bad:
        print(f"no 128-bit loads or spills in: {sorted(set(bad))}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
