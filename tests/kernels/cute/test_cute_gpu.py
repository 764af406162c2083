"""Our CuTe DSL kernels (the `cute` backend) on a GPU, through the harness, against float64 (GPU only).

Each case must pass its float64 check (or be a skip with a reason). Compilation happens in `prepare`
(about 0.5 s to 1 s per static configuration on an H200) and is cached in-process.

    pytest tests/kernels/cute/test_cute_gpu.py -rs
    python tools/probes/cute_gpu_smoke.py      # the same kernels with errors vs torch, timings, tracebacks
"""

from __future__ import annotations

import pytest

from attnbench.backend import get_backend, load_builtin
from attnbench.plan.suite import load
from helpers import run_one

load_builtin()
pytestmark = [pytest.mark.gpu, pytest.mark.sm90, pytest.mark.cute]

DECODE = [
    "decode/b4-l300-h8x8-d128-p16-bf16",  # MHA
    "decode/b3-l1000-mixed-h32x8-d128-p16-bf16",  # GQA, mixed lengths, split + merge
    "decode/b2-l777-h16x1-d64-p1-fp16",  # MQA, page 1, fp16
    "decode/b2-l5000-h8x2-d128-p64-bf16",  # page 64
    "decode/b3-l500-h8x2-d64-p16-swa100-cap30-bf16",  # window + soft cap
    "decode/b3-l3000-h8x2-d128-p16-sink-bf16",  # sinks through the merge
    "decode/b16-l4096-mixed-h64x8-d64-p16-swa127-sink-bf16",  # gpt-oss-like
    "decode/b3-l5-h32x8-d128-p16-bf16",  # fewer keys than warps x lane groups: empty warps, masked keys
    "decode/b5-l37-mixed-h16x4-d64-p1-fp16",  # short mixed lengths, D = 64 with 4 heads a CTA
]
GDN = [
    "gdn_decode/b4-h4x4-d128x128-bf16",
    "gdn_decode/b8-h16x32-d128x128-fp16",
    "gdn_decode/b8-h16x32-d128x128-pad2-packed-bf16",
    "gdn_decode/b64-h32x32-d128x128-bf16",
]
SMOKE = [c.id for c in load("smoke").cases if c.op_name in ("decode", "gdn_decode")]


@pytest.mark.parametrize("case_id", DECODE + GDN + [c for c in SMOKE if c not in DECODE + GDN])
def test_cute_passes_or_skips_with_reason(case_id):
    row = run_one(case_id, get_backend("cute"), device="cuda")
    if row.status == "skip":
        assert row.reason, f"cute {case_id}: a skip without a reason"
        pytest.skip(f"cute: {row.reason}")
    assert row.status == "pass", f"cute {case_id}: {row.status}: {row.reason} ({row.prepare_info})"
    assert "compile_s" in row.prepare_info
