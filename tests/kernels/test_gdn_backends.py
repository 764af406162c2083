"""GDN backends (torch; triton under TRITON_INTERPRET=1 on a CPU) against the float64 references.

Every smoke-suite GDN case runs through the harness (`run_one`), so each row is checked the way a
sweep checks it: outputs, the state pool (numerically, with untouched slots bitwise), conv states
(bitwise), changed inputs, canaries and stale outputs. The tests below add targeted checks: padding
slots stay untouched, verify leaves the pool alone, tree verify restarts from the parent's state, and
the checks themselves catch a stray pool write.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from attnbench.backend import Backend, get_backend
from attnbench.buffers import clone_tensors
from attnbench.case import Case
from attnbench.check.prepared import call_untimed
from attnbench.plan.suite import load
from helpers import SMOKE_KERNEL, run_one

GDN_OPS = ("gdn_gating", "causal_conv1d", "gdn_decode", "gdn_extend", "gdn_verify", "gdn_commit")
SMOKE_GDN = [c.id for c in load("smoke").cases if c.op_name in GDN_OPS]
BACKENDS = ["torch", "triton"]


def _backend(name: str) -> Backend:
    b = get_backend(name)
    why = b.available()
    if why:
        pytest.skip(why)
    return b


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case_id", SMOKE_GDN)
def test_smoke_gdn_case(case_id, backend):
    r = run_one(case_id, _backend(backend), **SMOKE_KERNEL)
    assert r.status == "pass", f"{r.status}: {r.reason}"


# ---- targeted semantics -----------------------------------------------------------------------------
def _run(case_id: str, backend: str):
    case = Case.from_id(case_id)
    x = case.make_inputs()
    before = clone_tensors(x)
    out = call_untimed(_backend(backend).prepare(case, x))  # with its finalize (a K-last pool written back)
    return case, before, x, out


PADDED = ["gdn_decode/b6-h2x4-d16x16-pad3-bf16", "gdn_verify/b4-t3-h2x4-d16x16-pad2-tree-bf16"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case_id", PADDED)
def test_padding_and_unaddressed_slots_are_bitwise_untouched(case_id, backend):
    _, before, x, _ = _run(case_id, backend)
    used = {i for i in x.state_indices.tolist() if i >= 0}
    assert -1 in x.state_indices.tolist()
    for slot in range(x.state_pool.shape[0]):
        if slot not in used or case_id.startswith("gdn_verify"):
            assert torch.equal(x.state_pool[slot], before.state_pool[slot]), f"slot {slot} changed"
        else:
            assert not torch.equal(x.state_pool[slot], before.state_pool[slot]), f"slot {slot} not written"


@pytest.mark.parametrize("backend", BACKENDS)
def test_tree_verify_restarts_from_the_parent_state(backend):
    case, before, x, out = _run("gdn_verify/b2-t5-h1x2-d16x16-tree-fp32", backend)
    chain_case = Case.from_id("gdn_verify/b1-t1-h1x2-d16x16-fp32")
    B, T = 2, 5
    par = x.parents.tolist()
    assert any(par[b][t] != t - 1 for b in range(B) for t in range(1, T)), "the tree is a chain"
    for b in range(B):
        for t in range(T):
            # one decode-like verify step from the parent's state must give the same state and output
            y = chain_case.make_inputs()
            row = b * T + t
            y.state_pool = before.state_pool.clone()
            if par[b][t] >= 0:
                y.state_pool[0] = x.inter_states[b, par[b][t]]
                y.state_indices = torch.tensor([0], dtype=torch.int32)
            else:
                y.state_indices = before.state_indices[b : b + 1].clone()
            for name in ("q", "k", "v", "a", "b"):
                setattr(y, name, getattr(before, name)[row : row + 1].clone())
            y.A_log, y.dt_bias = before.A_log, before.dt_bias
            get_backend("torch").prepare(chain_case, y)()
            torch.testing.assert_close(x.inter_states[b, t], y.inter_states[0, 0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out["o"][row], y.o[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_leaves_the_pool_unchanged(backend):
    _, before, x, _ = _run("gdn_verify/b3-t4-h2x4-d16x16-bf16", backend)
    assert torch.equal(x.state_pool, before.state_pool)


class _StrayWrite(Backend):
    """The torch decode, plus one bit flipped in a slot no request addresses."""

    name = "stray-write-test"

    def prepare_gdn_decode(self, case, x):
        inner = get_backend("torch").prepare(case, x)
        spare = sorted(set(range(x.state_pool.shape[0])) - set(x.state_indices.tolist()))[0]

        def run():
            out = inner()
            x.state_pool[spare, 0, 0, 0] = torch.nextafter(x.state_pool[spare, 0, 0, 0], torch.tensor(9.0))
            return out

        return run


class _GarbagePadding(Backend):
    """The torch decode, with garbage (NaN) in the output rows of padding requests."""

    name = "garbage-padding-test"

    def prepare_gdn_decode(self, case, x):
        inner = get_backend("torch").prepare(case, x)

        def run():
            out = inner()
            x.o[x.state_indices < 0] = float("nan")
            return out

        return run


def test_a_one_ulp_write_to_a_spare_slot_fails_the_check():
    r = run_one("gdn_decode/b4-h2x4-d16x16-bf16", _StrayWrite())
    assert r.status == "fail" and "state_pool: 1 elements written that should be untouched" in r.reason


def test_padding_rows_of_the_output_are_not_compared():
    r = run_one("gdn_decode/b5-h2x4-d16x16-pad2-bf16", _GarbagePadding())
    assert r.status == "pass", r.reason
    assert r.metrics["o"]["unspecified"] == 2 * 4 * 16


# ---- fla on a CPU -------------------------------------------------------------------------------------
def test_fla_rows_skip_with_the_reason_when_fla_core_is_missing(monkeypatch):
    real = importlib.util.find_spec
    hide = lambda name, *a: None if name == "fla" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", hide)
    r = run_one("gdn_decode/b4-h2x4-d16x16-bf16", get_backend("fla"))
    assert (r.status, r.reason) == ("skip", "fla-core not installed")


@pytest.mark.parametrize("case_id", ["gdn_decode/b4-h2x4-d16x16-bf16", "gdn_extend/b2-t70-h1x2-d32x16-bf16"])
def test_fla_rows_skip_on_a_cpu(case_id):
    r = run_one(case_id, get_backend("fla"))
    assert r.status == "skip"
    cuda_only = "fla runs on CUDA only (its chunk kernels fail under TRITON_INTERPRET)"
    assert r.reason in ("fla-core not installed", cuda_only)


class _FlaDecodeInInterpreter(Backend):
    """fla's fused recurrent kernel runs under TRITON_INTERPRET=1 (its chunk kernels do not)."""

    name = "fla-interpreter-test"

    def prepare_gdn_decode(self, case, x):
        from attnbench.kernels.fla.gdn import prepare_decode

        return prepare_decode(case, x)


@pytest.mark.fla
@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests run fla on CUDA")
@pytest.mark.parametrize("case_id", [c for c in SMOKE_GDN if c.startswith("gdn_decode")])
def test_fla_decode_adapter_conventions_in_the_interpreter(case_id):
    r = run_one(case_id, _FlaDecodeInInterpreter())
    assert r.status == "pass", f"{r.status}: {r.reason}"


def _fla_chunk_stand_in(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
):
    """fla's documented chunk_gated_delta_rule contract in float64: [1, T, H, *] varlen, log-space g,
    states [N, HV, K, V]."""
    from attnbench.references import gdn as ref

    assert q.shape[0] == 1 and use_qk_l2norm_in_kernel and output_final_state
    cu = cu_seqlens.tolist()
    assert cu == cu_seqlens_cpu.tolist()
    o, finals = torch.empty(v.shape, dtype=v.dtype), []
    for i in range(len(cu) - 1):
        s, e = cu[i], cu[i + 1]
        oi, fi, _ = ref.recurrent_gated_delta_rule(
            q[0, s:e],
            k[0, s:e],
            v[0, s:e],
            g[0, s:e],
            beta[0, s:e],
            scale=scale,
            initial_state=initial_state[i],
        )
        o[0, s:e] = oi.to(v.dtype)
        finals.append(fi.float())
    return o, torch.stack(finals)


def test_fla_extend_adapter_conventions_against_a_stand_in(monkeypatch):
    """fla's chunk kernels do not run in the interpreter: check the adapter's conversions on a stand-in."""
    import types

    mods = {n: types.ModuleType(n) for n in ("fla", "fla.ops", "fla.ops.gated_delta_rule")}
    mods["fla.ops.gated_delta_rule"].chunk_gated_delta_rule = _fla_chunk_stand_in
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)

    class _Adapter(Backend):
        name = "fla-extend-adapter-test"

        def prepare_gdn_extend(self, case, x):
            from attnbench.kernels.fla.gdn import prepare_extend

            return prepare_extend(case, x)

    r = run_one("gdn_extend/b3-t70-mixed-h2x4-d16x16-initmixed-bf16", _Adapter())
    assert r.status == "pass", f"{r.status}: {r.reason}"
