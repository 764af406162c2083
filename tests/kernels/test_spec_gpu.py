"""Spec-family backends on a CUDA GPU: the smoke cases, and one case per op at suite size."""

from __future__ import annotations

import pytest

from attnbench.backend import get_backend
from attnbench.plan.suite import load
from helpers import run_one

pytestmark = pytest.mark.gpu

SPEC_OPS = ("tree_verify", "eagle_build_tree", "verify_greedy")
CASES = [c.id for c in load("smoke").cases if c.op_name in SPEC_OPS] + [
    "tree_verify/b16-pre2048-mixed-h32x8-d128-p16-treeeagle-depth5-k8-n64-bf16",
    "tree_verify/b4-pre4096-h32x8-d128-p16-treetypical-depth4-k6-bf16",
    "eagle_build_tree/b64-pre4096-k8-depth5-n64-maskfull-bf16",
    "eagle_build_tree/b64-pre4096-k8-depth4-n32-maskqlen_packed-bf16",
    "verify_greedy/b64-treeeagle-depth5-k8-n64-bf16",
]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case_id", CASES)
def test_spec_on_gpu(case_id, backend):
    b = get_backend(backend)
    r = run_one(case_id, b, device="cuda")
    if case_id.startswith("tree_verify") and not hasattr(b, "prepare_extend"):
        pytest.skip(f"{backend} has no extend kernel on this branch")
    assert r.status == "pass", r.reason
