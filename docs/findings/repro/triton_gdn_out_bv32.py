"""Triton 3.6 on Hopper: a kernel of three tl.dot (GDN chunk output) reads shared memory out of range with
BV = 32, num_warps = 4, num_stages = 2 ("Invalid __shared__ read of size 1024 bytes" under memcheck).

The kernel is attnbench's chunked gated-delta-rule output kernel, trimmed to its loads and dots: per chunk of
C = 64 tokens, head and BV-wide slice of V,
    A = tril(q^ k^T) * exp(g_t - g_s)  (64 x 64, q^ the L2-normalised q times scale, rounded to bf16),
    o = (q^ * exp(g)) @ h + A @ vn     (64 x 128 @ 128 x BV, 64 x 64 @ 64 x BV; bf16 operands, fp32 sums).
It addresses global memory only through block pointers and has no shared memory of its own: Triton puts the
dot operands there. With BV = 32 the two output dots lower to m64n32k16 wgmma reading B (h, vn) MN-major
from 64-byte-swizzled buffers; 1024 bytes is exactly one such B tile (16 x 32 bf16). The three other configs
(BV = 64 / 4 warps, BV = 128 / 8 and 4 warps) read their MN-major B with a 128-byte swizzle and are clean
(`--sm90` prints each config's wgmma). On an H200 the out-of-range read crashed the kernel ("illegal
address") at T = 32768 and went unnoticed at T = 16384.

Modes:
  python triton_gdn_out_bv32.py           runs the config (default BV=32, 4 warps, 2 stages) and a control
                                          (BV=64) each under `compute-sanitizer --tool memcheck` in a
                                          subprocess; exit 1 while the config has out-of-range shared reads
                                          (or a wrong o, or an illegal address) and the control is clean, 0
                                          when both are clean, 3 when it cannot decide (no compute-sanitizer
                                          and o right, the control not clean, a crash of its own).
  compute-sanitizer --tool memcheck python triton_gdn_out_bv32.py [--bv 64]
                                          one config in this process (detected, or forced by --in-process):
                                          o against float64 and the versions; memcheck prints the reads.
  python triton_gdn_out_bv32.py --sm90    no GPU needed: compiles each config for sm_90 and prints its shared
                                          memory and the wgmma of its PTX (shape, B's major order, swizzle).
Standalone: torch + triton only.
"""

from __future__ import annotations

import argparse
import sys

import torch

CONFIGS = ((32, 4, 2), (64, 4, 2), (128, 8, 2), (128, 4, 2))  # (BV, num_warps, num_stages): 32/4/2 the bad one


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--bv", type=int, default=32, help="output columns per program (32: the bad config)")
    p.add_argument("--warps", type=int, default=4)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--control-bv", type=int, default=64, help="the clean control of the sanitizer mode")
    p.add_argument("--tokens", type=int, default=16384, help="T (one sequence; 32768 crashed on an H200)")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--in-process", action="store_true", help="run the one config here, no sanitizer children")
    p.add_argument("--sm90", action="store_true", help="compile each config for sm_90 on the CPU and report")
    return p.parse_args(argv)


def build_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def chunk_out(q, k, g, h, vn, o, T, scale, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  C: tl.constexpr, BV: tl.constexpr):  # fmt: skip
        i_c, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        bos = i_c * C
        n = tl.minimum(T - bos, C)
        o_t = tl.arange(0, C)
        m_t = o_t < n
        p_q = tl.make_block_ptr(q + (bos * H + i_h) * K, (n, K), (H * K, 1), (0, 0), (C, K), (1, 0))
        p_k = tl.make_block_ptr(k + (bos * H + i_h) * K, (n, K), (H * K, 1), (0, 0), (C, K), (1, 0))
        p_h = tl.make_block_ptr(
            h + (i_c.to(tl.int64) * H + i_h) * K * V, (K, V), (V, 1), (0, i_v * BV), (K, BV), (1, 0)
        )
        p_vn = tl.make_block_ptr(vn + (bos * H + i_h) * V, (n, V), (H * V, 1), (0, i_v * BV), (C, BV), (1, 0))
        p_o = tl.make_block_ptr(o + (bos * H + i_h) * V, (n, V), (H * V, 1), (0, i_v * BV), (C, BV), (1, 0))
        b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        b_q = (b_q / tl.sqrt(tl.sum(b_q * b_q, 1) + 1e-6)[:, None] * scale).to(tl.bfloat16)
        b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
        b_g = tl.load(g + (bos + o_t) * H + i_h, mask=m_t, other=0)
        keep = (o_t[:, None] >= o_t[None, :]) & m_t[:, None] & m_t[None, :]
        b_a = tl.dot(b_q, tl.trans(b_k))
        b_a = tl.where(keep, b_a * tl.exp(tl.where(keep, b_g[:, None] - b_g[None, :], 0.0)), 0.0).to(tl.bfloat16)
        b_qg = (b_q.to(tl.float32) * tl.exp(b_g)[:, None]).to(tl.bfloat16)
        b_h = tl.load(p_h, boundary_check=(0, 1), padding_option="zero")
        b_vn = tl.load(p_vn, boundary_check=(0, 1), padding_option="zero")
        b_o = tl.dot(b_qg, b_h) + tl.dot(b_a, b_vn)
        tl.store(p_o, b_o.to(tl.bfloat16), boundary_check=(0, 1))

    return triton, chunk_out


def versions():
    import triton

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, {name}"


def bf16(x):
    return x.to(torch.bfloat16).double()


def make_inputs(T, H, K=128, V=128, C=64, seed=0):
    """q [T, H, K] raw, k [T, H, K] L2-normalised, g [T, H] in-chunk cumulative log decay (fp32), h [NC, H, K, V]
    the state at each chunk's start, vn [T, H, V]; all bf16 but g."""
    gen = torch.Generator().manual_seed(seed)
    NC = -(-T // C)
    q = torch.randn(T, H, K, generator=gen).to(torch.bfloat16)
    k = torch.nn.functional.normalize(torch.randn(T, H, K, generator=gen), dim=-1).to(torch.bfloat16)
    step = -0.05 * torch.rand(NC * C, H, generator=gen)
    g = step.view(NC, C, H).cumsum(1).view(NC * C, H)[:T].contiguous()
    h = (0.1 * torch.randn(NC, H, K, V, generator=gen)).to(torch.bfloat16)
    vn = torch.randn(T, H, V, generator=gen).to(torch.bfloat16)
    return q, k, g, h, vn


def reference(q, k, g, h, vn, scale, C=64):
    """float64 o [T, H, V] of the kernel's math with its rounding points (q^, A and q^ exp(g) rounded to bf16),
    and the per-element error bound: 2^-7 (|q^ e^g| |h| + |A| |vn|) + 2^-8 |o| (a 1-ulp flip of a rounded
    operand, and o's own rounding)."""
    T, H, K = q.shape
    NC = h.shape[0]
    pad = NC * C - T

    def chunks(x):
        return torch.nn.functional.pad(x.double(), (0, 0) * (x.dim() - 2) + (0, 0, 0, pad)).view(NC, C, *x.shape[1:])

    qh = bf16(chunks(q) / (chunks(q).square().sum(-1, keepdim=True) + 1e-6).sqrt() * scale)  # [NC, C, H, K]
    kk, gg, vv = chunks(k), chunks(g), chunks(vn)
    qg = bf16(qh * gg.exp()[..., None])
    causal = torch.ones(C, C, dtype=torch.bool).tril()[None, :, :, None]  # [1, t, s, 1]
    decay = (gg[:, :, None, :] - gg[:, None, :, :]).masked_fill(~causal, 0).exp()  # [NC, t, s, H]
    A = bf16(torch.einsum("cthk,cshk->ctsh", qh, kk) * decay * causal)
    hh = h.double()
    o = torch.einsum("cthk,chkv->cthv", qg, hh) + torch.einsum("ctsh,cshv->cthv", A, vv)
    mag = torch.einsum("cthk,chkv->cthv", qg.abs(), hh.abs()) + torch.einsum("ctsh,cshv->cthv", A.abs(), vv.abs())
    bound = 2**-7 * mag + 2**-8 * o.abs()
    return o.reshape(NC * C, H, -1)[:T], bound.reshape(NC * C, H, -1)[:T]


def run_one(a) -> int:
    """One config in this process: o against float64; 0 right, 1 wrong (a CUDA error raises)."""
    triton, kernel = build_kernel()
    print(versions())
    T, H, K, V, C = a.tokens, a.heads, 128, 128, 64
    scale = K**-0.5
    q, k, g, h, vn = make_inputs(T, H, K, V, C)
    dev = torch.device(a.device)
    o = torch.full((T, H, V), float("nan"), dtype=torch.bfloat16, device=dev)
    grid = (h.shape[0], H, triton.cdiv(V, a.bv))
    print(f"chunk_out: T={T} H={H} K={K} V={V} C={C} bf16, BV={a.bv} num_warps={a.warps} num_stages={a.stages}, "
          f"grid {grid}")  # fmt: skip
    compiled = kernel[grid](
        q.to(dev), k.to(dev), g.to(dev), h.to(dev), vn.to(dev), o, T, scale, H=H, K=K, V=V, C=C, BV=a.bv,
        num_warps=a.warps, num_stages=a.stages,
    )  # fmt: skip
    if o.is_cuda:
        torch.cuda.synchronize(dev)
        print(f"shared memory per program: {compiled.metadata.shared} bytes")
    ref, bound = reference(q, k, g, h, vn, scale, C)
    err = (o.double().cpu() - ref).abs().nan_to_num(float("inf"))
    over = ~(err <= bound)
    worst = int((err - bound).argmax())
    t, hd, v = worst // (H * V), worst // V % H, worst % V
    print(f"expected o[{t}, {hd}, {v}] = {ref[t, hd, v].item():.6g}, actual {o[t, hd, v].item():.6g} "
          f"(bound {bound[t, hd, v].item():.3g}); max |o - ref| {err.max().item():.3g}, "
          f"{int(over.sum())} of {o.numel()} elements over their bound")  # fmt: skip
    if over.any():
        print(f"o WRONG for BV={a.bv} num_warps={a.warps} num_stages={a.stages}")
        return 1
    print(f"o right for BV={a.bv} num_warps={a.warps} num_stages={a.stages} (memcheck, if any, tells the reads)")
    return 0


def under_sanitizer() -> bool:
    """True when compute-sanitizer started this process: it is among the ancestors' programs (directly or
    through its TreeLauncher), or its injection library is preloaded."""
    import os

    marks = ("compute-sanitizer", "TreeLauncher", "libsanitizer")
    env = os.environ.get("LD_PRELOAD", "") + os.environ.get("CUDA_INJECTION64_PATH", "")
    if any(m in env for m in marks):
        return True
    pid = os.getppid()
    for _ in range(8):  # a few generations up, to pid 1
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:  # the program's own name, not its arguments (a
                exe = os.path.basename(f.read().split(b"\0")[0])  # shell whose script names the tool is not it)
            if any(m.encode() in exe for m in marks):
                return True
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


def find_sanitizer():
    import os
    import shutil

    for d in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        cand = os.path.join(d, "bin", "compute-sanitizer")
        if d and os.access(cand, os.X_OK):
            return cand
    return shutil.which("compute-sanitizer")


def sanitized(sanitizer, a, bv, warps, stages) -> tuple[str, int, int]:
    """One config under memcheck in a subprocess: (verdict, invalid shared reads, memcheck errors; -1 unknown)."""
    import os
    import re
    import subprocess

    cmd = [sanitizer, "--tool", "memcheck", "--print-limit", "10", sys.executable, os.path.abspath(__file__),
           "--in-process", "--device", a.device, "--tokens", str(a.tokens), "--heads", str(a.heads),
           "--bv", str(bv), "--warps", str(warps), "--stages", str(stages)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    lines = [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    shared = sum("Invalid __shared__" in x for x in lines)
    summary = next((x for x in reversed(lines) if "ERROR SUMMARY" in x), "========= ERROR SUMMARY: ? (none printed)")
    m = re.search(r"ERROR SUMMARY: (\d+)", summary)
    errors = int(m.group(1)) if m else -1
    shown = [x for x in lines if "Invalid __shared__" in x or "Out-of-range" in x or "Address" in x][:6]
    print(f"--- BV={bv} num_warps={warps} num_stages={stages} under compute-sanitizer --tool memcheck:")
    print("\n".join(x for x in lines if not x.startswith("=========")))
    print("\n".join(shown + [summary]))
    verdict = {0: "right o", 1: "wrong o", 2: "CUDA error"}.get(r.returncode, f"could not run (exit {r.returncode})")
    return verdict, shared, errors


def wgmma_kinds(ptx: str) -> list[str]:
    """The distinct wgmma of a PTX: shape, B's major order (imm-trans-b) and B's swizzle (the descriptor's top
    bits; Triton adds its constant part to the shared address just before each wgmma)."""
    import re

    swizzles, kinds, desc = {1: "128B", 2: "64B", 3: "32B"}, [], 0
    for line in ptx.splitlines():
        m = re.search(r"(?:or|add)\.[bs]64\s+%rd\d+, %rd\d+, (-?\d{12,});", line)
        desc = int(m.group(1)) % 2**64 if m else desc
        m = re.search(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\..*, (\d);", line)
        if m:
            kind = (
                f"{m.group(1)} (B {'MN' if m.group(2) == '1' else 'K'}-major, {swizzles.get(desc >> 62, '?')} swizzle)"
            )
            kinds += [kind] if kind not in kinds else []
    return kinds


def sm90(a) -> int:
    """Compile each config for sm_90 without a GPU: shared bytes and the wgmma of its PTX."""
    import os

    os.environ.pop("TRITON_INTERPRET", None)
    triton, kernel = build_kernel()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    print(f"triton {triton.__version__}, compiled for sm_90 (no GPU), H={a.heads} K=V=128 C=64 bf16")
    sig = dict(q="*bf16", k="*bf16", g="*fp32", h="*bf16", vn="*bf16", o="*bf16", T="i32", scale="fp32")
    for bv, warps, stages in CONFIGS:
        consts = dict(H=a.heads, K=128, V=128, C=64, BV=bv)
        signature = {n: "constexpr" if n in consts else sig[n] for n in kernel.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names) if sig.get(n, "")[:1] == "*"}
        src = ASTSource(fn=kernel, signature=signature, constexprs=consts, attrs=attrs)
        c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
        print(f"BV={bv:3d} num_warps={warps} num_stages={stages}: shared {c.metadata.shared} bytes; wgmma "
              + ", ".join(wgmma_kinds(c.asm["ptx"])))  # fmt: skip
    return 0


def run_caught(a) -> int:
    """run_one, a CUDA error (an illegal address, or memcheck stopping the kernel) printed and returned as 2."""
    try:
        return run_one(a)
    except Exception as e:
        msg = (str(e).splitlines() or [type(e).__name__])[0]
        if "out of memory" in msg or not any(w in msg.lower() for w in ("cuda", "illegal", "launch")):
            raise  # not the finding
        print(f"CUDA error: {msg}")
        return 2


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.sm90:
        return sm90(a)
    if a.in_process or under_sanitizer():
        return run_caught(a)
    sanitizer = find_sanitizer()
    if sanitizer is None:
        print("no compute-sanitizer (CUDA_HOME/bin, /usr/local/cuda/bin, PATH): checking o only")
        rc = run_caught(a)
        if rc:
            print("FINDING PRESENT: " + ("o wrong" if rc == 1 else "a CUDA error"))
            return 1
        print("CANNOT DECIDE: o right; the out-of-range read shows only under compute-sanitizer")
        return 3
    print(versions())
    (bad, n_bad, e_bad), (ctl, n_ctl, e_ctl) = (
        sanitized(sanitizer, a, *cfg) for cfg in ((a.bv, a.warps, a.stages), (a.control_bv, 4, 2))
    )
    print(f"config BV={a.bv}, {a.warps} warps, {a.stages} stages: {bad}, {n_bad} invalid __shared__ reads printed, "
          f"{e_bad} memcheck errors; control BV={a.control_bv}: {ctl}, {n_ctl} invalid __shared__ reads printed, "
          f"{e_ctl} errors")  # fmt: skip
    if ctl != "right o" or e_ctl != 0:
        print("CANNOT DECIDE: the control config is not clean")
        return 3
    if n_bad or e_bad > 0 or bad in ("wrong o", "CUDA error"):
        print("FINDING PRESENT: the config reads shared memory out of range (or gets o wrong); the control is clean")
        return 1
    if bad != "right o" or e_bad < 0:
        print(f"CANNOT DECIDE: the config {bad}")
        return 3
    print("FIXED: both configs are clean under memcheck and o is right")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a crash is not the finding: exit 3, so 1 always means "still there"
        import traceback

        traceback.print_exc()
        sys.exit(3)
