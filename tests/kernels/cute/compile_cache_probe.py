"""Run by test_cute_compile_cache.py in a fresh process: compile (or load) our CuTe decode (two
functions) and GDN decode (one) for sm_90a through `cached_compile`, with fake tensors as
tools/probes/cute_sm90_compile.py makes them, and print one JSON line per kernel: how it was obtained,
seconds, the type of what came back. Needs nvidia-cutlass-dsl and apache-tvm-ffi; no GPU."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_tensor  # noqa: E402
from cutlass.cute.typing import sym_int32, sym_int64  # noqa: E402

from attnbench.kernels.cute import decode, decode_plan, gdn_decode  # noqa: E402
from attnbench.kernels.cute.common import cached_compile  # noqa: E402

F32, I32, BF16 = cutlass.Float32, cutlass.Int32, cutlass.BFloat16
BUILDS = []  # which builds ran in this process


def fake(dtype, shape, align=None):
    shape = tuple(sym_int32() if s is None else s for s in shape)
    stride = tuple(sym_int64() for _ in shape[:-1]) + (1,)
    return make_fake_tensor(dtype, shape, stride, assumed_align=align)


def decode_fns(HB=8, G=16, D=64, PAGE=1, HKV=1, scale=0.125, cap=0.0, sinks=True):
    q_mul, post_mul = decode_plan.score_multipliers(scale, cap)
    vpl, U, pipe, stages = decode_plan.schedule(HB)
    static = (HB, G, D, PAGE, HKV, q_mul, post_mul, cap > 0, sinks, U, pipe, decode_plan.DEFAULT.min_ctas, vpl, stages)

    def build():
        BUILDS.append("decode")
        split_launch, merge_launch = decode._build(*static)
        kv = [make_fake_compact_tensor(BF16, (sym_int32(), PAGE, HKV, D), stride_order=(3, 2, 1, 0), assumed_align=16)
              for _ in range(2)]  # fmt: skip
        args = [fake(BF16, (None, None, D), 16), *kv, fake(I32, (None,)), fake(I32, (None,)), fake(I32, (None, 4)),
                fake(F32, (None,)), fake(BF16, (None, None, D)), fake(F32, (None, None)), fake(F32, (None, None, D)),
                fake(F32, (None, None))]  # fmt: skip
        split = cute.compile(split_launch, *args, cuda.CUstream(0), options="--enable-tvm-ffi")
        margs = [fake(I32, (None, 3)), fake(F32, (None,)), fake(F32, (None, None, D)), fake(F32, (None, None)),
                 fake(BF16, (None, None, D)), fake(F32, (None, None))]  # fmt: skip
        return split, cute.compile(merge_launch, *margs, cuda.CUstream(0), options="--enable-tvm-ffi")

    return cached_compile(("decode", "bf16", True, *static), build)


def gdn_fn(bv=32):
    def build():
        BUILDS.append("gdn")
        args = [fake(BF16, (None, 32, 128)), fake(BF16, (None, 32, 128)), fake(BF16, (None, 32, 128)),
                fake(BF16, (None, 32)), fake(BF16, (None, 32)), fake(F32, (32,)), fake(BF16, (32,)),
                fake(F32, (None, 32, 128, 128), 16), fake(I32, (None,)), fake(BF16, (None, 32, 128))]  # fmt: skip
        return cute.compile(gdn_decode._build(bv), *args, scale=0.0884, H=32, HV=32, K=128, V=128,
                            stream=cuda.CUstream(0), options="--enable-tvm-ffi")  # fmt: skip

    return cached_compile(("gdn_decode", "bf16", bv), build)


if __name__ == "__main__":
    for name, get in (("decode", decode_fns), ("gdn", gdn_fn)):
        if name in sys.argv[1:] or len(sys.argv) == 1:
            fn, spent, how = get()
            fns = fn if isinstance(fn, tuple) else (fn,)
            print(json.dumps({"kernel": name, "how": how, "s": spent, "types": [type(f).__name__ for f in fns],
                              "builds": list(BUILDS)}), flush=True)  # fmt: skip
