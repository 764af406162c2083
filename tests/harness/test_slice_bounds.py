"""Tolerance bounds per (request, head) slice: a short request's loose bound never covers a long one's error."""

from __future__ import annotations

import torch

from attnbench.backend import get_backend
from attnbench.check.checks import Verdict, compare_numeric, slice_index
from attnbench.check.tolerance import Rule
from attnbench.kernels.mutants.interactions import Bugs, attention_mutant
from attnbench.ops.base import OutputSpec
from helpers import run_one

SKEWED = "decode/b4-l1000-skewed-h8x2-d64-p16-bf16"  # one request of 1000 keys, three of 62


def test_bf16_accumulation_fails_its_slice_though_the_tensor_bound_covers_it():
    bad = run_one(SKEWED, attention_mutant("acc", Bugs(bf16_accumulate=True)))
    o = bad.metrics["o"]
    assert o["max_abs"] < o["bound_tensor"]  # the old per-tensor rule would have passed it
    assert bad.status == "fail" and "request/head slice" in bad.reason, bad.reason


def test_correct_backend_passes_and_no_slice_bound_exceeds_the_tensor_bound():
    row = run_one(SKEWED, get_backend("torch"))
    assert row.status == "pass", row.reason
    for name in ("o", "lse"):
        m = row.metrics[name]
        assert m["bound"] <= m["bound_tensor"] and m["slices"] == 4 * 8


def test_slice_index_groups_rows_by_request_and_head():
    idx, n = slice_index((5, 3, 2), ("token", "head", "dim"), torch.tensor([0, 0, 1, 1, 1]), "cpu")
    assert n == 6
    assert idx[0, 2, 1] == 2 and idx[4, 1, 0] == 1 * 3 + 1
    idx, n = slice_index((5, 3), ("token", "head"), None, "cpu")  # no requests (gdn_gating): one slice
    assert n == 1 and int(idx.max()) == 0


def test_each_slice_gets_its_own_bound():
    """Slice 0 has a large twin error, slice 1 none: an error in slice 1 within slice 0's bound fails."""
    ref = torch.zeros(2, 1, 4, dtype=torch.float64) + 1.0
    twin = ref.clone()
    twin[0] += 0.1  # the twin is far off in request 0 only
    actual = ref.clone().float()
    actual[1, 0, 0] += 0.05
    spec = OutputSpec(("token", "head", "dim"))
    v = Verdict()
    compare_numeric("o", actual, ref, twin, spec, Rule(), v, rows=torch.tensor([0, 1]))
    assert v.problems and "token 1" in v.problems[0], v.problems
    v = Verdict()
    compare_numeric("o", actual, ref, twin, spec, Rule(), v, rows=None)  # one slice: the old rule passes it
    assert not v.problems
