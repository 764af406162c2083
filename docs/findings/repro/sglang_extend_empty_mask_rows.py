"""SGLang extend_attention_fwd: a custom-mask row that sees no key gives NaN (0 / 0), with or without a window.

With a custom mask, a query row whose mask is all False ends with deno = 0 and acc = 0, and the
kernel stores acc / deno = NaN (a sink adds exp(sink - e_max) to deno and hides it). SGLang's own
masks (tree verification) always let a token see itself, so the kernel never meets such a row in
the server: this is a precondition of the kernel, not a wrong result on SGLang's inputs. It is what
attnbench's SWA-pool MLA extend case showed (its first query sees nothing); the pool, the window
and MLA play no part, as this plain MHA case shows.

Standalone: torch + sglang. `--device cpu --dtype fp16` runs under TRITON_INTERPRET=1. Exit 1 while
the empty row is NaN (expected o = 0, FlashInfer's convention), 0 once it is 0.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--prefix", type=int, default=5)
    p.add_argument("--q-len", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--window", type=int, default=-1, help="sliding_window_size (-1: none)")
    return p.parse_args(argv)


def versions():
    import triton

    return f"torch {torch.__version__}, triton {triton.__version__}, sglang {importlib.metadata.version('sglang')}"


def main(argv=None) -> int:
    args = parse_args(argv)
    from sglang.srt.layers.attention.triton_ops.extend_attention import extend_attention_fwd

    print(versions())
    dev, P, n, D = args.device, args.prefix, args.q_len, args.head_dim
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(n, 1, D, generator=g).to(dt)
    k = torch.randn(P + n, 1, D, generator=g).to(dt)
    v = torch.randn(P + n, 1, D, generator=g).to(dt)
    mask = torch.ones(n, P + n, dtype=torch.bool).tril(P)  # causal over prefix + new tokens
    mask[0] = False  # query 0 sees no key
    if args.window > 0:
        i, j = torch.arange(n)[:, None] + P, torch.arange(P + n)[None, :]
        mask &= i <= j + args.window
    scale = D**-0.5

    s = (q[:, 0].double() @ k[:, 0].double().T) * scale
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)  # empty rows: o = 0
    o_ref = p @ v[:, 0].double()

    o = torch.empty(n, 1, D, dtype=dt, device=dev)
    extend_attention_fwd(
        q.to(dev), k[P:].to(dev), v[P:].to(dev), o, k[:P].to(dev), v[:P].to(dev),
        torch.tensor([0, n], device=dev), torch.tensor([0, P], dtype=torch.int32, device=dev),
        torch.arange(P, dtype=torch.int32, device=dev), mask.flatten().to(dev), False,
        torch.tensor([0, n * (P + n)], device=dev), n, 1.0, 1.0, sm_scale=scale,
        skip_prefix_custom_mask=False, sliding_window_size=args.window,
        window_kv_offsets=torch.zeros(1, dtype=torch.int32, device=dev),
    )  # fmt: skip
    o = o[:, 0].double().cpu()
    print(f"row 0 (no visible key): expected o = 0, got o[0, :4] = {o[0, :4].tolist()}")
    err = (o[1:] - o_ref[1:]).abs().max().item()
    print(f"rows 1..{n - 1}: max |o - ref| = {err:.3g}")
    if torch.isnan(o[0]).any():
        print("FINDING PRESENT: an empty custom-mask row is NaN")
        return 1
    print("FIXED (or empty rows defined): row 0 is finite")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a crash is not the finding: exit 3, so 1 always means "still there"
        import traceback

        traceback.print_exc()
        sys.exit(3)
