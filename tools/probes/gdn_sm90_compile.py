"""Cross-compile every GDN Triton kernel for sm_90 (Hopper) on a machine without a GPU.

Run by tests/kernels/triton/test_gdn_triton_compile.py in a subprocess without TRITON_INTERPRET (the interpreter
accepts code that the compiler rejects, e.g. non-constexpr globals). Lowers each kernel's default
configuration through TTIR, TTGIR, LLVM IR, PTX and ptxas to a cubin, and prints the register and
stack (spill) use of each, one line per kernel: `name regs stack`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.autotuner import Autotuner

from attnbench.kernels.triton import gdn, gdn_chunk, gdn_conv, gdn_decode_stream, gdn_decode_vk

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def build(
    kernel, sig: dict, consts: dict, config: triton.Config | None = None, num_warps: int = 4, label: str = ""
) -> None:
    if isinstance(kernel, Autotuner):
        config = config or kernel.configs[0]
        kernel = kernel.fn
    opts = {
        "num_warps": config.num_warps if config else num_warps,
        "num_stages": config.num_stages if config else 2,
    }
    if config is not None and config.maxnreg:
        opts["maxnreg"] = config.maxnreg
    consts = {**consts, **(config.kwargs if config else {})}
    signature = {n: ("constexpr" if n in consts else sig[n]) for n in kernel.arg_names}
    # as a launch specialises them: tensors are 16-byte aligned
    pointers = [i for i, n in enumerate(kernel.arg_names) if signature[n].startswith("*")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in pointers}
    source = ASTSource(fn=kernel, signature=signature, constexprs=consts, attrs=attrs)
    compiled = triton.compile(source, target=TARGET, options=opts)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    print(kernel.__name__ + label, *(m.groups() if m else ("?", "?")), flush=True)


def main() -> None:
    bf, f32, i32 = "*bf16", "*fp32", "*i32"
    qwen = dict(H=16, HV=32, K=128, V=128)
    build(
        gdn._gdn_gating_kernel,
        dict(A_log=f32, a=bf, b=bf, dt_bias=bf, g=f32, beta=f32, N="i32"),
        dict(HV=32, BLOCK=1024),
    )
    rsig = dict(
        q=bf,
        k=bf,
        v=bf,
        a=bf,
        b=bf,
        A_log=f32,
        dt_bias=bf,
        pool=f32,
        indices=i32,
        o=bf,
        inter=f32,
        parents=i32,
        stride_qt="i32",
        stride_qh="i32",
        stride_kt="i32",
        stride_kh="i32",
        stride_vt="i32",
        stride_vh="i32",
        scale="fp32",
        B_KEY="i32",
    )
    rconst = dict(**qwen, BK=128, DT=tl.bfloat16, EMULATE=False)
    build(
        gdn._gdn_recurrent_kernel,
        rsig,
        dict(rconst, T=1, WRITE_POOL=True, STORE_INTER=False, USE_PARENTS=False, POOL_VK=False),
    )
    build(
        gdn._gdn_recurrent_kernel,
        rsig,
        dict(rconst, T=8, WRITE_POOL=False, STORE_INTER=True, USE_PARENTS=True, POOL_VK=False),
    )
    build(  # verify on a K-last pool (gdn_layout=vk)
        gdn._gdn_recurrent_kernel,
        rsig,
        dict(rconst, T=8, WRITE_POOL=False, STORE_INTER=True, USE_PARENTS=True, POOL_VK=True),
        label="[vk]",
    )
    ssig = {n: t for n, t in rsig.items() if n not in ("inter", "parents", "B_KEY")}
    for cols, bv, warps in ((128, 16, 4), (128, 32, 4), (64, 16, 2), (128, 8, 1)):
        build(
            gdn_decode_stream._gdn_decode_stream_kernel,
            ssig,
            dict(rconst, BV=bv, COLS=cols),
            num_warps=warps,
            label=f"[cols{cols},bv{bv},w{warps}]",
        )
    for bv, warps in ((16, 4), (8, 4), (32, 4), (16, 2), (8, 1), (16, 1)):
        build(
            gdn_decode_vk._gdn_decode_vk_kernel, ssig, dict(rconst, BV=bv), num_warps=warps, label=f"[bv{bv},w{warps}]"
        )
    csig = dict(
        x=bf,
        weight=bf,
        bias=bf,
        states=bf,
        cache_indices=i32,
        has_initial_state="*i1",
        query_start_loc=i32,
        y=bf,
        D="i32",
    )
    build(gdn_conv._conv1d_prefill_kernel, csig, dict(W=4, BT=32, BD=64, DT=tl.bfloat16, EMULATE=False))
    build(
        gdn_conv._conv1d_update_kernel,
        {k: v for k, v in csig.items() if k in ("x", "weight", "bias", "states", "cache_indices", "y", "D")},
        dict(W=4, BD=256, DT=tl.bfloat16, EMULATE=False),
    )
    for DT, p, ieee in ((tl.bfloat16, bf, False), (tl.float32, f32, True)):
        gam = "*fp64" if ieee else f32  # gdn_chunk.gamma_dtype
        common = dict(**qwen, C=64, BK=128, DT=DT, EMULATE=False, IEEE=ieee)
        chunked = dict(chunks=i32, cu_seqlens=i32)
        build(gdn_chunk._chunk_cumsum_kernel, dict(g=f32, gcum=gam, **chunked), dict(HV=32, C=64))
        tri = gdn_chunk.TRI_IEEE if ieee else gdn_chunk.TRI
        build_tri(tri, p, common, gcum=gam)
        build(
            gdn_chunk._chunk_wu_kernel,
            dict(khat=p, v=p, beta=f32, gcum=gam, tmat=p, w=p, u=p, stride_vt="i32", **chunked),
            dict(common, BV=64),
            num_warps=8,
        )
        build(
            gdn_chunk._chunk_state_kernel,
            dict(
                khat=p,
                gcum=gam,
                w=p,
                u=p,
                h=p,
                vnew=p,
                pool=f32,
                indices=i32,
                has_initial_state="*i1",
                cu_seqlens=i32,
                chunk_offsets=i32,
                B_KEY="i32",
            ),
            dict(common, HVG=32, POOL_VK=False),
        )
        build(
            gdn_chunk._chunk_state_regs_kernel,
            dict(
                khat=p, gcum=gam, w=p, u=p, h=p, vnew=p, pool=f32, indices=i32, has_initial_state="*i1",
                cu_seqlens=i32, chunk_offsets=i32, B_KEY="i32",
            ),
            dict(common, HVG=32, POOL_VK=True),
        )  # fmt: skip
        build(
            gdn_chunk.OUT_TUNED[""],
            dict(q=p, khat=p, gcum=gam, h=p, vnew=p, o=p, stride_qt="i32", scale="fp32", ROWS_KEY="i32", **chunked),
            common,
        )
        build(
            gdn_chunk._chunk_state_out_kernel,
            STATE_OUT_SIG(p, gam),
            common | dict(QK_IN_LOOP=False, WU_IN_LOOP=False, POOL_VK=False),
        )  # fmt: skip
    # the T kernel's other variants (TriConfig kk / diag), bf16
    common = dict(**qwen, C=64, BK=128, DT=tl.bfloat16, EMULATE=False, IEEE=False)
    for kk, diag in (("blocks", "neumann"), ("blocks", "subst"), ("once", "subst")):
        build_tri(gdn_chunk.TriConfig(kk=kk, diag=diag), bf, common, label=f"[{kk},{diag}]")
    build_tri(gdn_chunk.TRI, bf, common, label="[fuse_out]", fuse_out=True)
    build_tri(gdn_chunk.TriConfig(wu=True), bf, common, label="[wu]")
    build_tri(gdn_chunk.TriConfig(), bf, common, label="[uncapped]")  # the default before session 28
    # the output kernel's 128 columns in two blocks of 64 under maxnreg=168 (one of its tuner's configs)
    wide = next(c for c in gdn_chunk.OUT_TUNED[""].configs if c.maxnreg)
    build(
        gdn_chunk.OUT_TUNED[""],
        dict(q=bf, khat=bf, gcum="*fp32", h=bf, vnew=bf, o=bf, chunks="*i32", cu_seqlens="*i32", stride_qt="i32",
             scale="fp32", ROWS_KEY="i32"),
        common,
        config=wide,
        label="[bvi64,maxnreg]",
    )  # fmt: skip
    sig = STATE_OUT_SIG(bf)
    build(
        gdn_chunk._chunk_state_out_kernel,
        sig,
        common | dict(QK_IN_LOOP=True, WU_IN_LOOP=False, POOL_VK=False),
        label="[loop]",
    )
    build(
        gdn_chunk._chunk_state_out_kernel,
        sig,
        common | dict(QK_IN_LOOP=True, WU_IN_LOOP=True, POOL_VK=False),
        label="[wu]",
    )


def STATE_OUT_SIG(p: str, gcum: str = "*fp32") -> dict:  # noqa: N802 (a signature table)
    f32, i32 = "*fp32", "*i32"
    return dict(
        q=p, qhat=p, khat=p, amat=p, gcum=gcum, w=p, u=p, o=p, pool=f32, indices=i32, has_initial_state="*i1",
        cu_seqlens=i32, stride_qt="i32", scale="fp32", B_KEY="i32", v=p, beta=f32, tmat=p, stride_vt="i32",
    )  # fmt: skip


def build_tri(tri, p: str, common: dict, label: str = "", fuse_out: bool = False, gcum: str = "*fp32") -> None:
    f32, i32 = "*fp32", "*i32"
    build(
        gdn_chunk._chunk_tri_batched_kernel,
        dict(k=p, beta=f32, gcum=gcum, tmat=p, khat=p, stride_kt="i32", chunks=i32, cu_seqlens=i32)
        | dict(q=p, qhat=p, amat=p, v=p, w=p, u=p, stride_qt="i32", stride_vt="i32", scale="fp32"),
        common
        | dict(S=16, BV=64, P_NEU=tri.neumann, P_NEWTON=tri.newton, P_MERGE=tri.merge)
        | dict(KK_ONCE=tri.kk == "once", SUBST=tri.diag == "subst", FUSE_OUT=fuse_out, WU=tri.wu),
        config=triton.Config({}, num_warps=tri.num_warps, num_stages=2, maxnreg=tri.maxnreg),
        label=label,
    )


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        sys.exit("run without TRITON_INTERPRET")
    main()
