"""SGLang's deterministic extend (`extend_attention_fwd_unified`) reads windowed custom-mask rows short: with a
sliding window and a custom mask, the wrong keys are masked.

With `--enable-deterministic-inference`, SGLang's Triton backend runs an extend through
`_forward_extend_unified`: `build_unified_kv_indices` puts each request's prefix table and its new
tokens' slots in one table, and `extend_attention_fwd_unified` reads it in one stage. For a
sliding-window layer the prefix table is the windowed one (`window_kv_indptr` / `window_kv_indices`,
from the window's first key), so a request's unified row has `windowed prefix + q_len` keys. The
kernel loads the custom mask at `mask_indptr[b] + q * cur_seq_kv_len + k` with that length, from
column 0. SGLang's target-verify metadata builds the mask rows over the whole prefix
(`seq_mask_len = num_draft_tokens * (seq_lens + num_draft_tokens)`), which the two-stage
`extend_attention_fwd` reads right by skipping `window_kv_offsets` columns; the unified kernel takes
no such offset. Whenever the window cuts the prefix, row q is read at the wrong columns.

B requests, a prefix of --prefix tokens, --q-len new tokens with a tree-like custom mask (every
prefix key visible, each new token sees itself and a random subset of the earlier new tokens), a
window of --window keys. Three calls on the same inputs against a float64 reference: the unified
kernel with SGLang's full-prefix mask rows (the finding), the unified kernel with the rows cut to
each request's window (shows the rest of the call is right), and the two-stage `extend_attention_fwd`
with `window_kv_offsets` (the non-deterministic path). Standalone: torch + sglang.
`--device cpu` runs under TRITON_INTERPRET=1 (set it before the run). Exit 1 while the first call
is wrong and the other two right, 0 once it is right.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="fp16", choices=["bf16", "fp16"])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prefix", type=int, default=21, help="cached prefix tokens per request")
    p.add_argument("--q-len", type=int, default=6, help="new (draft) tokens per request")
    p.add_argument("--window", type=int, default=6, help="sliding window W: query i sees keys [i - W, i]")
    p.add_argument("--head-dim", type=int, default=16)
    return p.parse_args(argv)


def versions():
    import triton

    return f"torch {torch.__version__}, triton {triton.__version__}, sglang {importlib.metadata.version('sglang')}"


def main(argv=None) -> int:
    args = parse_args(argv)
    from sglang.srt.layers.attention.triton_ops import extend_attention as ea

    print(versions())
    dev, B, P, n, W, D = args.device, args.batch, args.prefix, args.q_len, args.window, args.head_dim
    H, Hk = 4, 2
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    L = P + n
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B * n, H, D, generator=g).to(dt)
    k_buf = torch.randn(B * L, Hk, D, generator=g).to(dt)  # token-level cache: request r's position j at slot r*L + j
    v_buf = torch.randn(B * L, Hk, D, generator=g).to(dt)
    masks = []  # SGLang's rows: [n, P + n] per request, over the whole prefix
    for _ in range(B):
        m = torch.ones(n, L, dtype=torch.bool)
        m[:, P:] = (torch.rand(n, n, generator=g) < 0.6).tril(-1) | torch.eye(n, dtype=torch.bool)
        masks.append(m)
    start = max(0, P - W)  # the windowed prefix table starts here (SGLang's window_kv_offsets / window_start_pos)
    scale = D**-0.5

    o_ref = torch.zeros(B * n, H, D, dtype=torch.float64)  # float64: mask & window (query P+i sees [P+i-W, P+i])
    pos_q, pos_k = torch.arange(P, L)[:, None], torch.arange(L)[None, :]
    for r in range(B):
        keep = masks[r] & (pos_q <= pos_k + W) & (pos_k <= pos_q)
        kr = k_buf[r * L : (r + 1) * L].double().repeat_interleave(H // Hk, 1)  # [L, H, D]
        vr = v_buf[r * L : (r + 1) * L].double().repeat_interleave(H // Hk, 1)
        s = torch.einsum("qhd,khd->hqk", q[r * n : (r + 1) * n].double(), kr) * scale
        p = torch.softmax(s.masked_fill(~keep[None], float("-inf")), -1)
        o_ref[r * n : (r + 1) * n] = torch.einsum("hqk,khd->qhd", p, vr)

    i32 = dict(dtype=torch.int32, device=dev)
    qo_indptr = torch.arange(0, B * n + 1, n, **i32)
    prefix_indptr = torch.arange(0, B * (P - start) + 1, P - start, **i32)  # window_kv_indptr
    prefix_indices = torch.cat([torch.arange(r * L + start, r * L + P) for r in range(B)]).to(dev)  # window_kv_indices
    new_slots = torch.cat([torch.arange(r * L + P, r * L + L) for r in range(B)]).to(dev)  # out_cache_loc
    starts = torch.full((B,), start, **i32)
    d_q, d_k, d_v = q.to(dev), k_buf.to(dev), v_buf.to(dev)

    def unified(rows):
        kv_indptr, kv_indices, prefix_lens = ea.build_unified_kv_indices(
            prefix_indptr, prefix_indices, qo_indptr[:-1], torch.full((B,), n, **i32), new_slots, B
        )
        mask = torch.cat([m.flatten() for m in rows]).to(dev)
        mask_indptr = torch.tensor([0] + [m.numel() for m in rows], device=dev).cumsum(0).to(torch.int32)
        o = torch.zeros_like(d_q)
        ea.extend_attention_fwd_unified(
            d_q, o, d_k, d_v, 1.0, 1.0, qo_indptr, kv_indptr, kv_indices, prefix_lens.to(torch.int32), n,
            custom_mask=mask, mask_indptr=mask_indptr, sm_scale=scale, is_causal=True, sliding_window_size=W,
            window_start_pos=starts,
        )  # fmt: skip
        return o

    def two_stage():
        mask = torch.cat([m.flatten() for m in masks]).to(dev)
        mask_indptr = torch.tensor([0] + [m.numel() for m in masks], device=dev).cumsum(0).to(torch.int32)
        o = torch.zeros_like(d_q)
        new = new_slots.long()
        ea.extend_attention_fwd(
            d_q, d_k[new], d_v[new], o, d_k, d_v, qo_indptr, prefix_indptr, prefix_indices, mask, False, mask_indptr,
            n, 1.0, 1.0, sm_scale=scale, skip_prefix_custom_mask=False, sliding_window_size=W,
            window_kv_offsets=starts,
        )  # fmt: skip
        return o

    runs = {
        "unified, SGLang's mask rows (whole prefix)": lambda: unified(masks),
        "unified, mask rows cut to the window": lambda: unified([m[:, start:] for m in masks]),
        "two-stage extend_attention_fwd, window_kv_offsets": two_stage,
    }
    tol = 2**-7 * o_ref.abs().max().item()  # a few half-precision ulps of |o|
    right = {}
    print(f"{B} requests: prefix {P}, {n} new tokens, window {W} (windowed prefix from position {start}), "
          f"custom mask rows of {L} columns; tol {tol:.3g}")  # fmt: skip
    for name, call in runs.items():
        err = (call().double().cpu() - o_ref).abs().max().item()
        right[name] = err <= tol
        print(f"{name}: max|o - ref| {err:.3g}: " + ("right" if right[name] else "WRONG"))
    first, *controls = runs
    if not all(right[c] for c in controls):
        print("CANNOT TELL: a control call is wrong too")
        return 3
    if not right[first]:
        print("FINDING PRESENT: the unified kernel reads the windowed custom-mask rows from column 0")
        return 1
    print("FIXED: the unified kernel reads the mask rows at the window's columns")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a crash is not the finding: exit 3, so 1 always means "still there"
        import traceback

        traceback.print_exc()
        sys.exit(3)
