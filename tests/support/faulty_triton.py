"""Deliberately faulty Triton decode kernels, as an attnbench plugin (`--plugin tests/support/faulty_triton.py`).

Both compute correct outputs, so the plain checks (NaN poison, canaries, the float64 reference) pass
them; both read memory they must not, which is what `--sanitize memcheck` is for:

- `faulty-seq`: reads the page-table entry of position seq_len, one key past each sequence, and
  never uses it (its K/V loads are masked right). For every request but the last this lands on
  finite data (the next request's page id); for the last it reads past the page table.
- `faulty-page`: prefetches the row one past the end of every page it reads and never uses it
  in a way that changes the result. On the pool's last page that row lies past the cache.

And `faulty-crash` stores its output 2**40 elements off: an illegal address that breaks the CUDA
context (the reliability test: an error row, a fresh worker, the sweep goes on).

One program per (request, query head); keys in blocks of BLOCK_N. No window, soft cap, sinks, MLA
or fp8: the cases that need them are skips.
"""

from __future__ import annotations

import triton
import triton.language as tl

import attnbench
from attnbench.kernels.triton import interpreting


@triton.jit
def _faulty_decode_kernel(
    q_ptr, k_ptr, v_ptr, indptr_ptr, pages_ptr, lens_ptr, o_ptr, lse_ptr,
    sm_scale, group,
    stride_qt, stride_qh, stride_kp, stride_kh, stride_vp, stride_vh, stride_ot, stride_oh, stride_lt,
    PAGE: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, BUG: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // group
    seq_len = tl.load(lens_ptr + b)
    first = tl.load(indptr_ptr + b)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * stride_qt + h * stride_qh + d).to(tl.float32)
    m = tl.full([1], float("-inf"), tl.float32)
    s = tl.zeros([1], tl.float32)
    acc = tl.zeros([D], tl.float32)
    for start in range(0, seq_len + 1, BLOCK_N):  # one block too many when seq_len % BLOCK_N == 0
        offs = start + tl.arange(0, BLOCK_N)
        valid = offs < seq_len
        reach = (offs <= seq_len) if BUG == 1 else valid  # BUG 1: the page-table entry one key past the sequence
        page = tl.load(pages_ptr + first + offs // PAGE, mask=reach, other=0)
        row = page.to(tl.int64) * PAGE + offs % PAGE
        k = tl.load(k_ptr + row[:, None] * stride_kp + kvh * stride_kh + d[None, :], mask=valid[:, None], other=0.0)
        v = tl.load(v_ptr + row[:, None] * stride_vp + kvh * stride_vh + d[None, :], mask=valid[:, None], other=0.0)
        if BUG == 2:  # prefetch the row after the page's last one
            last = (offs % PAGE == PAGE - 1) & valid
            nxt = (page.to(tl.int64) + 1) * PAGE
            extra = tl.load(
                k_ptr + nxt[:, None] * stride_kp + kvh * stride_kh + d[None, :], mask=last[:, None], other=0.0
            )
            k = tl.where(valid[:, None], k, extra)  # never changes a valid row; keeps the load alive
        k = tl.where(valid[:, None], k.to(tl.float32), 0.0)
        v = tl.where(valid[:, None], v.to(tl.float32), 0.0)
        qk = tl.sum(q[None, :] * k, axis=1) * sm_scale
        qk = tl.where(valid, qk, float("-inf"))
        m_new = tl.maximum(m, tl.max(qk, axis=0))
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(qk - safe)
        alpha = tl.exp(m - safe)
        s = s * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    out = acc / tl.where(s > 0, s, 1.0)
    far = (1 << 40) if BUG == 3 else 0  # BUG 3: a store into unmapped memory (breaks the CUDA context)
    tl.store(o_ptr + far + b * stride_ot + h * stride_oh + d, out.to(o_ptr.dtype.element_ty))
    lse = tl.where(s > 0, m + tl.log(s), float("-inf"))
    tl.store(lse_ptr + b * stride_lt + h + tl.arange(0, 1), lse)


class _Faulty(attnbench.Backend):
    bug = 0
    description = "deliberately faulty Triton decode (plugin for testing --sanitize)"

    def supports(self, case):
        p = case.params
        if case.op_name != "decode":
            return "only decode"
        if not case.device.startswith("cuda") and not interpreting():
            return "Triton needs a CUDA GPU (or TRITON_INTERPRET=1)"
        if getattr(p, "head_dim_v", None) not in (None, p.head_dim) or p.head_dim & (p.head_dim - 1):
            return "power-of-two head dim, Dk = Dv only"
        if p.window >= 0 or p.soft_cap or p.sinks or p.kv_dtype != "auto" or p.mla:
            return "no window, soft cap, sinks, fp8 or MLA"
        return None

    def prepare_decode(self, case, x):
        B, Hq, D = x.q.shape
        Hkv = x.k_cache.shape[2]
        kc, vc = x.k_cache.flatten(0, 1), x.v_cache.flatten(0, 1)

        def run():
            _faulty_decode_kernel[(B, Hq)](
                x.q, kc, vc, x.kv_indptr, x.kv_page_indices, x.seq_lens, x.o, x.lse,
                x.sm_scale, Hq // Hkv,
                x.q.stride(0), x.q.stride(1), kc.stride(0), kc.stride(1), vc.stride(0), vc.stride(1),
                x.o.stride(0), x.o.stride(1), x.lse.stride(0),
                PAGE=x.page_size, D=D, BLOCK_N=16, BUG=self.bug,
            )  # fmt: skip
            return {"o": x.o, "lse": x.lse}

        return run


@attnbench.register_backend("faulty-seq")
class FaultySeq(_Faulty):
    bug = 1


@attnbench.register_backend("faulty-page")
class FaultyPage(_Faulty):
    bug = 2


@attnbench.register_backend("faulty-crash")
class FaultyCrash(_Faulty):
    bug = 3


@attnbench.register_backend("faulty-none")
class Clean(_Faulty):
    """The same kernel without a bug: memcheck must find nothing in it."""

    bug = 0
