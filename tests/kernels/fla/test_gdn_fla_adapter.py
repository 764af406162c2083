"""The fla adapter (kernels/fla/gdn.py) on a CPU, against a stand-in for fla-core 0.6.0's GDN API.

The stand-in implements fla's documented contracts (`[B, T, H, *]` tensors, varlen as B = 1 with
`cu_seqlens`, a dense `[N, HV, K, V]` initial state, the final states returned as a new tensor,
gating fused with `use_gate_in_kernel` / `use_beta_sigmoid_in_kernel`) on the float64 recurrence, so
these tests check the adapter's gathers (prepare), scatters (finalize) and views through the harness
checks, and that the timed closure is fla's call alone. The real kernels run in
tests/kernels/test_gdn_gpu.py.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from attnbench.backend import Backend, implements
from attnbench.case import Case
from attnbench.kernels.fla import gdn as fla_gdn
from attnbench.references import gdn as ref
from helpers import run_one
from kernel_only import watch_kernels


def _run(q, k, v, g, beta, scale, h0):
    o, final, _ = ref.recurrent_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0.double())
    return o, final


def _fused_recurrent(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None, dt_bias=None,
                     use_beta_sigmoid_in_kernel=False):  # fmt: skip
    assert output_final_state and use_qk_l2norm_in_kernel and use_gate_in_kernel and use_beta_sigmoid_in_kernel
    B = q.shape[0]
    o = torch.empty(*v.shape, dtype=q.dtype)
    ht = torch.empty_like(initial_state)
    for i in range(B):
        gi, bi = ref.gating(A_log, g[i], dt_bias, beta[i])
        oi, ht_i = _run(q[i], k[i], v[i], gi, bi, scale, initial_state[i])
        o[i], ht[i] = oi.to(o.dtype), ht_i.float()
    return o, ht


def _chunk(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
           use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None):  # fmt: skip
    assert q.shape[0] == 1 and output_final_state and use_qk_l2norm_in_kernel
    cu = cu_seqlens_cpu.tolist()
    o = torch.empty(*v.shape, dtype=q.dtype)
    ht = torch.empty_like(initial_state)
    for i in range(len(cu) - 1):
        s, e = cu[i], cu[i + 1]
        oi, ht_i = _run(q[0, s:e], k[0, s:e], v[0, s:e], g[0, s:e], beta[0, s:e], scale, initial_state[i])
        o[0, s:e], ht[i] = oi.to(o.dtype), ht_i.float()
    return o, ht


@pytest.fixture
def fake_fla(monkeypatch):
    mods = {name: types.ModuleType(name) for name in ("fla", "fla.ops", "fla.ops.gated_delta_rule")}
    gdr = mods["fla.ops.gated_delta_rule"]
    gdr.fused_recurrent_gated_delta_rule, gdr.chunk_gated_delta_rule = _fused_recurrent, _chunk
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return gdr


class _Adapter(Backend):
    name = "fla-gdn-adapter-test"

    @implements("gdn_decode")
    def prepare_gdn_decode(self, case, x):
        return fla_gdn.prepare_decode(case, x)

    @implements("gdn_extend")
    def prepare_gdn_extend(self, case, x):
        return fla_gdn.prepare_extend(case, x)


CASES = [
    "gdn_decode/b5-h2x4-d16x16-pad2-bf16",
    "gdn_decode/b4-h2x4-d16x16-packed-fp32",
    "gdn_extend/b3-t70-mixed-h2x4-d16x16-initmixed-bf16",
    "gdn_extend/b2-t9-h1x2-d32x16-initnone-fp32",
]


@pytest.mark.parametrize("case_id", CASES)
def test_fla_gdn_adapter_conventions(case_id, fake_fla):
    r = run_one(case_id, _Adapter())
    assert r.status == "pass", f"{r.status}: {r.reason}"


@pytest.mark.parametrize(
    "case_id, kernel",
    [
        ("gdn_decode/b5-h2x4-d16x16-pad2-bf16", "fused_recurrent_gated_delta_rule"),
        ("gdn_extend/b3-t70-mixed-h2x4-d16x16-initmixed-bf16", "chunk_gated_delta_rule"),
    ],
)
def test_fla_gdn_timed_closure_is_the_kernel_alone(case_id, kernel, fake_fla, monkeypatch):
    """fla's kernel and the gather of the requests' states from the pool (fla has no pool: a server
    using it pays that gather every step, so it is timed, in one named function); nothing else."""
    from attnbench.kernels.fla import gdn as fla_gdn

    rec = watch_kernels(monkeypatch, [(fake_fla, kernel), (fla_gdn, "_dense_initial_state")])
    case = Case.from_id(case_id)
    fn = _Adapter().prepare(case, case.make_inputs())
    with rec:
        fn()
    assert rec.outside == []
