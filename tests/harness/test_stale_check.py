"""The stale-output check, both ways: it never fails a correct kernel, and it sees every input a
closure could have cached (harness/check/checks.py `stale_check`, `Op.perturbations`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnbench.backend import get_backend, load_plugin
from attnbench.buffers import bitwise_equal, clone_tensors, tensor_fields
from attnbench.case import Case
from attnbench.kernels.mutants.stale import STALE_MUTANTS, snapshot_backend
from attnbench.ops import OPS
from helpers import run_one

SUPPORT = Path(__file__).resolve().parents[1] / "support"

# per op, small cases where its classes of inputs are present (sinks, fp8 scales, MLA, custom masks,
# attend and save, padding, trees, mixed lengths, verify mode)
CASES = (
    "decode/b3-l70-skewed-h8x2-d64-p16-swa7-cap5-sink-bf16",
    "decode/b2-l300-h4x4-d96x64-p1-topk4-swa90-peaked-fp8_e4m3-bf16",
    "decode/b2-l40-h16x1-d576x512-p16-mla-scale0.1352337788608801-bf16",
    "extend/b2-q6-pre10-h4x2-d32-p16-custom-emptyrows-bf16",
    "extend/b2-q7-pre0-mixed-h4x4-d13-p16-custom-kvattend-swa90-cap5-sink-fp8_e5m2-kvscalehead-fp32",
    "tree_verify/b3-pre21-mixed-h8x2-d64-p16-treebinary-depth2-bf16",
    "merge_state/t33-h4-d64-empty-bf16",
    "gdn_gating/t33-h4-bf16",
    "causal_conv1d/b3-t2-c40-w3-pad1-tree-verify-fp32",
    "causal_conv1d/b3-t3-mixed-c40-initmixed-fp16",
    "gdn_decode/b5-h2x4-d16x16-pad1-bf16",
    "gdn_decode/b3-h1x4-d16x16-pad1-packed-fp32",
    "gdn_extend/b5-t3-h2x2-d32x16-initmixed-scale0.4-fp16",
    "gdn_verify/b5-t3-h2x2-d32x16-pad1-tree-scale0.4-fp16",
    "gdn_commit/b5-t3-h2-d16x16-c40-pad1-bf16",
    "gdn_chain/b3-h1x4-d32x16-t9-pad1-vk-convert-extend@torch-decode@torch-verify@torch-commit@torch-decode@torch-bf16",
    "eagle_build_tree/b3-pre40-mixed-k2-depth3-n6-maskfull-bf16",
    "eagle_build_tree/b1-pre4-k2-depth3-n6-maskfull-bf16",
    "verify_greedy/b4-treeeagle-depth3-k2-n6-bf16",
)


def test_every_op_has_a_case_here():
    assert {Case.from_id(c, "cpu").op_name for c in CASES} == set(OPS)


@pytest.mark.parametrize("case_id", CASES)
def test_perturbations_name_every_read_input_and_keep_the_case_valid(case_id):
    """Every tensor input the case reads (not an output, not written) is perturbed or held with a
    reason; a perturbation changes only the fields it names, keeps every shape, dtype and non-tensor
    field, never touches an output or a written input, and leaves an input the reference accepts."""
    case = Case.from_id(case_id, "cpu")
    op, p = case.op, case.params
    x = case.make_inputs()
    written = set(op.outputs_for(p)) | set(op.writes_for(p))
    read = {n for n in tensor_fields(x) if n not in written}
    perts = op.perturbations(p)
    declared = {f for q in perts for f in q.fields}
    assert not declared & written, declared & written
    missing = read - declared - set(op.held)
    assert not missing, f"{op.name} reads {sorted(missing)}: neither perturbed nor held"
    assert all(why for why in op.held.values())
    for q in perts:
        y = clone_tensors(x)
        q.apply(p, y)
        for f in type(x).__dataclass_fields__:
            a, b = getattr(x, f), getattr(y, f)
            if isinstance(a, torch.Tensor):
                assert (a.shape, a.dtype) == (b.shape, b.dtype), (q.name, f)
                moved = {getattr(x, g).untyped_storage().data_ptr() for g in q.fields if getattr(x, g) is not None}
                if f not in q.fields and a.untyped_storage().data_ptr() not in moved:  # not a view of a changed one
                    assert bool(bitwise_equal(a, b).all()), (q.name, f)
            else:
                assert a == b, (q.name, f)
        op.expected(p, y, torch.float64)  # a valid input: the reference runs on it


def test_a_correct_backend_that_copies_into_the_full_mask_passes():
    """The false alarm: a perturbation that shrank seq_lens but not the full mask made a correct
    backend's `copy_` raise (an error row); now every perturbation keeps the buffers' sizes."""
    load_plugin(str(SUPPORT / "copying_eagle.py"))
    for case_id in (
        "eagle_build_tree/b1-pre4-k2-depth3-n6-maskfull-bf16",
        "eagle_build_tree/b3-pre40-mixed-k2-depth3-n6-maskfull-bf16",
    ):
        row = run_one(case_id, get_backend("copying-eagle"))
        assert row.status == "pass", f"{case_id}: {row.status} {row.reason}"


def _changes_outputs(case, q) -> bool:
    """Whether perturbation `q` alone changes the float64 expectation of `case`."""
    op, p = case.op, case.params
    x = case.make_inputs()
    before = op.expected(p, x, torch.float64)
    q.apply(p, x)
    after = op.expected(p, x, torch.float64)
    return any(not torch.equal(before[k].nan_to_num(7.0), after[k].nan_to_num(7.0)) for k in before)


@pytest.mark.parametrize("case_id", CASES)
def test_torch_passes_and_a_closure_caching_any_perturbed_input_fails(case_id):
    """For every class of inputs the op perturbs in this case, a closure that reads a copy of those
    inputs taken at prepare is a stale output naming the class; the torch backend passes."""
    case = Case.from_id(case_id, "cpu")
    good = run_one(case, get_backend("chain" if case.op_name == "gdn_chain" else "torch"))  # torch's steps
    assert good.status == "pass", good.reason
    for q in case.op.perturbations(case.params):
        if not _changes_outputs(case, q):
            continue  # nothing to see here (a tree of two tokens has one shape; no prefix reads no scale)
        row = run_one(case, snapshot_backend("snap", {case.op_name: q.fields}))
        if row.status == "skip":
            continue  # none of its fields in this case (a decode has no k_new)
        assert row.status == "fail" and row.reason.startswith("stale output: "), (q.name, row.status, row.reason)


@pytest.mark.parametrize("mutant", STALE_MUTANTS, ids=lambda m: m[0])
def test_each_built_in_stale_mutant_is_caught_on_every_case_of_its_ops_here(mutant):
    name, _, fields = mutant
    ran = 0
    for case_id in CASES:
        case = Case.from_id(case_id, "cpu")
        if case.op_name not in fields:
            continue
        perts = [q for q in case.op.perturbations(case.params) if set(q.fields) & set(fields[case.op_name])]
        if not any(_changes_outputs(case, q) for q in perts):
            continue  # the class changes no output here (no prefix reads no scale; one shape of a 2-token tree)
        row = run_one(case, snapshot_backend(name, fields))
        if row.status == "skip":
            continue
        ran += 1
        if case.op_name == "gdn_decode" and "packed" in case_id and fields[case.op_name][0] in ("q", "k", "v"):
            continue  # packed decode reads mixed_qkv, not the q/k/v views it snapshots
        assert row.status == "fail" and "stale output" in row.reason, (case_id, row.status, row.reason)
    assert ran, f"{name}: no case here has its inputs"


def test_a_stale_output_names_the_class_it_did_not_follow():
    case = Case.from_id("decode/b3-l70-skewed-h8x2-d64-p16-swa7-cap5-sink-bf16", "cpu")
    row = run_one(case, snapshot_backend("snap", {"decode": ("q",)}))
    assert row.reason.startswith("stale output: the queries (q) changed in place and the closure did not follow: "), (
        row.reason
    )


@pytest.mark.parametrize(
    "case_id, fields",
    [
        ("decode/b2-l300-h4x4-d96x64-p1-topk4-swa90-peaked-fp8_e4m3-bf16", ("k_scale", "v_scale")),
        ("decode/b3-l70-skewed-h8x2-d64-p16-swa7-cap5-sink-bf16", ("sinks",)),
        ("gdn_decode/b5-h2x4-d16x16-pad1-bf16", ("A_log", "dt_bias")),
        ("gdn_gating/t33-h4-bf16", ("A_log", "dt_bias")),
        ("causal_conv1d/b3-t3-mixed-c40-initmixed-fp16", ("weight", "bias")),
    ],
)
def test_a_closure_that_takes_model_weights_in_prepare_passes(case_id, fields):
    """Weights are per-layer constants a server never rewrites (FlashInfer takes the fp8 scales as host
    floats, an H100 run "caught" it): a closure holding a copy of them from prepare is correct."""
    case = Case.from_id(case_id, "cpu")
    assert set(fields) <= set(case.op.held)
    row = run_one(case, snapshot_backend("weights", {case.op_name: fields}))
    assert row.status == "pass", row.reason


def test_a_perturbed_copy_clones_only_what_it_changes_and_keeps_views():
    """`clone_tensors(x, only=...)`: the named fields' storages (and every field viewing them) are copied,
    views stay views of the copy; the other fields are the same tensors (a multi-GB pool is not copied
    once per perturbation)."""
    case = Case.from_id("gdn_decode/b3-h1x4-d16x16-pad1-packed-fp32", "cpu")
    x = case.make_inputs()
    y = clone_tensors(x, only={"q"})
    assert y.state_pool is x.state_pool and y.a is x.a
    assert y.q is not x.q and bool(bitwise_equal(y.q, x.q).all())
    # packed decode: q, k and v view mixed_qkv; the copy keeps them views of one new storage
    shared = {
        n
        for n in ("q", "k", "v", "mixed_qkv")
        if getattr(x, n).untyped_storage().data_ptr() == x.q.untyped_storage().data_ptr()
    }
    assert len(shared) > 1
    assert len({getattr(y, n).untyped_storage().data_ptr() for n in shared}) == 1
    assert y.mixed_qkv.untyped_storage().data_ptr() != x.mixed_qkv.untyped_storage().data_ptr()


def test_a_changed_input_a_fresh_closure_also_fails_is_not_a_stale_output():
    """The control: a backend inaccurate only on the negated queries (as a correct kernel can be just over
    its bound on another draw of the case) fails the re-run, but a freshly prepared closure fails those
    inputs too, so no staleness is reported; a closure that did not follow still is (the mutants)."""
    from attnbench.backend import Backend

    case = Case.from_id("decode/b3-l70-skewed-h8x2-d64-p16-swa7-cap5-sink-bf16", "cpu")
    sign = float(case.make_inputs().q.flatten()[0])

    class OffOnTheOtherSign(Backend):
        name = "off-on-the-other-sign"

        def prepare_decode(self, case, x):
            inner = get_backend("torch").prepare(case, x)

            def run():
                out = inner()
                if float(x.q.flatten()[0]) * sign < 0:  # the queries were negated
                    out["o"].add_(1.0)
                return out

            return run

    row = run_one(case, OffOnTheOtherSign())
    assert row.status == "pass", row.reason


def test_perturbed_copies_past_the_memo_cap_are_made_again_not_held(monkeypatch):
    """Past `MEMO_MAX_BYTES` a case's memo keeps the perturbed expectations but not the perturbed copy
    (a production-size pool would be held twice more for the whole case): the next backend gets the
    same perturbed inputs made again, and a stale closure behind it is still caught."""
    from attnbench.check import checks
    from attnbench.run.runner import RunOptions, run_case

    case = Case.from_id(CASES[0], "cpu")
    op, p = case.op, case.params
    x0 = case.make_inputs()
    keys = next(q for q in op.perturbations(p) if q.name == "keys")
    small: dict = {}
    first = checks._perturbed(op, p, x0, (keys,), case.torch_dtype, small, ("keys",), True)
    assert checks._perturbed(op, p, x0, (keys,), case.torch_dtype, small, ("keys",), True)[0] is first[0]
    monkeypatch.setattr(checks, "MEMO_MAX_BYTES", 0)
    capped: dict = {}
    a = checks._perturbed(op, p, x0, (keys,), case.torch_dtype, capped, ("keys",), True)
    assert capped[("keys",)]["x"] is None and capped[("keys",)]["expected"] is None  # computed when asked
    b = checks._perturbed(op, p, x0, (keys,), case.torch_dtype, capped, ("keys",), True)
    ea, eb = a[1](), b[1]()
    assert b[0] is not a[0] and eb[:2] == ea[:2] and (ea[2], eb[2]) == (True, False)  # computed once
    for name, t in tensor_fields(a[0]).items():
        assert bitwise_equal(t, tensor_fields(b[0])[name]).all(), name
    rows = run_case(
        case, [get_backend("torch"), snapshot_backend("snap", {"decode": ("k_cache",)})], RunOptions(timing=False)
    )
    assert rows[0].status == "pass", rows[0].reason
    assert rows[1].status == "fail" and "stale output" in rows[1].reason, rows[1].reason


def _declaring_mask_planned(inner):
    """`inner`'s closures, declaring the custom mask consumed in prepare."""
    from attnbench.backend import Backend

    def prepare_extend(self, case, x):
        fn = inner.prepare(case, x)
        fn.planned = {"custom_mask": "packed by the plan"}
        return fn

    return type("Planned", (Backend,), {"name": f"planned-{inner.name}", "prepare_extend": prepare_extend})()


def test_a_closure_declaring_the_custom_mask_planned_is_not_stale_for_it():
    """A library that packs the custom mask in its plan (FlashInfer's plan(); a server re-plans per
    batch) declares it `planned`: the mask is then not changed under it, every other input still is,
    and the row records the declaration. Undeclared, the same closure is a stale output."""
    case = Case.from_id("extend/b2-q6-pre10-h4x2-d32-p16-custom-emptyrows-bf16", "cpu")
    mask = snapshot_backend("snap", {"extend": ("custom_mask",)})
    assert run_one(case, mask).reason.startswith("stale output: the custom mask")
    row = run_one(case, _declaring_mask_planned(mask))
    assert row.status == "pass", row.reason
    assert row.prepare_info["planned"] == {"custom_mask": "packed by the plan"}
    queries = _declaring_mask_planned(snapshot_backend("snapq", {"extend": ("q",)}))
    assert run_one(case, queries).reason.startswith("stale output: the queries")  # the rest still checked
