"""tree_verify on SGLang's Triton backend as its server runs target verify (EAGLE): the draft tree as a
custom-mask `extend_attention_fwd` over the paged prefix, the new K/V saved first. Under
TRITON_INTERPRET=1 on tiny fp16/fp32 cases, each row through the harness (float64 verdicts, untouched
inputs, canaries, stale outputs)."""

from __future__ import annotations

import pytest

from attnbench.backend import get_backend
from attnbench.case import Case
from helpers import KERNEL, run_one
from sglang_env import sglang_backend_or_skip

CASES = [
    "tree_verify/b2-pre20-h4x2-d16-p4-treeeagle-depth3-k2-n6-fp16",  # an EAGLE tree (top-k 2, 6 drafts)
    "tree_verify/b3-pre30-mixed-h4x2-d16-p4-treechain-depth4-fp16",  # a chain, mixed prefix lengths
    "tree_verify/b2-pre20-h4x2-d16-p1-sink-tree0_1_0.0_0.1_1.0-depth2-fp32",  # explicit choices, sinks, page 1
    "tree_verify/b2-pre9-h4x1-d576x512-p1-mla-treeeagle-depth3-k2-n6-fp16",  # absorbed MLA
]


@pytest.fixture(scope="module")
def sglang():
    return sglang_backend_or_skip()


def test_sglang_declares_tree_verify():
    b = get_backend("sglang")
    assert "tree_verify" in b.ops
    assert all(b.limits(Case.from_id(c, "cuda")) is None for c in CASES)
    fp8 = Case.from_id("tree_verify/b2-pre20-h4x2-d16-p4-treechain-depth4-fp8_e4m3-fp16", "cuda")
    assert b.limits(fp8) is None  # the layer's k/v scales as floats (test_sglang_fp8_extend.py)


@pytest.mark.interpreter
@pytest.mark.parametrize("case_id", CASES)
def test_tree_verify_passes(sglang, case_id):
    r = run_one(case_id, sglang, **KERNEL)
    assert r.status == "pass", f"{r.status}: {r.reason}"
    assert r.prepare_info["variant"] == "extend_attention_fwd (custom mask)"
