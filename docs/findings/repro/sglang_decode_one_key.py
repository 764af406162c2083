"""SGLang decode_attention_fwd with one key per request: o must be that key's value, bit for bit.

The harness row `decode/b2-l1-h4x4-d13-p1-swa6-poolswa-large_logits-bf16` (MHA, head_dim 13, page size
1, a sliding-window layer's own pool whose freed pages hold NaN, large logits) failed on an H200
(2026-11-24): o 0.10 off float64 at request 0, head 3 against a bound of 0.012. With one key the
softmax weight is exp(s - s) = 1 whatever the score, both stages pass v through unchanged
(acc = 1 * v, e_sum = 1; stage 2: one split, weight exp(0) = 1), so o == v exactly is the kernel's
contract here, and any difference is a bug: of our adapter's arguments or of the kernel.

Bisects on the exact inputs (data/sglang_decode_one_key_d13.pt, written by data/dump_decode_inputs.py:
the pool as SGLang's token buffer, NaN pages included, and the token table our adapter builds):

  adapter      the adapter's call: token buffers, its table (int64 slots), SGLang's split count for
               this device, max_kv_splits 8, scratch [B, H, 8, 13]
  splits=1     the same with one split per request
  contiguous   each request's key gathered into a fresh [B, H, 13] buffer, table 0..B-1
  no-nan-pool  the adapter's call with the pool's unused slots zeroed instead of NaN
  pad-d16      head_dim padded with zeros to 16 (a power of two: no masked columns)
  small-q      q scaled by 1/16 (no large logits)
  fp16, fp32   the same values in fp16 / fp32
  repeat x20   the adapter's call 20 times (a race would differ between runs)
  grouped      two query heads per KV head (the grouped kernel)

Prints, per variant, the max |o - v| and where. Exit 1 while any variant's o differs from v (the finding
shows), 0 when every variant gives v exactly, 3 on a crash.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import sys

import torch

DEFAULT_INPUTS = "data/sglang_decode_one_key_d13.pt"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--inputs", default=DEFAULT_INPUTS, help="a .pt of data/dump_decode_inputs.py with its pool")
    p.add_argument("--max-kv-splits", type=int, default=8, help="SGLang's server default (CUDA)")
    return p.parse_args(argv)


def versions():
    import triton

    return f"torch {torch.__version__}, triton {triton.__version__}, sglang {importlib.metadata.version('sglang')}"


def load(path):
    from pathlib import Path

    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = Path(__file__).resolve().parent / path
    return torch.load(p, weights_only=True)


def num_kv_splits(lens, heads_q, heads_kv, max_splits, cores):
    """SGLang's TritonAttnBackend.get_num_kv_splits (0.5.10), restated."""
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    longest, shortest = max(lens), min(lens)
    if longest * 8 < shortest * 10:
        shortest = longest
    chunk1 = cdiv(longest, min(cdiv(longest, shortest), max_splits))
    programs = int(cores * max(math.log2(longest / 64.0), 1.0))
    ratio = heads_q // heads_kv
    grid = len(lens) * heads_q if ratio == 1 else len(lens) * cdiv(heads_q, min(16, ratio))
    chunk2 = cdiv(longest, min(cdiv(programs, grid), max_splits))
    return [max(cdiv(L, chunk1), cdiv(L, chunk2)) for L in lens]


def decode(q, k_buf, v_buf, indptr, indices, splits, sm_scale, max_splits, dev):
    from sglang.srt.layers.attention.triton_ops.decode_attention import decode_attention_fwd

    B, Hq, _ = q.shape
    Dv = v_buf.shape[-1]
    logits = torch.empty(B, Hq, max_splits, Dv, dtype=torch.float32, device=dev)
    lse = torch.empty(B, Hq, max_splits, dtype=torch.float32, device=dev)
    o = torch.full((B, Hq, Dv), float("nan"), dtype=q.dtype, device=dev)
    decode_attention_fwd(
        q.to(dev), k_buf.to(dev), v_buf.to(dev), o, indptr.to(dev, torch.int32), indices.to(dev, torch.int64),
        logits, lse, torch.tensor(splits, dtype=torch.int32, device=dev), max_splits, sm_scale, 1.0, 1.0,
    )  # fmt: skip
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return o.cpu()


def main(argv=None) -> int:
    a = parse_args(argv)
    d = load(a.inputs)
    dev = torch.device(a.device)
    print(versions())
    q, k_buf, v_buf, indptr, indices = d["q"], d["k_buf"], d["v_buf"], d["kv_indptr"], d["kv_indices"]
    lens = (indptr[1:] - indptr[:-1]).tolist()
    if any(n != 1 for n in lens):
        raise SystemExit(f"{a.inputs}: every request must see one key (visible keys {lens})")
    B, Hq, D = q.shape
    Hkv = k_buf.shape[1]
    cores = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 0
    splits = num_kv_splits(lens, Hq, Hkv, a.max_kv_splits, cores) if cores else [a.max_kv_splits] * B
    sc, ms = d["sm_scale"], a.max_kv_splits
    v_key = v_buf[indices]  # [B, Hkv, Dv]: the one value each request sees
    print(f"{d['case']}: B = {B}, heads {Hq}/{Hkv}, D = {D}, sm_scale {sc:.6g}, splits {splits} ({cores} SMs)")
    print(f"max|q| {q.float().abs().max().item():.3g}, scores q.k*scale "
          f"{[round(x, 2) for x in ((q.double() * k_buf[indices].double()).sum(-1) * sc).flatten().tolist()]}")  # fmt: skip
    print(
        f"pool slots {k_buf.shape[0]}, NaN slots {int(k_buf.isnan().any(-1).any(-1).sum())}, table {indices.tolist()}"
    )

    contiguous = (k_buf[indices], v_buf[indices], torch.arange(B, dtype=torch.int64))
    clean = torch.zeros_like(k_buf), torch.zeros_like(v_buf)
    clean[0][indices], clean[1][indices] = k_buf[indices], v_buf[indices]
    pad = lambda t: torch.nn.functional.pad(t, (0, 16 - t.shape[-1])) if t.shape[-1] < 16 else t  # noqa: E731
    variants = {
        "adapter": (q, k_buf, v_buf, indices, splits, v_key),
        "splits=1": (q, k_buf, v_buf, indices, [1] * B, v_key),
        "contiguous": (q, contiguous[0], contiguous[1], contiguous[2], splits, v_key),
        "no-nan-pool": (q, clean[0], clean[1], indices, splits, v_key),
        "pad-d16": (pad(q), pad(k_buf), pad(v_buf), indices, splits, pad(v_key)),
        "small-q": ((q.float() / 16).to(q.dtype), k_buf, v_buf, indices, splits, v_key),
        "fp16": (q.half(), k_buf.half(), v_buf.half(), indices, splits, v_key.half()),
        "fp32": (q.float(), k_buf.float(), v_buf.float(), indices, splits, v_key.float()),
        "grouped": (
            q.repeat_interleave(2, 1),
            k_buf,
            v_buf,
            indices,
            splits,
            v_key.repeat_interleave(2 * Hq // Hkv, 1),
        ),
    }
    bad = []
    for name, (qq, kb, vb, ind, sp, want) in variants.items():
        runs = 20 if name == "adapter" else 1
        worst, where = 0.0, ""
        for _ in range(runs):
            o = decode(qq, kb, vb, indptr, ind, sp, sc, ms, dev)
            want_h = want if want.shape[1] == o.shape[1] else want.repeat_interleave(o.shape[1] // want.shape[1], 1)
            diff = (o.double() - want_h.double()).abs()
            diff = torch.where(diff.isnan(), torch.full_like(diff, float("inf")), diff)
            if diff.max().item() > worst or (worst == 0.0 and diff.max().item() > 0):
                i = int(diff.argmax())
                b, h, c = i // (o.shape[1] * o.shape[2]), (i // o.shape[2]) % o.shape[1], i % o.shape[2]
                worst = diff.max().item()
                where = f" at request {b} head {h} dim {c}: o {o[b, h, c].item():.5g}, v {want_h[b, h, c].item():.5g}"
        label = f"{name} (x{runs})" if runs > 1 else name
        print(f"{label:16s} max |o - v| = {worst:.4g}{where}")
        if worst != 0.0:
            bad.append(name)
    if bad:
        print(f"FINDING PRESENT: o != v with one key in: {', '.join(bad)}")
        return 1
    print("NOT REPRODUCED: every variant returns the key's value exactly (o == v)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a crash is not the finding: exit 3, so 1 always means "still there"
        import traceback

        traceback.print_exc()
        sys.exit(3)
