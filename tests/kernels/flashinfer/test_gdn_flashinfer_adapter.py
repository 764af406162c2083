"""The FlashInferGDN adapter's conventions, checked on a CPU against a stand-in for FlashInfer's API.

The stand-in implements the documented contracts of FlashInfer 0.7.2.post1 (K-last states `[.., V, K]`,
prefill gate alpha = exp(g) in linear space, MTP intermediate states `[B, T, HV, V, K]`, -1 pool
indices skipped) on top of the float64 recurrence, so these tests check the adapter's layout and
gate conversions, gathers and scatters through the harness checks; the real kernels run in
tests/kernels/test_gdn_gpu.py.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from attnbench.backend import Backend
from attnbench.kernels.flashinfer.gdn import FlashInferGDN
from attnbench.references import gdn as ref
from helpers import run_one
from kernel_only import watch_kernels


def _steps(q, k, v, g, beta, h0_vk, scale):
    """One sequence: q/k `[T, H, K]`, v `[T, HV, V]`, g log-space; h0 K-last `[HV, V, K]` or None."""
    h0 = None if h0_vk is None else h0_vk.double().transpose(-1, -2)
    o, final, states = ref.recurrent_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0)
    return o, final.transpose(-1, -2), states.transpose(-1, -2)


def _decode_pretranspose(
    q,
    k,
    v,
    state,
    A_log,
    a,
    dt_bias,
    b,
    scale=None,
    output=None,
    use_qk_l2norm=True,
    initial_state=None,
    initial_state_indices=None,
):
    """Dense `state [B, HV, V, K]`, or (state None) the pool `initial_state [P, HV, V, K]` addressed by
    `initial_state_indices` (fp32 legacy path: -1 skipped, its output row written as zeros)."""
    pool = initial_state if state is None else state
    slots = initial_state_indices.tolist() if state is None else list(range(q.shape[0]))
    assert use_qk_l2norm and pool.dtype == torch.float32 and pool.shape[-2:] == (v.shape[-1], q.shape[-1])
    g, beta = ref.gating(A_log, a, dt_bias, b)
    for i, slot in enumerate(slots):
        if slot < 0:
            output[i] = 0
            continue
        o, final, _ = _steps(q[i], k[i], v[i], g[i], beta[i], pool[slot], scale)
        output[i] = o.to(output.dtype)
        pool[slot] = final.float()
    return output, pool


def _mtp(
    q,
    k,
    v,
    initial_state,
    initial_state_indices,
    A_log,
    a,
    dt_bias,
    b,
    scale=None,
    output=None,
    intermediate_states_buffer=None,
    disable_state_update=None,
    use_qk_l2norm=True,
):
    assert disable_state_update is True and use_qk_l2norm
    g, beta = ref.gating(A_log, a, dt_bias, b)
    for i, slot in enumerate(initial_state_indices.tolist()):
        if slot < 0:  # padding: skipped
            continue
        o, _, states = _steps(q[i], k[i], v[i], g[i], beta[i], initial_state[slot], scale)
        output[i] = o.to(output.dtype)
        intermediate_states_buffer[i] = states.float()
    return output, initial_state


def _chunk(
    q,
    k,
    v,
    g=None,
    beta=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    use_qk_l2norm_in_kernel=False,
    output=None,
    output_state=None,
    max_seqlen=None,
    state_indices=None,
):
    """Sequence i reads `initial_state[state_indices[i]]` and writes `output_state[state_indices[i]]`
    (rows in sequence order without `state_indices`)."""
    assert use_qk_l2norm_in_kernel and output_final_state and g.dtype == torch.float32
    cu = cu_seqlens.tolist()
    rows = state_indices.tolist() if state_indices is not None else list(range(len(cu) - 1))
    finals = []
    for i, row in enumerate(rows):
        s, e = cu[i], cu[i + 1]
        log_g = torch.log(g[s:e].double())  # FlashInfer's gate is alpha = exp(g)
        o, final, _ = _steps(q[s:e], k[s:e], v[s:e], log_g, beta[s:e], initial_state[row], scale)
        output[s:e] = o.to(output.dtype)
        finals.append(final.float())
    for row, final in zip(rows, finals):  # written after every read (output_state may be initial_state)
        output_state[row] = final
    return output, output_state


@pytest.fixture
def fake_flashinfer(monkeypatch):
    pkg = types.ModuleType("flashinfer")
    dec, pre = types.ModuleType("flashinfer.gdn_decode"), types.ModuleType("flashinfer.gdn_prefill")
    dec.gated_delta_rule_decode_pretranspose, dec.gated_delta_rule_mtp = _decode_pretranspose, _mtp
    pre.chunk_gated_delta_rule = _chunk
    pkg.gdn_decode, pkg.gdn_prefill = dec, pre
    for name, mod in (("flashinfer", pkg), ("flashinfer.gdn_decode", dec), ("flashinfer.gdn_prefill", pre)):
        monkeypatch.setitem(sys.modules, name, mod)


class _Adapter(FlashInferGDN, Backend):
    name = "flashinfer-gdn-adapter-test"

    def limits(self, case):
        return None  # the stand-in kernels run any shape and dtype on the CPU (the limits are tested below)


CASES = [
    "gdn_decode/b5-h2x4-d16x16-pad2-bf16",
    "gdn_decode/b4-h2x4-d16x16-packed-bf16",
    "gdn_verify/b3-t4-h2x4-d16x16-pad1-bf16",
    "gdn_verify/b2-t3-h1x2-d16x32-fp16",
    "gdn_extend/b3-t70-mixed-h2x4-d16x16-initmixed-bf16",
]


@pytest.mark.parametrize("case_id", CASES)
def test_flashinfer_gdn_adapter_conventions(case_id, fake_flashinfer):
    r = run_one(case_id, _Adapter())
    assert r.status == "pass", f"{r.status}: {r.reason}"


def test_flashinfer_gdn_fp16_reasons():
    """fp16: FlashInfer's decode/MTP kernels reject an fp16 dt_bias (and write o in bf16); its prefill takes fp16."""
    from attnbench.case import Case
    from attnbench.kernels.flashinfer.gdn import gdn_unsupported

    for case_id in ("gdn_decode/b8-h16x32-d128x128-fp16", "gdn_verify/b2-t4-h16x32-d128x128-fp16"):
        assert "dt_bias" in gdn_unsupported(Case.from_id(case_id, "cuda"))
    assert gdn_unsupported(Case.from_id("gdn_extend/b2-t130-h16x32-d128x128-fp16", "cuda")) is None
    assert gdn_unsupported(Case.from_id("gdn_decode/b8-h16x32-d128x128-bf16", "cuda")) is None


TIMED_ONLY_KERNEL = [
    ("gdn_decode/b5-h2x4-d16x16-pad2-bf16", "gdn_decode", "gated_delta_rule_decode_pretranspose"),
    ("gdn_verify/b3-t4-h2x4-d16x16-pad1-bf16", "gdn_decode", "gated_delta_rule_mtp"),
    ("gdn_extend/b3-t70-mixed-h2x4-d16x16-initmixed-bf16", "gdn_prefill", "chunk_gated_delta_rule"),
]


@pytest.mark.parametrize("case_id, module, kernel", TIMED_ONLY_KERNEL)
def test_flashinfer_gdn_timed_closure_is_the_kernel_alone(case_id, module, kernel, fake_flashinfer, monkeypatch):
    """No gather, transpose or scatter in the timed call: every non-view torch op it runs is inside
    FlashInfer's function (states are native from prepare, written back by finalize), or the serving
    work a server repeats every step, declared in named functions: extend's linear gate exp(g) and the
    clearing of fresh requests' slots."""
    from attnbench.case import Case
    from attnbench.kernels import native_states
    from attnbench.kernels.flashinfer import gdn as fi_gdn

    serving = [(fi_gdn, "_linear_gate"), (native_states, "zero_fresh_states_")]
    rec = watch_kernels(monkeypatch, [(sys.modules[f"flashinfer.{module}"], kernel), *serving])
    case = Case.from_id(case_id)
    fn = _Adapter().prepare(case, case.make_inputs())
    with rec:
        fn()
    assert rec.outside == []
    assert callable(fn.finalize)
