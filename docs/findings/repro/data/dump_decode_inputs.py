"""Write the exact inputs of attnbench decode cases as SGLang's Triton decode receives them, for the
standalone reproducers beside this folder (which never import attnbench).

    python docs/findings/repro/data/dump_decode_inputs.py                 # the committed files below
    python docs/findings/repro/data/dump_decode_inputs.py --big DIR --only-big   # the two below, into DIR

One `.pt` per case id (a dict of CPU tensors and plain values, `torch.load(..., weights_only=True)`):

- `case`, `sm_scale`, `window` (-1: none), `seq_lens` (every request's length, list), `max_kv_splits`;
- `q [B, Hq, D]`; `kv_indptr` (int32): each request's first visible key in `k`, `v`;
- `k`, `v` `[sum of visible keys, Hkv, D]`: the keys each request sees, gathered per request (the window
  applied as SGLang's backend applies it);
- where the case's pool matters (the one-key case): `k_buf [slots, Hkv, D]`, `v_buf [slots, Hkv, Dv]`,
  the paged caches as SGLang's token buffers (a freed SWA pool's pages included, as they are: NaN), and
  `kv_indices` (int64), the token-level table our adapter builds (kernels/sglang/conventions.py).

`--big DIR` writes one (request, head) slice of `decode/b32-l4096-h32x32-d128-p16-bf16` (the slice that
fails on an H100 and an H200: request 3, head 3) with the batch's lengths (its split count depends on
them), 2 MB, and `decode/b3-l80-mixed-h4x4-d128-p1-bf16`, 420 kB: not committed; run_diagnostics.sh
writes them on the GPU machine before the reproducer runs.
This script needs attnbench (it builds the inputs the harness builds, on the CPU, bit for bit).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CASES = {  # file: (case id, with the token buffers and table)
    # GPU smoke rows of SGLang's MHA decode over their bound (H200, session 7); inputs as built today
    "sglang_decode_mha_b3_l37.pt": ("decode/b3-l37-mixed-h4x4-d128-p1-bf16", False),
    # one key per request, o 0.10 off against 0.012 (H200, session 7): the pool and the adapter's table too
    "sglang_decode_one_key_d13.pt": ("decode/b2-l1-h4x4-d13-p1-swa6-poolswa-large_logits-bf16", True),
}
BIG_CASE, BIG_SLICE = "decode/b32-l4096-h32x32-d128-p16-bf16", (3, 3)
BIG = {  # not committed (2 MB and 420 kB): --big DIR writes them
    "sglang_decode_mha_b32_l4096_r3h3.pt": lambda: dump_slice(BIG_CASE, *BIG_SLICE),
    "sglang_decode_mha_b3_l80.pt": lambda: dump("decode/b3-l80-mixed-h4x4-d128-p1-bf16", False),
}


def tables(x):
    from attnbench.kernels.sglang import conventions as conv

    ranges = [conv.decode_key_range(int(L), x.window) for L in x.seq_lens.tolist()]
    indptr, indices = conv.token_slots(
        x.kv_indptr, x.kv_page_indices, x.page_size, [s for s, _ in ranges], [e for _, e in ranges]
    )
    return indptr, indices, conv.token_view(x.k_cache), conv.token_view(x.v_cache)


def dump(case_id: str, buffers: bool) -> dict:
    from attnbench.case import Case
    from attnbench.kernels.sglang.attention import MAX_KV_SPLITS

    x = Case.from_id(case_id).make_inputs()
    indptr, indices, k_buf, v_buf = tables(x)
    out = {
        "case": case_id,
        "sm_scale": float(x.sm_scale),
        "window": int(x.window),
        "seq_lens": [int(L) for L in x.seq_lens.tolist()],
        "max_kv_splits": MAX_KV_SPLITS,
        "q": x.q.clone(),
        "kv_indptr": indptr.clone(),
        "k": k_buf[indices].clone(),
        "v": v_buf[indices].clone(),
    }
    if buffers:
        out.update(k_buf=k_buf.clone(), v_buf=v_buf.clone(), kv_indices=indices.clone())
    return out


def dump_slice(case_id: str, b: int, h: int) -> dict:
    """Request b, head h of an MHA case, alone: q [1, 1, D], its visible keys [L, 1, D] (contiguous)."""
    from attnbench.case import Case
    from attnbench.kernels.sglang.attention import MAX_KV_SPLITS

    x = Case.from_id(case_id).make_inputs()
    indptr, indices, k_buf, v_buf = tables(x)
    if x.q.shape[1] != k_buf.shape[1]:
        raise SystemExit(f"{case_id}: not an MHA case (heads {x.q.shape[1]} / {k_buf.shape[1]})")
    rows = indices[int(indptr[b]) : int(indptr[b + 1])]
    return {
        "case": case_id,
        "slice": [b, h],
        "heads": int(x.q.shape[1]),
        "sm_scale": float(x.sm_scale),
        "window": int(x.window),
        "seq_lens": [int(L) for L in x.seq_lens.tolist()],
        "max_kv_splits": MAX_KV_SPLITS,
        "q": x.q[b : b + 1, h : h + 1].clone(),
        "k": k_buf[rows, h : h + 1].clone(),
        "v": v_buf[rows, h : h + 1].clone(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--big", metavar="DIR", help=f"also write {', '.join(BIG)} into DIR")
    p.add_argument("--only-big", action="store_true", help="write the --big files only")
    a = p.parse_args(argv)
    if not a.only_big:
        for name, (case_id, buffers) in CASES.items():
            torch.save(dump(case_id, buffers), HERE / name)
            print(f"{HERE / name}: {case_id}")
    if a.big:
        Path(a.big).mkdir(parents=True, exist_ok=True)
        for name, make in BIG.items():
            d = make()
            torch.save(d, Path(a.big) / name)
            print(f"{Path(a.big) / name}: {d['case']}" + (f" request/head {d['slice']}" if "slice" in d else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
