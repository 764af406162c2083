"""FlashAttention-4 (`fa4`) on the smoke cases and a few GPU-sized ones, against float64 (GPU only).

Each case must pass its float64 check or be a skip with a reason; a fail or an error is reported with
the case id and the check's reason. FA4 compiles each static configuration on its first call (in
`prepare`, recorded as `compile_s`); the budget of gpu_cases.py keeps the configurations few
(`ATTNBENCH_JIT_BUDGET=all`: every smoke case).

    pytest tests/kernels/cute/test_fa4_gpu.py -rs
"""

from __future__ import annotations

import pytest

from attnbench.backend import get_backend, load_builtin
from gpu_cases import budget, cases, fa4_in_budget
from helpers import run_one

load_builtin()
pytestmark = [pytest.mark.gpu, pytest.mark.cute]

CASES = {c.id: c for c in cases("cuda") if c.op_name in ("decode", "extend")}


@pytest.mark.parametrize("case_id", list(CASES))
def test_fa4_passes_or_skips_with_reason(case_id):
    case = CASES[case_id]
    if not fa4_in_budget(case):
        pytest.skip(f"outside the compile budget {budget()!r} (gpu_cases.py); ATTNBENCH_JIT_BUDGET=all: all")
    row = run_one(case, get_backend("fa4"))
    if row.status == "skip":
        assert row.reason, f"fa4 {case_id}: a skip without a reason"
        pytest.skip(f"fa4: {row.reason}")
    assert row.status == "pass", f"fa4 {case_id}: {row.status}: {row.reason} ({row.prepare_info})"
    assert "compile_s" in row.prepare_info


def test_fa4_sinks_window_soft_cap_run():
    """gpt-oss decode (window 127 + sinks) must run on FA4's SM90 forward, not be skipped."""
    row = run_one(CASES["decode/b16-l4096-mixed-h64x8-d64-p16-swa127-sink-bf16"], get_backend("fa4"))
    assert row.status == "pass", f"{row.status}: {row.reason}"
