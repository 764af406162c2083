"""The checks as data (harness/check/checklist.py): the runner applies the list it is given, in order, and
holds each check to its declaration."""

from __future__ import annotations

import pytest

from attnbench.backend import Backend, get_backend
from attnbench.case import Case
from attnbench.check.checklist import CHECKS, OutputsCheck, validate
from attnbench.kernels.torch.attention import paged_attention
from attnbench.run.runner import RunOptions, run_case

CASE = "decode/b2-l45-h4x2-d13-p16-bf16"


class _Toy:
    def __init__(self, name="toy", needs=("outputs",), records=("toy",), result=None):
        self.name, self.needs, self.records = name, frozenset(needs), tuple(records)
        self.result = {"toy": 1} if result is None else result
        self.ran = 0

    def applies(self, ctx):
        return True

    def run(self, ctx):
        self.ran += 1
        return self.result


def _run(backend, checks=None):
    return run_case(Case.from_id(CASE, "cpu"), [backend], RunOptions(timing=False, checks=checks))[0]


def test_the_default_list_is_outputs_determinism_invariance_stale_replay():
    assert [c.name for c in CHECKS] == ["outputs", "determinism", "invariance", "stale", "replay"]
    row = _run(get_backend("torch"))
    assert row.status == "pass" and list(row.check_parts) == ["outputs", "determinism", "stale", "replay"]
    assert row.replay.startswith("skip: not graph-safe")  # decode is graph-captured; torch's is not graph-safe
    assert row.deterministic is True and row.batch_invariant is None  # invariance applies only when asked


def test_the_runner_applies_the_list_it_is_given_and_the_row_gets_what_each_records():
    toy = _Toy()
    row = _run(get_backend("torch"), (OutputsCheck(), toy))
    assert toy.ran == 1 and list(row.check_parts) == ["outputs", "toy"]
    assert row.deterministic is None and row.model_dump()["toy"] == 1 and row.metrics


def test_a_check_that_returns_a_field_it_does_not_declare_is_an_error_naming_it():
    row = _run(get_backend("torch"), (OutputsCheck(), _Toy(result={"other": 2})))
    assert row.status == "error" and "check 'toy' returned ['other']" in row.reason, row.reason


def test_checks_that_call_again_do_not_run_on_malformed_outputs():
    def wrong_shape(x):
        paged_attention(x)
        return {"o": x.o[:1], "lse": x.lse}

    def prepare(self, case, x):
        return lambda: wrong_shape(x)

    bad = type("WrongShape", (Backend,), {"name": "wrong-shape", "prepare_decode": prepare})()
    again, only_outputs = _Toy("again", ("outputs", "call_again"), ()), _Toy("look", ("outputs",), (), {})
    row = _run(bad, (OutputsCheck(), again, only_outputs))
    assert row.status == "fail" and again.ran == 0 and only_outputs.ran == 1


@pytest.mark.parametrize(
    "checks, why",
    [
        ((_Toy(needs=("outputs", "gpu")),), "needs ['gpu']"),
        ((_Toy(), _Toy(records=())), "two checks are named 'toy'"),
        ((_Toy("a"), _Toy("b")), "checks 'a' and 'b' both record 'toy'"),
        ((object(),), "is not a Check"),
    ],
)
def test_a_list_the_runner_could_not_apply_is_refused(checks, why):
    with pytest.raises(TypeError, match=why.replace("[", r"\[").replace("]", r"\]")):
        validate(checks)
