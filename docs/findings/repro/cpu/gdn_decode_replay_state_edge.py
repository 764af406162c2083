"""gdn_decode/b256-h16x32-d128x128-bf16, replay check: one state_pool element 1.5% over its bound (CPU).

Observation (H200 today; H100 sessions 13, 14): FlashInfer's GDN decode and our CuTe GDN decode fail the
replay check with the same numbers, "state_pool: abs error 8.88e-07 > bound 8.75e-07 of its
request/head slice (2x twin 5.34e-08 + floor 7.68e-07 = 8.75e-07) at slot 21 head 24 k 95 v 4".

Unlike the GPU reproducers one directory up (tests/docs/test_findings_repro.py: torch and the library
only, `--device`), this CPU diagnostic lives in repro/cpu/ because it IMPORTS ATTNBENCH, only to build the exact inputs (Case.from_id, Op.make_inputs,
Op.replay_batch: batch A and the replay check's batch B, same seeds) and for the float64 reference and
its fp32 twin (references/gdn.py) and the tolerance Rule (harness/check/tolerance.py). Everything else
(the pool's history before the replay, the kernel emulations) is written out here.

What it does, for the one (slot 21, v-head 24) slice:
1. the pool slot's history on the backend before batch B (harness/check: first call on A, the stale
   check's five perturbations, which accumulate for an op that writes its inputs, then the replay's
   warm-up on A), emulated with the FlashInfer/CuTe fp32 arithmetic;
2. batch B's float64 expectation, twin, slice scale and bound for that slice, as checks.reference_side
   makes them (2x twin + 2 * (u32 + sqrt(K) u32) * scale, capped by the tensor's bound);
3. fp32 emulations of the step with several gate implementations (accurate fp32 log/exp as the twin;
   fastmath exp/log as ex2(x log2e) and lg2(x) ln2, each fast exp moved by 0 or +-2 ulp, lg2(1 + e)
   given an ABSOLUTE error of 0, +-2^-23 or +-2^-22, the size of a fast log2's error near 1) and
   several reduction orders for S^T k
   (sequential, pairwise, FlashInfer's 32-lane butterfly, our CuTe kernel's 8-row + butterfly +
   4-warp order; fma or mul+add); the error at (k 95, v 4) and the slice's worst error / bound;
4. the first-order split of the error into its gate part (decay exp(g)) and its S^T k part.

Run: python docs/findings/repro/cpu/gdn_decode_replay_state_edge.py   (CPU, ~15 s, ~4 GB). Exit 0.
Report: docs/findings/reports/gdn_decode_replay_state_edge.md.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from attnbench.case import Case
from attnbench.check.tolerance import Rule
from attnbench.references import gdn as ref

CASE = "gdn_decode/b256-h16x32-d128x128-bf16"
SLOT, HEAD, KI, VI = 21, 24, 95, 4
F32, F64 = np.float32, np.float64
U32 = 2.0**-24
LG2_ERR = (-(2.0**-22), -(2.0**-23), 0.0, 2.0**-23, 2.0**-22)  # absolute errors tried on lg2(1 + e), log2 units


# ---- fp32 primitives ----------------------------------------------------------------------------
def r32(x):
    return np.asarray(x, dtype=F64).astype(F32)


def fma32(a, b, c):
    """fma in fp32: a*b exact in float64 for fp32 a, b; one rounding (double rounding ignored)."""
    return r32(F64(a) * F64(b) + F64(c))


def ulp_step(x, n):
    """x moved by n ulps (fp32)."""
    x = F32(x)
    for _ in range(abs(n)):
        x = np.nextafter(x, F32(np.inf) if n > 0 else F32(-np.inf))
    return x


LOG2E, LN2 = r32(math.log2(math.e)), r32(math.log(2.0))


def exp_acc(x):
    return r32(math.exp(F64(x)))


def log_acc(x):
    return r32(math.log(F64(x)))


def exp_fast(x, d=0):
    """fastmath exp: ex2(x * log2e), the product rounded to fp32, ex2 correctly rounded then moved d ulps."""
    return ulp_step(r32(2.0 ** F64(r32(F64(x) * F64(LOG2E)))), d)


def log_fast(x, d=0.0):
    """fastmath log: lg2(x) * ln2, lg2 correctly rounded then moved by `d` (ABSOLUTE, in log2 units: the
    approximate lg2 has an absolute error bound near 1, not a relative one), the product rounded."""
    return r32((F64(r32(math.log2(F64(x)))) + d) * F64(LN2))


def gates(a, dt, A_log, b, kind="accurate", d=(0, 0.0, 0, 0)):
    """(decay, beta, softplus) in fp32 as a kernel forms them: x = a + dt; sp = log(1 + exp(x)) (x above
    20); g = -exp(A_log) * sp; decay = exp(g); beta = 1 / (1 + exp(-b)). kind "fast": exp as ex2(x log2e),
    log as lg2(x) ln2; `d`: ulp moves of the fast exp(x), the absolute error added to lg2(1 + e), ulp
    moves of exp(A_log) and exp(g)."""
    x = r32(F64(a) + F64(dt))
    if kind == "accurate":
        sp = x if x > 20 else log_acc(r32(1.0 + F64(exp_acc(x))))
        A = exp_acc(A_log)
        g = r32(-F64(A) * F64(sp))
        decay = exp_acc(g)
        beta = r32(1.0 / F64(r32(1.0 + F64(exp_acc(-F64(b))))))
    else:
        sp = x if x > 20 else log_fast(r32(1.0 + F64(exp_fast(x, d[0]))), d[1])
        A = exp_fast(A_log, d[2])
        g = r32(-F64(A) * F64(sp))
        decay = exp_fast(g, d[3])
        beta = r32(1.0 / F64(r32(1.0 + F64(exp_fast(-F64(b))))))
    return decay, beta, sp


def l2n(x, fast=True):
    """x / sqrt(sum x^2 + 1e-6) in fp32: 32 lanes of 4 (sequential fma), butterfly, rsqrt, multiply."""
    x = x.astype(F32)
    part = np.zeros(32, F32)
    for l in range(32):
        s = F32(0)
        for i in range(4):
            s = fma32(x[4 * l + i], x[4 * l + i], s)
        part[l] = s
    for off in (16, 8, 4, 2, 1):
        part = r32(F64(part) + F64(part[np.arange(32) ^ off]))
    inv = r32(1.0 / math.sqrt(F64(r32(F64(part[0]) + 1e-6))))
    return r32(F64(x) * F64(inv))


# ---- S^T k reductions over K = 128 for every column v (h: [K, V] fp32 decayed, k: [K]) ----------
def red_seq(h, k, fma=True):
    s = np.zeros(h.shape[1], F32)
    for i in range(h.shape[0]):
        s = fma32(h[i], k[i], s) if fma else r32(F64(s) + F64(r32(F64(h[i]) * F64(k[i]))))
    return s


def red_pair(h, k, fma=True):
    p = r32(F64(h) * F64(k)[:, None])
    while p.shape[0] > 1:
        p = r32(F64(p[0::2]) + F64(p[1::2]))
    return p[0]


def red_flashinfer(h, k, fma=True):
    """lane l holds k rows 4l..4l+3: sequential (fma) over its 4, then butterfly 16, 8, 4, 2, 1."""
    lanes = np.stack([red_seq(h[4 * l : 4 * l + 4], k[4 * l : 4 * l + 4], fma) for l in range(32)])
    for off in (16, 8, 4, 2, 1):
        lanes = r32(F64(lanes) + F64(lanes[np.arange(32) ^ off]))
    return lanes[0]


def red_cute(h, k, fma=True):
    """ours (kernels/cute/gdn_decode.py): a thread sums 8 rows, butterflies 16, 8 over the 4 row groups of a
    warp (lane = row group * 8 + column lane), then the 4 warps' partials summed in order from 0."""
    per = np.stack([red_seq(h[8 * t : 8 * t + 8], k[8 * t : 8 * t + 8], fma) for t in range(16)])  # [16, V]
    warps = []
    for w in range(4):
        g = per[4 * w : 4 * w + 4]  # row groups 0..3 of warp w
        g = r32(F64(g) + F64(g[[2, 3, 0, 1]]))  # offset 16: row group ^ 2
        g = r32(F64(g) + F64(g[[1, 0, 3, 2]]))  # offset 8: row group ^ 1
        warps.append(g[0])
    tot = np.zeros(h.shape[1], F32)
    for w in range(4):
        tot = r32(F64(tot) + F64(warps[w]))
    return tot


REDUCTIONS = {
    "sequential": red_seq,
    "pairwise": red_pair,
    "flashinfer-32-lane": red_flashinfer,
    "cute-8row-4warp": red_cute,
}


def step32(S, q, k, v, decay, beta, red, fma=True, kn=None):
    """One fp32 decode step on one slice: S [K, V] fp32. Returns the new state (fp32)."""
    kn = l2n(k) if kn is None else kn
    h = r32(F64(S) * F64(decay))
    t = red(h, kn, fma)
    u = r32(F64(r32(F64(v.astype(F32)) - F64(t))) * F64(beta))
    upd = fma32(kn[:, None], u[None, :], h) if fma else r32(F64(h) + F64(r32(F64(kn)[:, None] * F64(u)[None, :])))
    return upd


def f64_step(S, q, k, v, a, b, A_log, dt):
    """float64 reference of one step on one slice (references/gdn.py, HV = H = 1)."""
    pool = torch.from_numpy(np.asarray(S, F32))[None, None]
    _, out = ref.gdn_decode(q[None, None], k[None, None], v[None, None], a.view(1, 1), b.view(1, 1),
                            A_log.view(1), dt.view(1), pool, torch.tensor([0]), precision=torch.float64)  # fmt: skip
    return out[0, 0].numpy()


def main() -> int:
    case = Case.from_id(CASE)
    op, p = case.op, case.params
    x = case.make_inputs()
    pb, xb = op.replay_batch(p, x, case.torch_dtype, case.seed)
    grp = p.heads_v // p.heads_qk
    qh = HEAD // grp
    sa, sb = x.state_indices.tolist(), xb.state_indices.tolist()
    ra, rb = sa.index(SLOT), sb.index(SLOT)
    print(f"{CASE}: batch A slots {sa[:6]}..., batch B slots {sb[:6]}... (pad {pb.pad})")
    print(f"slot {SLOT}: request {ra} of A, request {rb} of B; v-head {HEAD} reads q/k head {qh}")

    def data(t, r, neg=()):
        def g(name, h):
            z = getattr(t, name)[r, h].clone()
            return -z if name in neg else z

        return dict(q=g("q", qh), k=g("k", qh), v=g("v", HEAD), a=g("a", HEAD), b=g("b", HEAD))

    A_log, dt = x.A_log[HEAD], x.dt_bias[HEAD]
    # the slot's history before B: call 1 (A); stale check's perturbations in op order, each starting from
    # the inputs the previous left in the closure's buffers (checks._base clones `work` for an op that
    # writes inputs); the last rolls the slots (request ra + 1 takes slot 21); the replay's warm-up on A.
    hist = [("outputs call, A", data(x, ra)),
            ("stale: queries", data(x, ra, ("q",))),
            ("stale: keys", data(x, ra, ("q", "k"))),
            ("stale: values", data(x, ra, ("q", "k", "v"))),
            ("stale: raw gates", data(x, ra, ("q", "k", "v", "a", "b"))),
            ("stale: slots rolled", data(x, ra + 1, ("q", "k", "v", "a", "b"))),
            ("replay warm-up, A", data(x, ra))]  # fmt: skip
    S = x.state_pool[SLOT, HEAD].numpy().astype(F32)
    for name, d in hist:
        dec, bet, _ = gates(d["a"].item(), dt.item(), A_log.item(), d["b"].item(), "fast")
        S = step32(S, None, d["k"].float().numpy(), d["v"].float().numpy(), dec, bet, red_flashinfer)
        print(f"  {name:22s} decay {dec:.6g} beta {bet:.4f}  max|S| {np.abs(S).max():.4f}")
    S_in = S

    # B's expectation for the slice; twin from the whole batch (as batch_b computes it) and on the slice
    xb.state_pool[SLOT, HEAD] = torch.from_numpy(S_in)
    e64 = op.expected(pb, xb, torch.float64)["state_pool"]
    tw = op.expected(pb, xb, case.torch_dtype)["state_pool"]
    r = e64[SLOT, HEAD].numpy()
    twin = tw[SLOT, HEAD].numpy().astype(F64)
    del e64, tw
    d = data(xb, rb)
    _u32, sqrt_n = U32, math.sqrt(p.head_dim_k)
    twin_s, scale_s = np.abs(twin - r).max(), np.abs(r).max()
    floor_s = Rule().floor_abs(torch.float32, scale_s, sqrt_n, ulps=2)
    bound_s = 2 * twin_s + floor_s
    print(f"\nbatch B, slot {SLOT} head {HEAD}: a {d['a'].item():.4g} b {d['b'].item():.4g} A_log {A_log.item():.4f} "
          f"(A = {math.exp(A_log.item()):.3f}) dt_bias {dt.item():.4g}")  # fmt: skip
    print(
        f"  slice scale max|ref| {scale_s:.4f}; twin error {twin_s:.3e}; floor 2*(1+sqrt(128))*u32*scale "
        f"{floor_s:.3e}; bound 2x twin + floor = {bound_s:.3e}"
    )
    print("  (GPU message: 2x twin 5.34e-08 + floor 7.68e-07 = 8.75e-07)")
    print(
        f"  element (k {KI}, v {VI}): ref {r[KI, VI]:+.9f}, |S_in| {abs(S_in[KI, VI]):.4f}, twin err "
        f"{abs(twin[KI, VI] - r[KI, VI]):.2e}"
    )

    # float64 pieces of the step: decay, beta, k^, the S^T k column, sensitivities
    xa = F64(d["a"].item()) + F64(dt.item())
    sp64 = xa if xa > 20 else math.log1p(math.exp(xa))
    A64 = math.exp(F64(A_log.item()))
    dec64 = math.exp(-A64 * sp64)
    kk = d["k"].double().numpy()
    kn64 = kk / math.sqrt((kk * kk).sum() + 1e-6)
    # first order: dS'[k,v]/d(decay) = S[k,v] - beta k^[k] (S^T k^)[v]
    bet64 = 1 / (1 + math.exp(-F64(d["b"].item())))
    Sk = S_in.astype(F64).T @ kn64
    dS_ddec = S_in.astype(F64) - bet64 * np.outer(kn64, Sk)
    print(f"  x = a + dt_bias {xa:.6g}, softplus {sp64:.6g}, g {-A64 * sp64:.6g}, decay {dec64:.8f}, beta {bet64:.6f}")
    print(
        f"  d S'[{KI},{VI}] / d decay = {dS_ddec[KI, VI]:+.4f} (max over the slice {np.abs(dS_ddec).max():.4f} at "
        f"{np.unravel_index(np.abs(dS_ddec).argmax(), dS_ddec.shape)}); k^[{KI}] = {kn64[KI]:+.4f}"
    )
    need = 8.88e-7 / abs(dS_ddec[KI, VI])
    print(
        f"  a decay error alone gives 8.88e-07 there at |d decay| = {need:.3e} = {need / dec64:.3e} relative "
        f"= {need / dec64 / U32:.1f} u32; through g = -A sp: |d sp| = {need / dec64 / A64:.3e} "
        f"(= {need / dec64 / A64 / 2**-24:.2f} x 2^-24 absolute)"
    )

    # fp32 emulations
    print("\nfp32 emulations of B's step on the slice (error vs float64 at the element, worst over the slice / bound):")
    rows = []
    kn32 = l2n(d["k"].float().numpy())
    v32 = d["v"].float().numpy()
    gate_variants = [("accurate exp/log (the twin's)", "accurate", (0, 0.0, 0, 0))]
    for e0, dl, e2, e3 in itertools.product((-2, 0, 2), LG2_ERR, (-2, 0, 2), (-2, 0, 2)):
        gate_variants.append(
            (f"fast, exp ulps {e0:+d}/{e2:+d}/{e3:+d}, lg2 {dl / 2**-22:+.2f}*2^-22", "fast", (e0, dl, e2, e3))
        )
    for gname, kind, dd in gate_variants:
        dec, bet, sp = gates(d["a"].item(), dt.item(), A_log.item(), d["b"].item(), kind, dd)
        every = kind == "accurate" or dd[0] == dd[2] == dd[3] == 0  # every order here, else FlashInfer's with fma
        for rname, red in REDUCTIONS.items() if every else [("flashinfer-32-lane", red_flashinfer)]:
            for fma in (True, False) if every else (True,):
                out = step32(S_in, None, None, v32, dec, bet, red, fma, kn=kn32)
                err = np.abs(out.astype(F64) - r)
                rows.append(
                    (gname, rname, fma, dec, sp, err[KI, VI], err.max(), np.unravel_index(err.argmax(), err.shape))
                )
    print(
        f"  {'gates':38s} {'S^T k order':20s} fma  {'decay':>12s} {'softplus':>12s} {'err@elem':>9s} {'/bound':>6s} {'slice max':>9s} {'/bound':>6s}  at"
    )
    shown = [
        r_
        for r_ in rows
        if r_[0].startswith("accurate")
        or "+0/+0/+0, lg2 +0.00" in r_[0]
        or (r_[1] == "flashinfer-32-lane" and r_[2] and "+0/+0/+0" in r_[0])
    ]
    for gname, rname, fma, dec, sp, e, emax, at in shown:
        print(
            f"  {gname:38s} {rname:20s} {str(fma)[0]:3s}  {dec:.10f} {sp:.10f} {e:9.3e} {e / bound_s:6.3f} {emax:9.3e} {emax / bound_s:6.3f}  {at}"
        )
    # the gate variants, for the FlashInfer order with fma: the range each gate error reaches
    print(
        "\n  every gate variant, FlashInfer order, fma: error at the element / bound (min .. max over the exp ulp moves)"
    )
    for dl in LG2_ERR:
        es = [
            r_[5] for r_ in rows if r_[1] == "flashinfer-32-lane" and r_[2] and f"lg2 {dl / 2**-22:+.2f}*2^-22" in r_[0]
        ]
        print(f"    lg2(1 + e) off by {dl / 2**-22:+.2f} * 2^-22: {min(es) / bound_s:.3f} .. {max(es) / bound_s:.3f}")
    # the lg2 error at which the element reaches the GPU's 8.88e-07 and the bound (first order, exact gates otherwise)
    pred = lambda dl: (
        A64 * dl * math.log(2) / (1 + math.exp(xa)) * 0 + A64 * dl * math.log(2) * dec64 * abs(dS_ddec[KI, VI])
    )  # noqa: E731
    per = pred(2.0**-22)
    print(
        f"  first order: an absolute error dl on lg2(1 + e) moves S'[{KI},{VI}] by A ln2 dl decay dS'/ddecay = "
        f"{per:.3e} per 2^-22; 8.88e-07 at |dl| = {8.88e-7 / per:.2f} * 2^-22 = 2^{math.log2(8.88e-7 / per * 2**-22):.2f}, "
        f"the bound at {bound_s / per:.2f} * 2^-22"
    )
    over = [r_ for r_ in rows if r_[5] > bound_s]
    print(
        f"\n  variants over the bound at the element: {len(over)} of {len(rows)}; "
        f"the accurate-gate ones: {sum(1 for r_ in over if r_[0].startswith('accurate'))}"
    )
    # the slice with the lg2 error that gives the GPU's 8.88e-07 at the element (first order), FlashInfer order
    dl = -8.88e-7 / per * 2.0**-22
    dec, bet, _ = gates(d["a"].item(), dt.item(), A_log.item(), d["b"].item(), "fast", (0, dl, 0, 0))
    out = step32(S_in, None, None, v32, dec, bet, red_flashinfer, True, kn=kn32)
    e = out.astype(F64) - r
    ratio = np.abs(e) / bound_s
    qs = np.quantile(ratio, [0.5, 0.9, 0.99, 0.999, 1.0])
    print(
        f"  slice with lg2(1 + e) off by {dl / 2**-22:+.3f} * 2^-22: error at the element {abs(e[KI, VI]):.3e}; error / bound: "
        f"median {qs[0]:.3f}, 90% {qs[1]:.3f}, 99% {qs[2]:.3f}, 99.9% {qs[3]:.3f}, max {qs[4]:.3f} at "
        f"{tuple(int(i) for i in np.unravel_index(ratio.argmax(), ratio.shape))}; elements over: {int((ratio > 1).sum())} of {ratio.size}"
    )
    corr = np.corrcoef(e.ravel(), dS_ddec.ravel())[0, 1]
    print(f"  correlation of that error with d S'/d decay over the slice: {corr:+.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
