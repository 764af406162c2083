"""vLLM's GDN kernels through the `vllm` backend (kernels/vllm/gdn.py), under TRITON_INTERPRET=1 on tiny
fp16/fp32 cases, every row through the harness (`run_one`): float64 verdicts, untouched spare slots,
stale outputs (slots rotated in place). Then mutants of the adapter's conventions (vLLM's null slot 0
not skipped, the pool left in the canonical [K, V] layout) that the same rows must fail; and a gdn_chain
over one pool with vLLM's decode and verify, which a closure reading the pool as prepared fails.
Needs vllm (tools/install-deployed.sh vllm); skipped with the reason otherwise.
"""

from __future__ import annotations

import pytest
import torch

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.kernels import native_states
from attnbench.kernels.vllm import _lib, gdn
from attnbench.ops.gdn_chain import ChainParams
from attnbench.run.runner import RunOptions, run_case
from helpers import KERNEL, run_one

pytestmark = pytest.mark.interpreter

CASES = [
    "gdn_decode/b5-h2x4-d16x16-pad2-fp16",
    "gdn_decode/b3-h1x4-d32x16-scale0.4-fp32",
    "gdn_verify/b3-t3-h2x4-d16x16-pad1-fp16",
    "gdn_verify/b2-t4-h1x2-d32x16-fp32",
]


@pytest.fixture(scope="module")
def vllm(vllm):
    """The backend (conftest.py), where vLLM's fused_sigmoid_gating kernels import here too."""
    if why := _lib.gdn_missing("fused_sigmoid_gating"):
        pytest.skip(why)
    return vllm


@pytest.mark.parametrize("case_id", CASES)
def test_gdn_rows_pass(vllm, case_id):
    r = run_one(case_id, vllm, **KERNEL)
    assert r.status == "pass", f"{r.status}: {r.reason}"
    assert "fused_sigmoid_gating_delta_rule_update" in r.prepare_info["variant"]


def _no_null_slot(indices):
    return indices.to(torch.int32)  # canonical slots as vLLM's: slot 0 is its null block, the rest off by one


def _kv_layout(x, spare=0):
    pool = x.state_pool.clone()
    if spare:
        pool = torch.cat([pool, pool.new_zeros(spare, *pool.shape[1:])])
    return torch.cat([pool.new_zeros(1, *pool.shape[1:]), pool]), False


@pytest.mark.parametrize("case_id", [CASES[0], CASES[2]])
def test_slots_without_the_null_slot_fail(vllm, monkeypatch, case_id):
    monkeypatch.setattr(gdn, "vllm_slots", _no_null_slot)
    cols = gdn.verify_columns
    monkeypatch.setattr(gdn, "verify_columns", lambda i, n, t: cols(i, n, t) - (cols(i, n, t) > 0).int())
    assert run_one(case_id, vllm, **KERNEL).status == "fail"


@pytest.mark.parametrize("case_id", [CASES[0], CASES[2]])
def test_a_pool_in_the_canonical_layout_fails(vllm, monkeypatch, case_id):
    monkeypatch.setattr(gdn, "vllm_pool", _kv_layout)
    assert run_one(case_id, vllm, **KERNEL).status == "fail"


def test_verify_columns_read_the_requests_slot_last_and_write_scratch():
    cols = gdn.verify_columns(torch.tensor([4, -1, 0], dtype=torch.int32), n_slots=6, draft=2)
    # one null slot, 6 pool slots (vLLM's 1..6), scratch from 7: request b's step t at 7 + 2 b + t
    assert cols.tolist() == [[7, 8, 5], [0, 0, 0], [11, 12, 1]]
    assert gdn.vllm_slots(torch.tensor([3, -1, 0])).tolist() == [4, 0, 1]


def test_vllm_pool_is_null_slot_then_v_major():
    x = Case.from_id(CASES[1], "cpu").make_inputs()
    pool, chained = gdn.vllm_pool(x, spare=2)
    assert not chained
    n = x.state_pool.shape[0]
    assert pool.shape[0] == 1 + n + 2 and not pool[0].any() and not pool[1 + n :].any()
    assert torch.equal(pool[1 : 1 + n], native_states.state_v_major(x.state_pool))


def test_limits_name_what_vllms_gdn_cannot_run(monkeypatch):
    b = get_backend("vllm")
    assert "chain" in b.limits(Case.from_id("gdn_verify/b2-t4-h1x2-d16x16-tree-fp16", "cuda"))
    assert "head_dim_k <= 256" in b.limits(Case.from_id("gdn_decode/b2-h1x2-d512x16-fp16", "cuda"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "CUDA only" in b.limits(Case.from_id("gdn_extend/b2-t70-h1x2-d32x16-fp16", "cpu"))
    assert "CUDA only" in b.limits(Case.from_id("gdn_decode/b5-h2x4-d16x16-packed-fp16", "cpu"))
    assert b.limits(Case.from_id("gdn_extend/b2-t70-h1x2-d32x16-fp16", "cuda")) is None
    assert b.graph_safe(Case.from_id(CASES[0], "cuda")) is True


def _chain(steps: str, layout: str):
    params = {"batch": 4, "pad": 1, "head_dim_k": 32, "head_dim_v": 16, "seq_len": 20, "draft": 3}
    return Case("gdn_chain", ChainParams(steps=steps, layout=layout, **params), "fp16")


# no extend@vllm: vLLM's chunk kernels import only on CUDA (suites/chain.yaml runs it on the GPU)
VLLM_CHAIN = "extend@torch > decode@vllm > verify@vllm > commit@torch > decode@vllm"


@pytest.mark.parametrize("layout", ["vk", "kv"])
def test_vllms_gdn_ops_join_a_chain(vllm, layout):
    """vLLM's decode and verify on a chain's pool: handed vLLM's layout (vk) as it is, or converted (kv)."""
    row = run_case(_chain(VLLM_CHAIN, layout), [get_backend("chain")], RunOptions(timing=False))[0]
    assert row.status == "pass", row.reason
    steps = row.prepare_info["steps"]
    assert ("the pool itself" if layout == "vk" else "converted kv -> vk -> kv") in steps[1], steps
    assert "copied in and out in the call" in steps[1], steps


def test_a_chain_step_that_reads_the_pool_as_prepared_fails(vllm, monkeypatch):
    """The private pool filled at prepare only (no copy in at the call): the decode after extend reads the
    pool as it was before the chain ran, and the chain fails at that step."""
    monkeypatch.setattr(gdn, "sync_in", lambda x, pool, chained: None)
    row = run_case(_chain(VLLM_CHAIN, "vk"), [get_backend("chain")], RunOptions(timing=False))[0]
    assert row.status == "fail" and row.reason.startswith(("o@2", "state_pool@2")), row.reason
