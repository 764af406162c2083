"""Production-size pools (`pool_pages`, `state_slots`): every page and slot a request uses sits at the end
of the pool, the spare region before it is NaN, and the reference and checks read only the requests'
region. suites/large.yaml puts such pools past 2^31 elements on a GPU; here the same mechanism runs
on small pools, and the int32 offset mutant's address arithmetic is checked at 2^31 on index tensors."""

from __future__ import annotations

import pytest
import torch

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.kernels.mutants import MUTANTS
from attnbench.kernels.mutants.interactions import Bugs, attention_mutant, state_offset_mutant, wrapped_rows
from attnbench.plan.suite import load
from helpers import KERNEL, run_one

# decode, MLA decode, extend saving its new K/V, a sliding-window layer's own pool, and GDN
# decode/extend/verify, each with its pool grown and its requests at the end
CASES = [
    "decode/b3-l70-mixed-h8x2-d64-p16-pages200-bf16",
    "decode/b2-l40-h16x1-d576x512-p16-mla-scale0.1352337788608801-pages40-bf16",
    "extend/b2-q8-pre30-h8x2-d64-p4-pages300-bf16",
    "extend/b2-q8-pre30-h8x2-d64-p4-swa5-poolswa-sink-pages300-bf16",
    "gdn_decode/b4-h2x4-d32x32-pad1-slots40-fp32",
    "gdn_extend/b3-t20-mixed-h2x4-d32x32-initmixed-slots40-bf16",
    "gdn_verify/b3-t4-h2x4-d32x32-pad1-tree-slots40-bf16",
]


@pytest.mark.parametrize("case_id", CASES)
def test_requests_sit_at_the_end_of_the_pool_and_the_spare_region_is_nan(case_id):
    case = Case.from_id(case_id)
    x = case.make_inputs()
    base = x.pool_base
    assert base > 0
    if hasattr(x, "state_pool"):
        assert x.state_pool.shape[0] == case.params.state_slots
        real = x.state_indices[x.state_indices >= 0]
        assert bool((real >= base).all()) and bool((real < case.params.state_slots).all())
        assert bool(x.state_pool[:base].isnan().all())
        assert not bool(x.state_pool[base:].isnan().any())
    else:
        assert x.k_cache.shape[0] == case.params.pool_pages
        assert int(x.kv_page_indices.min()) >= base
        assert bool(x.k_cache[:base].float().isnan().all()) and bool(x.v_cache[:base].float().isnan().all())
        if x.full_to_swa is not None:  # a bijection of the end region, the spare pages map to themselves
            assert torch.equal(x.full_to_swa[:base], torch.arange(base, dtype=torch.int32))
            assert sorted(x.full_to_swa.tolist()) == list(range(x.k_cache.shape[0]))


@pytest.mark.parametrize("case_id", CASES)
def test_the_reference_reads_only_the_requests_region(case_id):
    """The expectation of a written pool covers the region only, so a pool past 2^31 elements is never
    copied whole (nor converted to float64); and it equals the default pool's (the same requests)."""
    case = Case.from_id(case_id)
    x = case.make_inputs()
    want = case.op.expected(case.params, x, torch.float64)
    rows = case.op.written_rows(case.params, x)
    for name in case.op.writes_for(case.params):
        assert rows[name] == x.pool_base
        assert want[name].shape[0] == getattr(x, name).shape[0] - x.pool_base


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case_id", CASES)
def test_torch_and_triton_pass_with_the_requests_at_the_end_of_the_pool(case_id, backend):
    row = run_one(case_id, get_backend(backend), **KERNEL)
    assert row.status == "pass", row.reason


# ---- offsets computed in a narrow integer -----------------------------------------------------------
def test_wrapped_rows_is_int32_multiplication_past_2_31():
    """At production size: `slot * row_elems` wraps exactly as an int32 product does (two's complement)."""
    row_elems = 8 * 128  # a token slot of 8 kv heads x 128
    rows = 2_162_688  # the page-size-1 decode pool of suites/large.yaml: 2.21e9 elements
    slots = torch.tensor([0, 5, 2**21 - 1, 2**21, 2**21 + 7, rows - 1], dtype=torch.int64)
    got = wrapped_rows(slots, row_elems, rows, 32)
    int32_offsets = slots.to(torch.int32) * torch.tensor(row_elems, dtype=torch.int32)  # wraps
    assert torch.equal(got, torch.remainder(int32_offsets.long(), rows * row_elems) // row_elems)
    fits = slots * row_elems < 2**31
    assert torch.equal(got[fits], slots[fits])  # below 2^31 elements nothing changes
    assert not bool((got[~fits] == slots[~fits]).any())  # past it every slot goes elsewhere


@pytest.mark.parametrize("name", ["kv-offset-int32", "gdn-state-offset-int32"])
def test_the_int32_offset_mutants_are_left_to_the_gpu_self_test(name):
    """No CPU suite holds a pool past 2^31 elements: the CPU self-test does not run them (a known escape
    there, named); the GPU self-test adds suites/large.yaml, where they must be caught."""
    from attnbench.cli import selftest

    m = {m.name: m for m in MUTANTS}[name]
    assert "2^31" in m.cuda_only and m.source and not m.known_escape
    assert "large" in selftest.GPU_SUITES and "large" not in selftest.DEFAULT_SUITES


@pytest.mark.parametrize("case_id", [c for c in CASES if c.startswith("gdn_")])
def test_a_large_state_pool_catches_narrow_state_offsets_that_a_default_pool_hides(case_id):
    """The GDN int32 mutant's rule at 18 bits (2^17 elements: 32 slots of 4 x 32 x 32): the requests' slots
    at the end of a 40-slot pool wrap onto the NaN spare slots, those of the default pool (from slot 0) do
    not. suites/large.yaml does the same at 2^31."""
    narrow = state_offset_mutant("gdn-state-offset-narrow", 18)
    big = run_one(case_id, narrow)
    assert big.status == "fail", big.reason
    small = run_one(case_id.replace("-slots40", ""), narrow)
    assert small.status == "pass", small.reason
    wide = run_one(case_id, state_offset_mutant("gdn-state-offset-int32", 32))
    assert wide.status == "pass", wide.reason  # int32 wraps only past 2^31 elements


@pytest.mark.parametrize(
    "case_id",
    ["decode/b3-l70-mixed-h8x2-d64-p16-pages200-bf16", "extend/b2-q8-pre30-h8x2-d64-p4-pages300-bf16"],
)
def test_a_large_pool_catches_narrow_offsets_that_a_default_pool_hides(case_id):
    """The int32 mutant's rule at a width these small pools pass (2^17 elements): the default pool's
    pages sit below it and the mutant passes; the same requests at the end of a grown pool fail it
    (reads of the NaN spare region, or saves into it). suites/large.yaml does the same at 2^31."""
    narrow = attention_mutant("kv-offset-narrow", Bugs(offset_bits=18))
    big = run_one(case_id, narrow)
    assert big.status == "fail", big.reason
    small = run_one(case_id.replace("-pages200", "").replace("-pages300", ""), narrow)
    assert small.status == "pass", small.reason


def test_a_write_into_the_spare_region_is_named():
    """Saves sent to a wrapped slot land in the spare pages: the check names them."""
    narrow = attention_mutant("kv-offset-narrow", Bugs(offset_bits=18))
    row = run_one("extend/b2-q8-pre30-h8x2-d64-p4-pages300-bf16", narrow)
    assert row.status == "fail"
    assert row.metrics["k_cache"]["spare_changed"] > 0 and row.metrics["v_cache"]["spare_changed"] > 0


def test_the_large_suite_is_past_2_31_elements_and_2_32_bytes():
    suite = load("large", "cpu", plan_only=True)
    ops = set()
    for c in suite.cases:
        p = c.params
        if hasattr(p, "pool_pages"):
            elems, size = p.pool_pages * p.page_size * p.heads_kv * p.head_dim, 2  # bf16
            ops.add(f"{c.op_name}-{p.kv_pool}-{'mla' if p.mla else 'mha'}")
        else:
            elems, size = p.state_slots * p.heads_v * p.head_dim_k * p.head_dim_v, 4  # fp32 states
            ops.add(c.op_name)
        assert elems > 2**31 and elems * size > 2**32, c.id
    assert {"decode-full-mha", "extend-full-mha", "decode-full-mla", "decode-swa-mha", "extend-swa-mha"} <= ops
    assert {"gdn_decode", "gdn_extend", "gdn_verify"} <= ops


def test_a_pool_too_small_for_its_requests_is_a_clear_error():
    with pytest.raises(Exception, match="cannot hold"):
        Case.from_id("decode/b3-l70-mixed-h8x2-d64-p16-pages5-bf16").make_inputs()
    with pytest.raises(Exception, match="cannot hold"):
        Case.from_id("gdn_decode/b4-h2x4-d32x32-slots3-fp32").make_inputs()


def test_count_true_sums_a_mask_in_chunks(monkeypatch):
    """`count_true` equals `mask.sum()` across chunk boundaries (it exists so that a 2.2e9-element
    pool's mask is never converted to int64 whole: 16.5 GiB on the H100 `large` run)."""
    import attnbench.buffers as B

    monkeypatch.setattr(B, "COUNT_CHUNK", 7)
    g = torch.Generator().manual_seed(0)
    for shape in [(5, 13), (7,), (0,), (3, 1, 14)]:
        m = torch.rand(shape, generator=g) > 0.5
        assert B.count_true(m) == int(m.sum())
    assert B.count_true(torch.ones(4, 4, dtype=torch.bool).t()) == 16  # non-contiguous


def test_checks_of_big_inputs_free_copies_left_in_reference_cycles(monkeypatch):
    """A copy a check leaves in a reference cycle is freed before the next check runs when the case's
    inputs are big (COLLECT_FROM_BYTES), not at the next automatic collection."""
    import dataclasses
    import gc
    import types
    import weakref

    import attnbench.run.runner as R

    @dataclasses.dataclass
    class Inputs:
        x: torch.Tensor

    refs, seen = [], []

    class Leaky:
        name, needs, records = "leaky", frozenset({"outputs"}), ()

        def applies(self, ctx):
            return True

        def run(self, ctx):
            box = {"copy": torch.zeros(1000)}
            box["self"] = box  # a cycle: only the cycle collector frees it
            refs.append(weakref.ref(box["copy"]))
            return {}

    class Probe(Leaky):
        name = "probe"

        def run(self, ctx):
            seen.append(refs[-1]() is None)
            return {}

    ctx = types.SimpleNamespace(
        verdict=types.SimpleNamespace(malformed=False), prepared=types.SimpleNamespace(pristine=Inputs(torch.zeros(8)))
    )
    gc.disable()
    try:
        monkeypatch.setattr(R, "COLLECT_FROM_BYTES", 1 << 40)  # small inputs: left to the collector
        R._apply_checks(ctx, [Leaky(), Probe()])
        monkeypatch.setattr(R, "COLLECT_FROM_BYTES", 1)  # big inputs: collected after each check
        R._apply_checks(ctx, [Leaky(), Probe()])
    finally:
        gc.enable()
    assert seen == [False, True]


def test_freezing_the_heap_leaks_no_cycle_of_a_case():
    """`_freeze_heap` (each GPU case's start) hides the long-lived heap from the collector: garbage left in
    a cycle before it is freed by its collection, not frozen, and a cycle made after it is still freed
    by the next collection."""
    import gc
    import weakref

    import attnbench.run.runner as R

    def cycle():
        box = {"copy": torch.zeros(100)}
        box["self"] = box
        return weakref.ref(box["copy"])

    gc.disable()
    try:
        before = cycle()  # the previous case's garbage
        R._freeze_heap()
        assert before() is None and gc.get_freeze_count() > 0
        after = cycle()  # this case's
        gc.collect()
        assert after() is None
    finally:
        gc.unfreeze()
        gc.enable()
