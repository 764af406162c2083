"""The outputs check computes what a comparison takes from the reference alone (slices, per-slice bounds,
the untouched mask of a written pool: `checks.reference_side`, `checks.untouched_mask`) once per case, not
once per backend; the verdicts and metrics are those computed without the memo."""

from __future__ import annotations

import json

import pytest
import torch

from attnbench.backend import Backend, get_backend
from attnbench.buffers import clone_tensors
from attnbench.case import Case
from attnbench.check import checks
from attnbench.check.tolerance import rule_for
from attnbench.run.runner import RunOptions, run_case

CASES = (
    "decode/b3-l70-skewed-h8x2-d64-p16-swa7-cap5-sink-bf16",
    "extend/b1-q1-pre1-h1x1-d16-p16-custom-emptyrows-bf16",  # an LSE of -inf (a row that sees no key)
    "gdn_decode/b3-h2x4-d16x16-pad2-fp32",  # a written pool: numeric compare and its untouched part
)


def _calls(case: Case, x, twin: dict, how: str):
    """A backend's outputs and written inputs: the twin's values, then changed as `how` says."""
    work, outs = clone_tensors(x), {}
    for n in case.op.outputs_for(case.params):
        getattr(work, n).copy_(twin[n].to(getattr(work, n).dtype))
        outs[n] = getattr(work, n)
    for n in case.op.writes_for(case.params):
        start = case.op.written_rows(case.params, x).get(n, 0)
        getattr(work, n)[start:].copy_(twin[n].to(getattr(work, n).dtype))
    first = next(iter(outs.values())).view(-1)
    if how == "off":
        first[::3] *= 1.5
    elif how == "nan":
        first[0] = float("nan")
    elif how == "pool":
        for n in case.op.writes_for(case.params):
            getattr(work, n).view(-1)[-1] += 1.0
    return work, outs


@pytest.mark.parametrize("case_id", CASES)
def test_a_memo_shared_by_backends_gives_the_verdicts_and_metrics_computed_without_it(case_id):
    case = Case.from_id(case_id, "cpu")
    op, p = case.op, case.params
    x = case.make_inputs()
    expected, twin = op.expected(p, x, torch.float64), op.expected(p, x, case.torch_dtype)
    rule, memo = rule_for(case), {}
    for how in ("twin", "off", "nan", "pool", "twin"):
        work, outs = _calls(case, x, twin, how)
        alone = checks.check(op, p, x, work, outs, expected, twin, rule)
        shared = checks.check(op, p, x, work, outs, expected, twin, rule, memo=memo)
        assert shared.problems == alone.problems, how
        assert json.dumps(shared.metrics, sort_keys=True) == json.dumps(alone.metrics, sort_keys=True), how
    assert memo  # it was used


def test_the_memo_is_not_used_for_another_reference():
    """Another expectation object (a perturbed input's, another case's) gets its own reference side."""
    case = Case.from_id(CASES[0], "cpu")
    op, p = case.op, case.params
    x = case.make_inputs()
    expected, twin = op.expected(p, x, torch.float64), op.expected(p, x, case.torch_dtype)
    memo: dict = {}
    rule = rule_for(case)
    work, outs = _calls(case, x, twin, "twin")
    assert checks.check(op, p, x, work, outs, expected, twin, rule, memo=memo).ok
    other, other_twin = {k: v.clone() for k, v in expected.items()}, {k: v.clone() for k, v in twin.items()}
    other["o"].view(-1)[::3] += 1.0
    other_twin["o"].view(-1)[::3] += 1.0
    again = checks.check(op, p, x, work, outs, other, other_twin, rule, memo=memo)
    assert again.problems == checks.check(op, p, x, work, outs, other, other_twin, rule).problems
    assert not again.ok and again.problems[0].startswith("o: abs error")


class TorchAgain(Backend):
    name = "torch-again"

    def supports(self, case):
        return get_backend("torch").supports(case)

    def prepare(self, case, x):
        return get_backend("torch").prepare(case, x)


@pytest.mark.parametrize("case_id", [CASES[0], CASES[2]])
def test_the_reference_side_is_computed_once_per_case_not_per_backend(monkeypatch, case_id):
    case = Case.from_id(case_id, "cpu")
    made: list = []
    real = checks.reference_side
    monkeypatch.setattr(checks, "reference_side", lambda *a, **k: made.append(1) or real(*a, **k))
    checks_only = (run_case.__globals__["active"]()[0],)  # the outputs check alone
    rows = run_case(case, [get_backend("torch"), TorchAgain()], RunOptions(timing=False, checks=checks_only))
    assert [r.status for r in rows] == ["pass", "pass"], [r.reason for r in rows]
    compared = [n for n, s in {**case.op.outputs_for(case.params), **case.op.writes_for(case.params)}.items()
                if not s.exact]  # fmt: skip
    assert len(made) == len(compared)  # for the first backend only
