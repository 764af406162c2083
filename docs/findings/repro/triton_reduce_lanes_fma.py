"""Triton: the lanes of one row of `tl.sum(a * b, 1)` hold different values when the first butterfly step
is contracted into an fma — softmax over one key does not return its value.

A [64, 16] bf16 tile whose rows are only 2-byte aligned (odd row stride, 13 valid columns) gets one
column per lane (sizePerThread [1, 1], threadsPerWarp [2, 16]); `tl.sum(q[None, :] * k, 1)` is then a
butterfly over the 16 lanes of a row. On sm_90 (triton 3.6, default enable_fp_fusion) its first step is
`fma.rn.bf16(q_c, k_c, mul.rn.bf16(q_{c^8}, k_{c^8}))` in lane c — lane c^8 computes the mirror image,
rounding the other product — so lanes c and c^8 can end with different sums of the same row. The result
tensor is replicated across those lanes and each lane keeps its own copy: the kernel below (the decode
attention pattern of SGLang's `_fwd_kernel_stage1`, one key per program) takes the row max and the
softmax sum from one lane and column c's weight from lane c, so o[c] = v[c] * exp(s_c - s_0) instead of
v[c]. With enable_fp_fusion=False the first step is mul.rn + add.rn (commutative) and o == v.

Runs `--heads` programs, each one query against one key (13 dims, q.k * scale spread over +-20), and
counts the (program, column) pairs where o != v bit for bit, with fp fusion on (the default) and off.
Exit 1 while fusion on gives o != v somewhere (the finding), 0 when o == v everywhere, 3 on a crash.
"""

from __future__ import annotations

import argparse
import sys

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--heads", type=int, default=4096, help="programs, one (query, key) pair each")
    p.add_argument("--dim", type=int, default=13, help="head dim: odd gives one column per lane")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def build_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def one_key_attention(Q, K, V, O, scale, stride, D: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr):
        h = tl.program_id(0)
        offs_d = tl.arange(0, BD)
        offs_n = tl.arange(0, BN)
        mask_d = offs_d < D
        row = offs_n[:, None] < 1  # one key; the other rows of the tile are masked, as in a decode block
        q = tl.load(Q + h * stride + offs_d, mask=mask_d, other=0.0)
        k = tl.load(K + h * stride + offs_n[:, None] * 0 + offs_d[None, :], mask=row & mask_d[None, :], other=0.0)
        v = tl.load(V + h * stride + offs_n[:, None] * 0 + offs_d[None, :], mask=row & mask_d[None, :], other=0.0)
        s = tl.sum(q[None, :] * k, 1) * scale
        s = tl.where(offs_n < 1, s, float("-inf"))
        p = tl.exp(s - tl.max(s, 0))
        o = tl.sum(p[:, None] * v, 0) / tl.sum(p, 0)
        tl.store(O + h * stride + offs_d, o.to(O.dtype.element_ty), mask=mask_d)

    return triton, one_key_attention


def versions():
    import triton

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"torch {torch.__version__}, triton {triton.__version__}, {name}"


def run(kernel, triton, q, k, v, scale, fusion):
    H, D = q.shape
    o = torch.full_like(v, float("nan"))
    kw = {} if fusion else {"enable_fp_fusion": False}
    kernel[(H,)](q, k, v, o, scale, q.stride(0), D=D, BD=triton.next_power_of_2(D), BN=64, num_warps=4, **kw)
    if o.is_cuda:
        torch.cuda.synchronize()
    return o.cpu()


def main(argv=None) -> int:
    a = parse_args(argv)
    triton, kernel = build_kernel()
    print(versions())
    dt = getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(a.seed)
    H, D = a.heads, a.dim
    scale = D**-0.5
    q = (torch.randn(H, D, generator=g) * 3).to(dt)
    k = (torch.randn(H, D, generator=g) * 3).to(dt)
    v = torch.randn(H, D, generator=g).to(dt)
    s = (q.double() * k.double()).sum(-1) * scale
    print(
        f"{H} programs, head dim {D} (block {triton.next_power_of_2(D)}), {a.dtype}; |q.k * scale| up to {s.abs().max():.3g}"
    )
    dev = torch.device(a.device)
    bad_fused = 0
    for fusion in (True, False):
        o = run(kernel, triton, q.to(dev), k.to(dev), v.to(dev), scale, fusion)
        wrong = o.double() != v.double()
        n = int(wrong.sum())
        label = "enable_fp_fusion=True (default)" if fusion else "enable_fp_fusion=False"
        line = f"{label:32s} o != v in {n} of {o.numel()} (program, column) pairs, {int(wrong.any(-1).sum())} programs"
        if n:
            d = (o.double() - v.double()).abs()
            i = int(d.argmax())
            h, c = divmod(i, D)
            line += f"; worst program {h} column {c}: o {o[h, c].item():.5g}, v {v[h, c].item():.5g}"
            line += f" (weight {(o[h, c].double() / v[h, c].double()).item():.4f}, must be 1)"
        print(line)
        if fusion:
            bad_fused = n
    if bad_fused:
        print("FINDING PRESENT: with fp fusion the lanes of one row hold different sums (softmax of one key != 1)")
        return 1
    print("NOT REPRODUCED: o == v for every program")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a crash is not the finding: exit 3, so 1 always means "still there"
        import traceback

        traceback.print_exc()
        sys.exit(3)
