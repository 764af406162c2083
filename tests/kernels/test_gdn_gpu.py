"""GDN backends on a GPU (compiled Triton, fla, FlashInfer) against the float64 references.

Skipped with a reason where no GPU (or library) is present; `nox -s gpu` runs them. Correctness only:
speed is measured by `attnbench sweep gdn`. `ATTNBENCH_TRITON_AUTOTUNE=0` makes our Triton kernels
compile one configuration each instead of autotuning (much faster for a correctness run).
"""

from __future__ import annotations

import pytest

from attnbench.backend import Backend, get_backend
from attnbench.kernels.flashinfer.gdn import FlashInferGDN, gdn_unsupported
from attnbench.plan.suite import load
from helpers import run_one

GDN_OPS = ("gdn_gating", "causal_conv1d", "gdn_decode", "gdn_extend", "gdn_verify", "gdn_commit")
SMOKE_GDN = [c.id for c in load("smoke").cases if c.op_name in GDN_OPS]
# Qwen3-Next heads (16 q/k, 32 v, K = V = 128) at small batches, every feature once
QWEN = [
    "gdn_gating/t4096-h32-bf16",
    "causal_conv1d/b16-t1-c8192-update-bf16",
    "causal_conv1d/b4-t200-mixed-c8192-initmixed-bf16",
    "causal_conv1d/b4-t4-c8192-pad1-verify-bf16",
    "causal_conv1d/b4-t8-c8192-tree-verify-bf16",
    "gdn_decode/b8-h16x32-d128x128-bf16",
    "gdn_decode/b8-h16x32-d128x128-pad2-packed-bf16",
    "gdn_decode/b8-h16x32-d128x128-fp16",
    "gdn_extend/b3-t300-mixed-h16x32-d128x128-initmixed-bf16",
    "gdn_extend/b2-t200-h32x32-d128x128-initnone-bf16",
    "gdn_extend/b2-t130-h16x32-d128x128-fp16",
    "gdn_verify/b4-t4-h16x32-d128x128-pad1-bf16",
    "gdn_verify/b4-t8-h16x32-d128x128-tree-bf16",
    "gdn_commit/b8-t4-h32-d128x128-c8192-pad2-bf16",
]


FLASHINFER_OPS = ("gdn_decode/", "gdn_extend/", "gdn_verify/")


def _check(case_id: str, backend: Backend) -> None:
    r = run_one(case_id, backend, device="cuda")
    if r.status == "skip":
        pytest.skip(r.reason)
    assert r.status == "pass", f"{r.status}: {r.reason}"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case_id", SMOKE_GDN + QWEN)
def test_gdn_on_gpu(case_id, backend):
    _check(case_id, get_backend(backend))


# fla autotunes its chunk kernels per head layout and dtype (~50 s each): two extend layouts only
FLA_CASES = [c for c in SMOKE_GDN + QWEN if c.startswith("gdn_decode/")] + [
    "gdn_extend/b3-t300-mixed-h16x32-d128x128-initmixed-bf16",
    "gdn_extend/b2-t200-h32x32-d128x128-initnone-bf16",
]


# A known fla discrepancy (docs/findings.md): its fused recurrent step leaves one state entry of this
# smoke case 2.2e-6 off float64 against a bound of 2.19e-6 (H200, fla-core 0.6.0). Strict: if fla
# starts passing, the mark must go.
FLA_KNOWN = {
    "gdn_decode/b5-h2x4-d16x16-packed-bf16": "fla fused recurrent: state 2.2e-6 off float64, bound 2.19e-6",
}


@pytest.mark.gpu
@pytest.mark.fla
@pytest.mark.parametrize(
    "case_id",
    [
        pytest.param(c, marks=pytest.mark.xfail(reason=FLA_KNOWN[c], strict=True)) if c in FLA_KNOWN else c
        for c in FLA_CASES
    ],
)
def test_fla_on_gpu(case_id):
    _check(case_id, get_backend("fla"))


class _FlashInferGDNOnly(FlashInferGDN, Backend):
    """The FlashInferGDN mixin alone (the flashinfer backend class merges it with the attention ops)."""

    name = "flashinfer-gdn-test"

    def supports(self, case):
        return super().supports(case) or gdn_unsupported(case)


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.flashinfer
@pytest.mark.parametrize("case_id", [c for c in QWEN if c.startswith(FLASHINFER_OPS)])
def test_flashinfer_gdn_on_gpu(case_id):
    _check(case_id, _FlashInferGDNOnly())


TIMED = ["gdn_decode/b64-h16x32-d128x128-bf16", "gdn_extend/b2-t1000-h16x32-d128x128-bf16"]


@pytest.mark.gpu
@pytest.mark.parametrize("case_id", TIMED)
def test_triton_gdn_timing_runs(case_id):
    """The timed path (autotuned kernels, repeated calls on an evolving pool) runs and times."""
    r = run_one(case_id, get_backend("triton"), device="cuda", timing=True)
    assert r.status == "pass", r.reason
    assert r.timing["median_us"] > 0 and r.derived["tbps"] > 0
