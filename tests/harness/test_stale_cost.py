"""What the stale-output check costs: a re-run that does exactly what a freshly prepared closure does on
the changed inputs needs no float64 reference of them (on the default CPU sweep those references were
half of the stale check's 118 s); perturbations that change nothing of a pure op are not re-run; each
row says what its check did (`stale_reruns`, `stale_references`). The verdicts stay: the mutants of
test_stale_check.py are all still caught."""

from __future__ import annotations

import pytest
import torch

from attnbench.backend import Backend, get_backend
from attnbench.case import Case
from helpers import Nudges, run_one

DECODE = "decode/b3-l70-skewed-h8x2-d64-p16-swa7-cap5-sink-bf16"
GDN_EXTEND = "gdn_extend/b5-t3-h2x2-d32x16-initmixed-scale0.4-fp16"


def _count_references(monkeypatch, case: Case) -> list:
    """Every call of the case's op's reference after the case's own two (float64 and twin)."""
    calls: list = []
    real = type(case.op).expected

    def counted(self, p, x, dtype):
        calls.append(dtype)
        return real(self, p, x, dtype)

    monkeypatch.setattr(type(case.op), "expected", counted)
    return calls


@pytest.mark.parametrize("case_id, references", [(DECODE, 1), (GDN_EXTEND, 0)])
def test_a_closure_that_follows_like_a_fresh_one_needs_no_perturbed_reference(monkeypatch, case_id, references):
    """Decode still computes one: negated values leave the LSE bitwise the first call's, which a cache
    replaying into every closure would do too, so the reference decides that one (the replay rule)."""
    case = Case.from_id(case_id, "cpu")
    calls = _count_references(monkeypatch, case)
    row = run_one(case, get_backend("torch"))
    assert row.status == "pass", row.reason
    assert calls == [torch.float64, case.torch_dtype] * (1 + references)  # the case's own, and those
    assert row.stale_reruns == len(case.op.perturbations(case.params)) and row.stale_references == references


class Jitter(Backend):
    """Correct, but no two closures give the same bits (a tiny offset per closure): the stale check must
    fall back to the float64 reference of the changed inputs, and still pass it."""

    name = "jitter"
    nudges = Nudges()

    def prepare_decode(self, case, x):
        return Jitter.nudges.wrap(get_backend("torch").prepare(case, x))


def test_a_closure_unlike_a_fresh_one_is_judged_on_the_reference(monkeypatch):
    case = Case.from_id(DECODE, "cpu")
    calls = _count_references(monkeypatch, case)
    row = run_one(case, Jitter(), repeats=1)
    assert row.status == "pass", row.reason
    perts = len(case.op.perturbations(case.params))
    assert row.stale_reruns == perts and row.stale_references == perts
    assert len(calls) == 2 + 2 * perts


def test_a_perturbation_that_changes_nothing_of_a_pure_op_is_not_rerun():
    """A batch of one: rotating the prefix lengths among the requests leaves them as they were."""
    case = Case.from_id("eagle_build_tree/b1-pre4-k3-depth3-n6-maskfull-bf16", "cpu")
    perts = case.op.perturbations(case.params)
    assert any(q.name == "prefix lengths" for q in perts) and not case.op.writes_for(case.params)
    row = run_one(case, get_backend("torch"))
    assert row.status == "pass", row.reason
    assert row.stale_reruns == len(perts) - 1


def test_the_stale_check_records_its_counts_in_the_csv_columns():
    from attnbench.store.columns import check_columns

    assert {"stale_reruns", "stale_references"} <= {c.name for c in check_columns()}


@pytest.mark.parametrize("control_first", [True, False], ids=["control-first", "reference-first"])
def test_both_orders_of_the_stale_check_give_the_same_verdicts(control_first):
    """The kernel tests under the interpreter take the reference first (helpers.KERNEL): a re-run is judged on
    the float64 reference of the changed inputs, the fresh closure only controls a failing one. Either order
    passes a correct closure and one unlike any fresh one, and names the same class for a stale one."""
    from attnbench.kernels.mutants.stale import snapshot_backend

    case = Case.from_id(DECODE, "cpu")
    perts = case.op.perturbations(case.params)
    row = run_one(case, get_backend("torch"), stale_control_first=control_first)
    assert row.status == "pass", row.reason
    assert row.stale_references == (1 if control_first else len(perts))  # reference-first: one per re-run
    assert run_one(case, Jitter(), repeats=1, stale_control_first=control_first).status == "pass"
    for q in perts:
        stale = run_one(case, snapshot_backend("snap", {"decode": q.fields}), stale_control_first=control_first)
        assert stale.status == "fail" and stale.reason.startswith(f"stale output: the {q.name} "), stale.reason


EXTEND_NO_PREFIX = "extend/b1-q8-pre0-h4x2-d32-p16-bf16"


class TorchAgain(Backend):
    """The torch backend under another name: a second backend of a case that writes the same bits."""

    name = "torch-again"

    def supports(self, case):
        return get_backend("torch").supports(case)

    def prepare(self, case, x):
        return get_backend("torch").prepare(case, x)


def test_backends_that_wrote_the_same_inputs_share_the_perturbed_references(monkeypatch):
    """Extend writes its KV cache, so each backend's re-runs start from the cache as its own calls left it.
    Without a prefix, perturbing the cache's other pages leaves the output as it was (bitwise the first
    call's), which the reference decides: 2 references per row. A second backend that wrote the same cache
    bits reuses them (0); the verdicts stay."""
    from attnbench.run.runner import RunOptions, run_case

    case = Case.from_id(EXTEND_NO_PREFIX, "cpu")
    assert case.op.writes_for(case.params)
    calls = _count_references(monkeypatch, case)
    rows = run_case(case, [get_backend("torch"), TorchAgain()], RunOptions(timing=False))
    assert [r.status for r in rows] == ["pass", "pass"], [r.reason for r in rows]
    assert [r.stale_references for r in rows] == [2, 0]
    assert len(calls) == 2 + 2 * 2  # the case's own, then the first row's two


def test_perturbed_inputs_of_other_bits_get_their_own_reference():
    """An op that writes inputs: an expectation is reused only for bitwise-equal perturbed inputs."""
    from attnbench.buffers import clone_tensors
    from attnbench.check.checks import _perturbed

    case = Case.from_id(EXTEND_NO_PREFIX, "cpu")
    op, p = case.op, case.params
    pert = op.perturbations(p)[0]
    a = case.make_inputs()
    b = clone_tensors(a)
    bits = b.k_cache.view(torch.int16).view(-1)
    bits[0] ^= 1  # another backend's cache, one bit apart
    memo: dict = {}
    got = [_perturbed(op, p, base, (pert,), case.torch_dtype, memo, ("k",), False)[1]()[2] for base in (a, b, a, b)]
    assert got == [True, True, False, False]  # computed for each base once, then reused


def test_past_the_cap_of_kept_copies_each_backend_computes_its_own(monkeypatch):
    """The perturbed copies an op that writes inputs keeps for its case are capped (MEMO_WRITTEN_MAX_BYTES,
    all perturbations together): past it the next backend computes the references again, same verdicts."""
    from attnbench.check import checks
    from attnbench.run.runner import RunOptions, run_case

    monkeypatch.setattr(checks, "MEMO_WRITTEN_MAX_BYTES", 0)
    case = Case.from_id(EXTEND_NO_PREFIX, "cpu")
    rows = run_case(case, [get_backend("torch"), TorchAgain()], RunOptions(timing=False))
    assert [r.status for r in rows] == ["pass", "pass"], [r.reason for r in rows]
    assert [r.stale_references for r in rows] == [2, 2]


def test_perturbed_references_of_an_op_that_writes_nothing_come_from_the_reference_cache(monkeypatch, tmp_path):
    """Decode writes nothing: its perturbed inputs are a function of the case alone, so their float64
    expectations and twins are kept in the reference cache (`checks.stale_variant`): a second run
    computes none, with the same verdicts, and a closure that caches its keys is still caught."""
    from attnbench.run.runner import RunOptions, run_case
    from attnbench.store import refcache

    case = Case.from_id(DECODE, "cpu")
    calls = _count_references(monkeypatch, case)
    perts = len(case.op.perturbations(case.params))
    backends = [Jitter(), get_backend("torch"), StaleKeys()]
    runs = []
    for _ in range(2):
        calls.clear()
        Jitter.nudges.reset()  # the same nudges in both runs
        rows = run_case(case, backends, RunOptions(timing=False, determinism_repeats=1, ref_cache=str(tmp_path)))
        runs.append(([(r.status, r.metrics, r.stale_reruns) for r in rows], len(calls), rows))
    assert runs[0][0] == runs[1][0]
    assert [r.status for r in runs[1][2]] == ["pass", "pass", "fail"]
    assert "stale output" in runs[1][2][2].reason and "keys" in runs[1][2][2].reason
    assert runs[0][1] == 2 * (1 + perts)  # the case's own and every perturbation's (the jitter row needs them all)
    assert runs[1][1] == 0  # all from the cache
    assert [r.stale_references for r in runs[1][2]] == [0, 0, 0]
    assert len(refcache.RefCache(tmp_path).entries()) == 1 + perts


class StaleKeys(Backend):
    """Reads the keys once, in prepare: a re-run on changed keys gives the old output (stale)."""

    name = "stale-keys"

    def prepare_decode(self, case, x):
        inner = get_backend("torch").prepare(case, x)
        saved = x.k_cache.clone()
        live = x.k_cache

        def run():
            now = live.clone()
            live.copy_(saved)
            out = inner()
            live.copy_(now)
            return out

        return run


def test_the_fresh_closure_goes_first_up_to_a_share_of_the_gpus_free_memory(monkeypatch):
    """Past FRESH_FIRST_MAX_BYTES of inputs the fresh closure still goes first on a GPU with room for one
    more copy (an eighth of its free memory): a 1.1 GiB GDN extend case computed six float64 references
    per backend without it. On the host, and when turned off (a negative limit), the flat limit holds."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    from attnbench.check import checks

    @dataclass
    class Inputs:
        a: torch.Tensor

    x = Inputs(torch.zeros(1024, dtype=torch.uint8))  # 1 KiB of inputs
    monkeypatch.setattr(checks, "FRESH_FIRST_MAX_BYTES", 4096)
    assert checks.fresh_first(x)
    monkeypatch.setattr(checks, "FRESH_FIRST_MAX_BYTES", 512)
    assert not checks.fresh_first(x)  # on the host: the flat limit only

    gpu = SimpleNamespace(is_cuda=True, device="cuda:0")
    monkeypatch.setattr(checks, "all_tensors", lambda _: [gpu])
    monkeypatch.setattr(checks, "storage_bytes", lambda _: 1024)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (8 * 1024, 80 * 1024))
    assert checks.fresh_first(x)  # 1 KiB within an eighth of 8 KiB free
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (8 * 1024 - 8, 80 * 1024))
    assert not checks.fresh_first(x)
    # blocks PyTorch's allocator keeps unused after an earlier case are memory the copy can take
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 64 * 1024)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 56 * 1024)
    assert checks.fresh_first(x)
    monkeypatch.setattr(checks, "FRESH_FIRST_MAX_BYTES", -1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2**40, 2**40))
    assert not checks.fresh_first(x)  # turned off (the interpreter tests' order)


def test_the_bulk_kernel_tests_still_rerun_every_class_of_changed_input():
    """`SMOKE_KERNEL` re-runs one perturbation a smoke case (helpers.one_perturbation): across the smoke
    cases of each op, every perturbation the op has is still the chosen one somewhere."""
    from collections import defaultdict

    from attnbench.backend import load_builtin
    from attnbench.plan.suite import load
    from helpers import one_perturbation

    load_builtin()
    offered, chosen = defaultdict(set), defaultdict(set)
    for case in load("smoke", "cpu").cases:
        offered[case.op_name] |= {p.name for p in case.op.perturbations(case.params)}
        with one_perturbation(case):
            picked = case.op.perturbations(case.params)
        assert len(picked) <= 1
        chosen[case.op_name] |= {p.name for p in picked}
    assert offered == chosen and len(offered["decode"]) >= 3 and len(offered["gdn_extend"]) >= 5
