"""Compile the Triton attention kernels for sm_90 on a machine without a GPU (used by a test).

Usage: `python tools/probes/triton_sm90_compile.py [--ops] [--sass] CASE_ID[@splits=N][@pack=0|1] ...` prints one JSON line per
compiled kernel: case, kernel, shared memory bytes, registers and spill bytes (from the bundled ptxas), or an
error; `--ops` adds `ops`, the static count of each PTX instruction that says how tiles reach the tensor cores
(shared-memory loads and stores, ldmatrix, conversions, byte permutes, mma), over the whole kernel; `--sass`
adds `loop`, the SASS (bundled cuobjdump) of the kernel's longest loop: its instruction count per warp and
iteration and the count of each opcode (`LDS.U8`: byte-wise shared loads; `F2F*`/`F2FP*`: conversions).

Triton compiles for a target without a device when the active driver only answers "which target":
a stand-in driver says sm_90, and `JITFunction.warmup` then runs the whole pipeline (TTIR, TTGIR,
LLVM, PTX, ptxas -> cubin) without launching. This catches what the interpreter cannot: constructs
that do not lower, shared memory over the per-block limit, register spills.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # compile for real, before triton is imported

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402


class _TargetOnlyDriver:
    """Answers the questions compilation asks (target, device, stream) and nothing else."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def is_active(self):
        return True


def _ptxas_stats(ptx: str) -> dict:
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        cmd = [ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull]
        r = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    regs = re.search(r"Used (\d+) registers", r.stderr)
    spill = re.search(r"(\d+) bytes spill stores", r.stderr)
    return {
        "regs": int(regs.group(1)) if regs else None,
        "spill_bytes": int(spill.group(1)) if spill else None,
    }


# PTX opcodes (prefixes) counted by --ops
OPS = (
    "ld.shared",
    "st.shared",
    "ldmatrix",
    "cvt",
    "prmt",
    "lop3",
    "mma",
    "bar.sync",
    "cp.async.c",
    "ld.global",
)


def _ptx_ops(ptx: str) -> dict:
    """Static count of each PTX opcode starting with one of OPS (predicates stripped)."""
    counts: dict[str, int] = {}
    for line in ptx.splitlines():
        m = re.match(r"\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)", line)
        if m and m.group(1).startswith(OPS):
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return dict(sorted(counts.items()))


def _sass_loop(cubin: bytes) -> dict:
    """The longest loop (a backward branch and its target) of the cubin's SASS: instruction count and opcodes."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    code = [
        (int(m.group(1), 16), m.group(2), m.group(3))
        for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", sass)
    ]
    best: list[str] = []
    for addr, op, rest in code:
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) < addr:
            body = [o for a, o, _ in code if int(target.group(1), 16) <= a <= addr]
            best = body if len(body) > len(best) else best
    counts: dict[str, int] = {}
    for o in best:
        counts[o] = counts.get(o, 0) + 1
    return {"instructions": len(best), "ops": dict(sorted(counts.items()))}


def _launches(case_id: str):
    """The launches of a case; extend takes `plan_extend` options after the id: `ID@splits=N` (N forced
    key splits: the split path), `ID@pack=0` or `@pack=1` (GQA packing forced off or on); decode takes
    `MLAConfig` fields for the MLA kernel (`@block_n=64@num_stages=2@use_tma=1`; `@impl=triton` or `@impl=wgmma`:
    another MLA kernel where the warp-specialized Gluon one applies) or `@mla=0` (the
    generic kernel where the backend would take the MLA kernel); other decodes take `DecodeConfig`
    fields over the default config (`@num_warps=2@fp8_dequant=2`: the FP8_DEQUANT mode numbered 2);
    `@fused_merge=1` on either kernel merges the splits inside the split launch (`@pdl=1` on the generic one:
    the merge kernel as a programmatic dependent); extend `@kernel=ws` (`@stages=3`, `@persistent=1`): the
    Gluon prefill."""
    from attnbench.case import Case
    from attnbench.kernels.triton import decode, extend, extend_plan, merge

    case_id, *opts = case_id.split("@")
    kw = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in (o.split("=") for o in opts)}
    if "pack" in kw:
        kw["pack"] = bool(kw["pack"])
    case = Case.from_id(case_id)
    x = case.make_inputs()
    if case.op_name == "decode":  # the MLA kernel where the backend takes it (mla=0: the generic kernel)
        from attnbench.kernels.triton import decode_mla

        default = decode_mla.mla_config(x.q.shape[1], x.k_cache.shape[1], 90)
        if kw.pop("mla", 1) and decode_mla.mla_unsupported(x, default) is None:
            flags = ("use_tma", "warp_specialize", "fused_merge", "pdl")
            cfg = decode_mla.MLAConfig(**(vars(default) | {k: bool(v) if k in flags else v for k, v in kw.items()}))
            plan = decode_mla.plan_mla_decode(x, config=cfg, num_sms=132)
            return decode_mla._launches(x, decode.with_pdl(plan, trigger=False) if cfg.pdl else plan)
    if case.op_name == "decode":
        dq = {v: k for k, v in decode.FP8_DEQUANT.items()}
        kw = {k: dq[v] if k == "fp8_dequant" else v for k, v in kw.items()}  # @fp8_dequant=N: FP8_DEQUANT's Nth
        kw = {k: bool(v) if k in ("fused_merge", "pdl") else v for k, v in kw.items()}
        cfg = decode.DecodeConfig(**(vars(decode.default_decode_config(x)) | kw))
        plan = decode.plan_decode(x, config=cfg)  # @pdl=1: applied here (the CPU device plans no PDL)
        return decode._launches(x, decode.with_pdl(plan) if cfg.pdl else plan)
    if case.op_name == "extend":
        if kw.pop("kernel", None) == "ws":  # the Gluon prefill (prefill_ws.py)
            from attnbench.kernels.triton import prefill_ws

            return prefill_ws.prefill_launches(
                x, prefill_ws.plan_prefill(x), int(kw.pop("stages", 2)), bool(int(kw.pop("persistent", 0)))
            )
        return extend._launches(x, extend_plan.plan_extend(x, **kw))
    return [merge._launch(x.v_a, x.s_a, x.v_b, x.s_b, x.o, x.lse)]


def main(case_ids: list[str]) -> None:
    ops, sass = "--ops" in case_ids, "--sass" in case_ids
    case_ids = [c for c in case_ids if c not in ("--ops", "--sass")]
    driver.set_active(_TargetOnlyDriver(90))
    for cid in case_ids:
        try:
            for fn, grid, args, kwargs in _launches(cid):
                k = fn.warmup(*args, grid=grid, **kwargs)
                row = {"case": cid, "kernel": fn.__name__, "shared": k.metadata.shared}
                row.update(_ptxas_stats(k.asm["ptx"]))
                if ops:
                    row["ops"] = _ptx_ops(k.asm["ptx"])
                if sass:
                    row["loop"] = _sass_loop(k.asm["cubin"])
                print(json.dumps(row), flush=True)
        except Exception as e:
            print(json.dumps({"case": cid, "error": f"{type(e).__name__}: {e}"[:2000]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
