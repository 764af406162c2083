"""SGLang decode_attention_fwd, MHA path (heads_q == heads_kv): q.k summed in bf16.

`_fwd_kernel_stage1` (run when kv_group_num == 1) computes `qk = tl.sum(q[None, :] * k, 1)` on bf16 q
and k. Triton keeps a float sum in its input dtype (`tl.sum` upcasts only small integers), and the sm_90
code does so: `mul.bf16`, then `fma.rn.bf16` down each thread's 8 columns and `add.bf16` across 16
lanes (triton 3.6, D = 128, 16-byte aligned inputs). Scores carry bf16 rounding of partial sums (|q.k|
up to ~2^-8 relative), which exp() turns into output errors beyond bf16 output rounding. The grouped
path (heads_q > heads_kv) uses tl.dot with an fp32 accumulator.

What this measures, on the GPU (torch + sglang only):

1. the kernel's own scores: each key alone in a one-key request, where the kernel's per-split LSE
   scratch (`attn_lse`, fp32) is exactly its score (e_max + log 1). Compared with the float64 score,
   with the worst case of an fp32 sum (gamma_D * sum |q_i k_i|, D * 2^-24 each) and with a model of
   the sm_90 code's bf16 order (`bf16_scores_as_compiled`, bit for bit where the model is right);
2. o on the exact inputs of failing harness rows (`--inputs FILE.pt`, written by
   data/dump_decode_inputs.py; default: data/sglang_decode_mha_b3_l37.pt), or on random data: the
   error against float64, against float64 attention over the kernel's own scores (what is left once
   the scores are taken as the kernel has them: P.V, splits, output rounding), with one split instead
   of SGLang's split count, and the grouped path on the same data;

Exit 1 while the kernel's scores are further from float64 than any fp32 sum can be (the finding), 0 once
fixed, 3 on a crash. `--model-only` runs no kernel: the float64 attention over the modelled bf16 scores
against float64, on the CPU (the model reproduces the H100 row decode/b32-l4096-h32x32-d128-p16-bf16
exactly: o 2.05e-3 off at request 3, head 3, dim 120).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import sys

import torch

DEFAULT_INPUTS = "data/sglang_decode_mha_b3_l37.pt"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--inputs",
        action="append",
        help=f"a .pt of data/dump_decode_inputs.py (repeatable; default {DEFAULT_INPUTS}, beside this file)",
    )
    p.add_argument("--random", action="store_true", help="also random inputs: B = 1, L = --seq-len, D = 128")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--max-kv-splits", type=int, default=8, help="SGLang's server default (CUDA)")
    p.add_argument("--model-only", action="store_true", help="no kernel: the bf16 score model on the CPU")
    return p.parse_args(argv)


def versions():
    import triton

    return f"torch {torch.__version__}, triton {triton.__version__}, sglang {importlib.metadata.version('sglang')}"


def bf(x):
    return x.to(torch.bfloat16).double()


def f32(x):
    return x.float().double()


def bf16_scores_as_compiled(q, k, sm_scale):
    """The MHA stage 1's scores as its sm_90 PTX computes them (triton 3.6, D = 128, 4 warps, 16-byte
    aligned): lane l of a key's row holds columns 8l..8l+7; `mul.bf16` of column 1, then `fma.rn.bf16`
    over columns 0, 2, 3, ..., 7; a butterfly over the 16 lanes (masks 8, 4, 2, 1) of `add.bf16`; then
    the fp32 scale. q [D], k [L, D] bf16 -> [L] float64 holding fp32 values."""
    if k.shape[-1] != 128:
        raise ValueError("the model is of the D = 128 code")
    ex = (k.double() * q.double()).reshape(k.shape[0], 16, 8)  # bf16 x bf16 products are exact
    s = bf(ex[:, :, 1])
    for c in (0, 2, 3, 4, 5, 6, 7):
        s = bf(ex[:, :, c] + s)
    lane = torch.arange(16)
    for m in (8, 4, 2, 1):
        s = bf(s + s[:, lane ^ m])
    return f32(f32(s[:, 0]) * f32(torch.tensor(sm_scale)))


def num_kv_splits(lens, heads_q, heads_kv, max_splits, cores):
    """SGLang's TritonAttnBackend.get_num_kv_splits (0.5.10), restated: the split count per request."""
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    if cores <= 0:
        return [max_splits] * len(lens)
    longest, shortest = max(lens), min(lens)
    if longest * 8 < shortest * 10:
        shortest = longest
    chunk1 = cdiv(longest, min(cdiv(longest, shortest), max_splits))
    programs = int(cores * max(math.log2(longest / 64.0), 1.0))
    ratio = heads_q // heads_kv
    grid = len(lens) * heads_q if ratio == 1 else len(lens) * cdiv(heads_q, min(16, ratio))
    chunk2 = cdiv(longest, min(cdiv(programs, grid), max_splits))
    return [max(cdiv(L, chunk1), cdiv(L, chunk2)) for L in lens]


def decode(q, k, v, indptr, splits, sm_scale, max_splits, dev, want_lse=False):
    """decode_attention_fwd over contiguous keys (request b: rows indptr[b]:indptr[b+1] of k, v)."""
    from sglang.srt.layers.attention.triton_ops.decode_attention import decode_attention_fwd

    B, Hq, _ = q.shape
    Dv = v.shape[-1]
    logits = torch.empty(B, Hq, max_splits, Dv, dtype=torch.float32, device=dev)
    lse = torch.full((B, Hq, max_splits), float("nan"), dtype=torch.float32, device=dev)
    o = torch.empty(B, Hq, Dv, dtype=q.dtype, device=dev)
    n = int(indptr[-1])
    decode_attention_fwd(
        q.to(dev).contiguous(), k.to(dev).contiguous(), v.to(dev).contiguous(), o,
        indptr.to(dev, torch.int32), torch.arange(n, dtype=torch.int64, device=dev), logits, lse,
        torch.tensor(splits, dtype=torch.int32, device=dev), max_splits, sm_scale, 1.0, 1.0,
    )  # fmt: skip
    torch.cuda.synchronize(dev) if str(dev).startswith("cuda") else None
    return (o.double().cpu(), lse.cpu()) if want_lse else o.double().cpu()


def attention64(q, k, v, s=None, sm_scale=1.0):
    """float64 attention of one (request, head): q [D], k [L, D], v [L, Dv]; `s` the scores if given."""
    if s is None:
        s = (k.double() @ q.double()) * sm_scale
    return torch.softmax(s, 0) @ v.double()


def kernel_scores(q, k, sm_scale, max_splits, dev):
    """The kernel's own fp32 scores of one (request, head): every key alone in a one-key request of the
    MHA path; the stage-1 LSE of such a request is its score (e_max + log(1))."""
    L = k.shape[0]
    qs = q.reshape(1, 1, -1).expand(L, 1, -1).contiguous()
    indptr = torch.arange(L + 1, dtype=torch.int32)
    _, lse = decode(qs, k.reshape(L, 1, -1), k.reshape(L, 1, -1), indptr, [1] * L, sm_scale, max_splits, dev, True)
    return lse[:, 0, 0].double()


def load(path):
    from pathlib import Path

    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = Path(__file__).resolve().parent / path
    return torch.load(p, weights_only=True)


def random_inputs(L, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, 128, generator=g).to(torch.bfloat16)
    k = torch.randn(L, 1, 128, generator=g).to(torch.bfloat16)
    v = torch.randn(L, 1, 128, generator=g).to(torch.bfloat16)
    return {"case": f"random B=1 L={L} D=128", "q": q, "k": k, "v": v, "sm_scale": 128**-0.5, "seq_lens": [L],
            "kv_indptr": torch.tensor([0, L], dtype=torch.int32), "max_kv_splits": 8}  # fmt: skip


def slices(d):
    """(label, request, head, q [D], k [L, D], v [L, Dv]) of every (request, head) of the data."""
    q, k, v = d["q"], d["k"], d["v"]
    ind = [0, k.shape[0]] if "slice" in d else d["kv_indptr"].tolist()
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            rb, rh = d["slice"] if "slice" in d else (b, h)
            yield f"request {rb} head {rh}", b, h, q[b, h], k[ind[b] : ind[b + 1], h], v[ind[b] : ind[b + 1], h]


def ulps(err, ref):
    return err / 2.0 ** (math.floor(math.log2(max(ref.abs().max().item(), 1e-30))) - 7)


def run_file(d, a, dev, cores):
    """Steps 1-2 for one input file; returns the worst (kernel score error / fp32 worst case)."""
    sc, q, k, v = d["sm_scale"], d["q"], d["k"], d["v"]
    B, H = q.shape[0], q.shape[1]
    lens, heads = d["seq_lens"], d.get("heads", H)  # a slice's split count follows its whole batch
    all_splits = num_kv_splits(lens, heads, heads, a.max_kv_splits, cores)
    if "slice" in d:
        splits = [all_splits[d["slice"][0]]]
    else:
        splits = all_splits
    print(f"\n== {d['case']}: B = {B}, heads {H} (MHA), lengths {lens if len(lens) <= 8 else lens[:8] + ['...']}, "
          f"SGLang's splits {splits} ({cores} SMs)")  # fmt: skip
    if a.model_only:
        worst = (0.0, None)
        for label, _b, _h, qs, ks, vs in slices(d):
            ref = attention64(qs, ks, vs, sm_scale=sc)
            e = (bf(attention64(qs, ks, vs, s=bf16_scores_as_compiled(qs, ks, sc))) - ref).abs()
            e32 = (bf(attention64(qs, ks, vs, s=f32((ks.float() @ qs.float()).double() * sc))) - ref).abs()
            if e.max().item() > worst[0]:
                worst = (e.max().item(), f"{label} dim {e.argmax().item()} (fp32 scores: {e32.max().item():.3g})")
        print(
            f"model: bf16 scores as compiled, then exact attention, o rounded to bf16: worst {worst[0]:.4g} at {worst[1]}"
        )
        return 0.0
    indptr = d["kv_indptr"] if "slice" not in d else torch.tensor([0, k.shape[0]], dtype=torch.int32)
    o = decode(q, k, v, indptr, splits, sc, a.max_kv_splits, dev)
    o1 = decode(q, k, v, indptr, [1] * B, sc, a.max_kv_splits, dev)
    og = decode(
        q.repeat_interleave(2, 1), k, v, indptr, splits, sc, a.max_kv_splits, dev
    )  # grouped: 2 q heads per KV head
    worst_ratio, rows = 0.0, []
    for label, b, h, qs, ks, vs in slices(d):
        ref = attention64(qs, ks, vs, sm_scale=sc)
        s64 = (ks.double() @ qs.double()) * sc
        sk = kernel_scores(qs, ks, sc, a.max_kv_splits, dev)
        bound = (
            128 * 2.0**-24 / (1 - 128 * 2.0**-24) * (ks.double().abs() @ qs.double().abs()) * sc + 2.0**-24 * s64.abs()
        )
        ratio = ((sk - s64).abs() / bound).max().item()
        worst_ratio = max(worst_ratio, ratio)
        model_exact = (
            (sk == bf16_scores_as_compiled(qs, ks, sc)).float().mean().item() if ks.shape[-1] == 128 else float("nan")
        )
        e = (o[b, h] - ref).abs().max().item()
        e_own = (o[b, h] - attention64(qs, ks, vs, s=sk)).abs().max().item()
        e_one = (o1[b, h] - ref).abs().max().item()
        e_grp = max((og[b, 2 * h + j] - ref).abs().max().item() for j in (0, 1))
        rows.append((e, label, ks.shape[0], (sk - s64).abs().max().item(), ratio, model_exact, e_own, e_one, e_grp,
                     ulps(e, ref), ulps(e_own, ref)))  # fmt: skip
    print(
        "slice                      L  |s_kernel - s64|  /fp32-worst  model==kernel  o err (ulps)    o vs own-score ref (ulps)  1 split   grouped"
    )
    for e, label, L, ds, ratio, me, e_own, e_one, e_grp, u, u_own in sorted(rows, reverse=True)[:8]:
        print(f"{label:22s} {L:5d}  {ds:14.3g}  {ratio:11.1f}  {me:12.1%}  {e:8.3g} ({u:4.1f})  {e_own:8.3g} ({u_own:4.1f})"
              f"          {e_one:8.3g}  {e_grp:8.3g}")  # fmt: skip
    return worst_ratio


def main(argv=None) -> int:
    a = parse_args(argv)
    dev = torch.device(a.device if not a.model_only else "cpu")
    if not a.model_only:
        print(versions())
    cores = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 132
    files = [load(p) for p in (a.inputs or [DEFAULT_INPUTS])]
    if a.random:
        files.append(random_inputs(a.seq_len))
    worst = max(run_file(d, a, dev, cores) for d in files)
    if a.model_only:
        return 0
    print(f"\nworst kernel score error / the worst case of an fp32 sum: {worst:.3g}")
    if worst > 1:
        print("FINDING PRESENT: the MHA decode's scores are not fp32 sums (q.k reduced in bf16)")
        return 1
    print("FIXED: the MHA decode's scores are within fp32 summation error")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a crash is not the finding: exit 3, so 1 always means "still there"
        import traceback

        traceback.print_exc()
        sys.exit(3)
