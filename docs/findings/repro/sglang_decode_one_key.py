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

The cause (diagnosed 2026-11-28 from the sm_90 PTX of triton 3.6, confirmed by the H100 run of this file:
reports/examples/h100-session17/findings-diag/one_key.txt): with an odd head dim the key rows are 2-byte
aligned, so each lane holds one column (layout [1, 1] x [2, 16] lanes for BLOCK_DMODEL 16) and the score
`tl.sum(q * k, 1)` is a butterfly over the 16 lanes of a row (masks 8, 4, 2, 1). Its first step is
contracted: lane c computes `fma.rn(q_c, k_c, mul.rn(q_{c^8}, k_{c^8}))`, lane c^8 the mirror image, so
the two round differently and the 16 lanes end with different bf16 scores for the same key. Every lane
keeps its own copy: the row max and the softmax sum are taken from lane 0's copy, the weight of column c
from lane c's, so o[c] = v[c] * exp(s_c - s_0) with one key. fp32 copies of bf16 values multiply exactly,
so there both lanes round once and agree; a power-of-two head dim is 16-byte aligned and each thread
sums 8 columns first, then the lanes add (commutative): no difference either. `one_key_as_compiled`
models this in float64; the reproducer prints whether the kernel's o equals the model's bit for bit.

Prints, per variant, the max |o - v| and where, the model's, and whether the kernel equals the model.
Exit 1 while any variant's o differs from v (the finding shows), 0 when every variant gives v exactly,
3 on a crash.
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


_BITS = {
    torch.bfloat16: (8, -126, 3.3895313892515355e38),
    torch.float16: (11, -14, 65504.0),
    torch.float32: (24, -126, 3.4028234663852886e38),
}  # significant bits, min normal exponent, max
_LOG2E_F32 = 1.44269502162933349609375  # 0x3FB8AA3B, the constant tl.exp multiplies by before ex2


def rnd(x, dtype):
    """float64 `x` rounded once to `dtype` (nearest even, subnormals and overflow included), as float64.
    torch's float64 -> bfloat16 conversion goes through float32 (two roundings); an fma rounds once."""
    bits, emin, big = _BITS[dtype]
    _, e = torch.frexp(x)
    e = torch.clamp(e, min=emin + 1)
    r = torch.ldexp(torch.round(torch.ldexp(x, bits - e)), e - bits)
    return torch.where(r.abs() > big, torch.copysign(torch.full_like(r, float("inf")), r), r)


def lane_scores(q, k):
    """The score q.k of one key as each lane of its row holds it in the MHA stage 1 when a lane holds one
    column (odd head dim; triton 3.6, sm_90, BLOCK_DMODEL = 16 or 32): the masked columns are 0, lane c
    computes fma.rn(q_c, k_c, mul.rn(q_{c^h}, k_{c^h})) for h = BLOCK_DMODEL / 2, then adds over the
    masks h/2, ..., 1 in the input dtype. q, k [..., D] -> [..., BLOCK_DMODEL] float64 (input-dtype values)."""
    D, dt = q.shape[-1], q.dtype
    n = 1 << (D - 1).bit_length()
    if n > 32:
        raise ValueError(f"the model is of one column per lane within a warp row (head dim <= 32, got {D})")
    prod = torch.zeros(*q.shape[:-1], n, dtype=torch.float64)
    prod[..., :D] = q.double() * k.double()  # exact for 16-bit inputs (and for fp32 copies of them)
    lane = torch.arange(n)
    s = rnd(prod + rnd(prod[..., lane ^ (n // 2)], dt), dt)
    m = n // 4
    while m:
        s = rnd(s + s[..., lane ^ m], dt)
        m //= 2
    return s


def one_key_as_compiled(q, k, v, sm_scale):
    """o of decode_attention_fwd's MHA path for requests that see one key, as its sm_90 code computes it
    when a lane holds one column: lane c's fp32 score sc_c = f32(s_c) * sm_scale; the max and the sum of
    the softmax come from lane 0 (e_max = sc_0, e_sum = 1); column c's weight is ex2((sc_c - sc_0) * log2 e)
    from lane c; stage 2 passes the one split through. q, k, v [B, H, D] (k, v the one key of each
    request, per query head) -> o [B, H, D] float64 holding q.dtype values."""
    s = lane_scores(q, k)
    f32 = torch.float32
    sc = rnd(s * rnd(torch.tensor(float(sm_scale), dtype=torch.float64), f32), f32)
    t = rnd(rnd(sc - sc[..., :1], f32) * _LOG2E_F32, f32)
    w = rnd(torch.exp2(t), f32)  # ex2.approx.f32: exact at 0 (lane 0); ~2 ulp of fp32 elsewhere
    return rnd(rnd(w[..., : v.shape[-1]] * v.double(), f32), q.dtype)


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


def predicted_o(q, k_key, v, sm_scale):
    """The model's o for one variant: `one_key_as_compiled` where the kernel runs the MHA stage 1 with one
    column per lane (an odd head dim: the rows are only element-aligned); otherwise (a 16-byte aligned
    head dim: each thread sums its columns first and the lanes add, which commutes; or the grouped
    kernel's tl.dot) every lane holds the same score and o == v. q, v [B, Hq, D] (v: each query head's
    value), k_key [B, Hkv, D]."""
    if q.shape[1] != k_key.shape[1] or q.shape[-1] % 2 == 0:
        return v.double()
    return one_key_as_compiled(q, k_key, v, sm_scale)


def worst_diff(o, want):
    """(max |o - want| with NaN as inf, ' at request b head h dim c: o .., v ..' or '')."""
    diff = (o.double() - want.double()).abs()
    diff = torch.where(diff.isnan(), torch.full_like(diff, float("inf")), diff)
    w = diff.max().item()
    if w == 0.0:
        return 0.0, ""
    i = int(diff.argmax())
    b, h, c = i // (o.shape[1] * o.shape[2]), (i // o.shape[2]) % o.shape[1], i % o.shape[2]
    return w, f" at request {b} head {h} dim {c}: o {o[b, h, c].item():.5g}, v {want[b, h, c].item():.5g}"


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
    bad, model_ok = [], 0
    for name, (qq, kb, vb, ind, sp, want) in variants.items():
        runs = 20 if name == "adapter" else 1
        worst, where, mismatch = 0.0, "", 0
        model = predicted_o(qq, kb[ind], want, sc)
        for _ in range(runs):
            o = decode(qq, kb, vb, indptr, ind, sp, sc, ms, dev)
            want_h = want if want.shape[1] == o.shape[1] else want.repeat_interleave(o.shape[1] // want.shape[1], 1)
            w, at = worst_diff(o, want_h)
            if w > worst or (worst == 0.0 and w > 0):
                worst, where = w, at
            mismatch = max(mismatch, int((o.double() != model).sum()))
        m_worst, m_where = worst_diff(model, want_h)
        label = f"{name} (x{runs})" if runs > 1 else name
        print(f"{label:16s} max |o - v| = {worst:.4g}{where}")
        verdict = "equal bit for bit" if mismatch == 0 else f"{mismatch} of {o.numel()} elements differ"
        print(f"{'':16s} model {m_worst:.4g}{m_where}; kernel vs model: {verdict}")
        model_ok += mismatch == 0
        if worst != 0.0:
            bad.append(name)
    print(f"model == kernel bit for bit in {model_ok} of {len(variants)} variants")
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
