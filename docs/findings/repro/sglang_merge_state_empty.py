"""SGLang merge_state_triton: merging two empty attention states writes NaN.

An attention state is (v, lse) with lse the natural-log sum of exp(scores); an empty state (no key
seen) has lse = -inf (the kernel also maps FlashAttention's +inf to -inf, so empty states are meant
to be accepted). Merging two empty states should give v = 0, lse = -inf. The kernel computes
`max_lse = max(p_lse, s_lse)` and then `p_lse - max_lse` = -inf - (-inf) = NaN, so v and lse are NaN.

Standalone: torch + sglang only. Exit 1 while the NaN is there, 0 once fixed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", type=int, default=4)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    return p.parse_args(argv)


def versions():
    import triton

    return f"torch {torch.__version__}, triton {triton.__version__}, sglang {importlib.metadata.version('sglang')}"


def main(argv=None) -> int:
    a = parse_args(argv)
    from sglang.srt.layers.attention.triton_ops.merge_state import merge_state_triton

    print(versions())
    T, H, D, dev = a.tokens, a.heads, a.head_dim, a.device
    g = torch.Generator().manual_seed(0)
    v_a = torch.randn(T, H, D, generator=g).to(torch.bfloat16)
    v_b = torch.randn(T, H, D, generator=g).to(torch.bfloat16)
    s_a = torch.randn(T, H, generator=g) * 3
    s_b = torch.randn(T, H, generator=g) * 3
    s_a[0], s_b[0] = float("-inf"), float("-inf")  # token 0: both states empty
    s_a[1] = float("-inf")  # token 1: only the prefix state is empty (works today)

    # float64 reference from the math: w_x = exp(s_x - s) with s = log(exp(s_a) + exp(s_b)); empty + empty = (0, -inf)
    s_ref = torch.logaddexp(s_a.double(), s_b.double())
    w_a = torch.where(torch.isinf(s_ref), 0.0, torch.exp(s_a.double() - s_ref))
    w_b = torch.where(torch.isinf(s_ref), 0.0, torch.exp(s_b.double() - s_ref))
    o_ref = w_a[..., None] * v_a.double() + w_b[..., None] * v_b.double()

    o = torch.empty(T, H, D, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(T, H, dtype=torch.float32, device=dev)
    merge_state_triton(v_a.to(dev), s_a.to(dev), v_b.to(dev), s_b.to(dev), o, lse)
    o, lse = o.double().cpu(), lse.double().cpu()

    print(
        f"token 0 (both empty): expected o = 0, lse = -inf; got o[0,0,:4] = {o[0, 0, :4].tolist()}, lse[0] = {lse[0].tolist()}"
    )
    err_other = (o[1:] - o_ref[1:]).abs().max().item()
    print(f"tokens 1..{T - 1} (not both empty): max |o - ref| = {err_other:.3g} (bf16 output, bound 2^-7 * max|o|)")
    nan = torch.isnan(o).any().item() or torch.isnan(lse).any().item()
    ok_empty = bool((o[0] == 0).all() and torch.isneginf(lse[0]).all())
    ok_rest = err_other <= 2**-7 * max(o_ref[1:].abs().max().item(), 1.0)
    if nan or not ok_empty or not ok_rest:
        print(
            f"FINDING PRESENT: NaN in output: {nan}; empty+empty gives (0, -inf): {ok_empty}; other tokens right: {ok_rest}"
        )
        return 1
    print("FIXED: two empty states merge to (0, -inf)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a crash is not the finding: exit 3, so 1 always means "still there"
        import traceback

        traceback.print_exc()
        sys.exit(3)
