"""Every FlashInfer variant on the smoke cases and a few GPU-sized ones, against float64 (GPU only).

Each (variant, case) must pass its float64 check or be a skip with a reason; a fail or an error is
reported with the variant, the case id and the check's reason. The JIT modules the selected tests
need are built first, in parallel (`attnbench.kernels.flashinfer.prebuild`).

    pytest tests/kernels/flashinfer/test_flashinfer_gpu.py -k "not fa3" -rs     # fa2, CUDA-core, ragged
    pytest tests/kernels/flashinfer/test_flashinfer_gpu.py -k fa3 -rs           # the SM90 fa3 kernels

`ATTNBENCH_JIT_BUDGET=all` widens the cases from head dim 64 to the whole smoke suite (gpu_cases.py).
"""

from __future__ import annotations

import pytest

from attnbench.backend import get_backend, load_builtin
from gpu_cases import budget, cases, in_budget
from helpers import run_one

load_builtin()
pytestmark = [pytest.mark.gpu, pytest.mark.flashinfer]

VARIANTS = ("flashinfer", "flashinfer-cudacore", "flashinfer-ragged", "flashinfer-fa3", "flashinfer-ragged-fa3")
SINK_CASE = "decode/b16-l4096-mixed-h64x8-d64-p16-swa127-sink-bf16"
CASES = {c.id: c for c in cases("cuda")}
PAIRS = [(v, cid) for v in VARIANTS for cid, c in CASES.items() if c.op_name in get_backend(v).ops]


@pytest.fixture(scope="session")
def flashinfer_modules(request):
    """Build the JIT modules of every selected (variant, case) at once, before the first test."""
    from attnbench.kernels.flashinfer import prebuild

    chosen: dict[str, set[str]] = {}
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "variant" in params and "case_id" in params and in_budget(CASES[params["case_id"]]):
            chosen.setdefault(params["variant"], set()).add(params["case_id"])
    keys = {}
    for variant, ids in chosen.items():
        selected = [CASES[i] for i in sorted(ids)]
        keys.update(dict.fromkeys(prebuild.keys_for([get_backend(variant)], selected)))
    return prebuild.prebuild(list(keys))


@pytest.mark.parametrize("variant, case_id", PAIRS, ids=[f"{v}:{c}" for v, c in PAIRS])
def test_variant_passes_or_skips_with_reason(variant, case_id, flashinfer_modules):
    case = CASES[case_id]
    if not in_budget(case):
        pytest.skip(f"outside the JIT budget {budget()!r} (head dim 64); ATTNBENCH_JIT_BUDGET=all runs it")
    row = run_one(case, get_backend(variant))
    if row.status == "skip":
        assert row.reason, f"{variant} {case_id}: a skip without a reason"
        pytest.skip(f"{variant}: {row.reason}")
    assert row.status == "pass", f"{variant} {case_id}: {row.status}: {row.reason} ({row.prepare_info})"
    info = row.prepare_info
    assert {"jit_s", "plan_s", "variant"} <= set(info), info


@pytest.mark.parametrize("variant", ["flashinfer", "flashinfer-fa3"])
def test_sinks_run_through_the_sink_wrapper(variant, flashinfer_modules):
    """A sink case must run (and pass) on the AttentionSink wrapper, never on a path that drops sinks."""
    row = run_one(CASES[SINK_CASE], get_backend(variant))
    assert row.status == "pass", f"{variant}: {row.status}: {row.reason}"
    assert "AttentionSink" in row.prepare_info["variant"]
    cuda_core = run_one(CASES[SINK_CASE], get_backend("flashinfer-cudacore"))
    assert cuda_core.status == "skip" and "sink" in cuda_core.reason
