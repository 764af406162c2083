"""Crash isolation on a real GPU (skipped without one): a Triton kernel that stores to an illegal
address breaks its worker's CUDA context; its rows become errors, a fresh worker takes over and the
other backends of the same and later cases still pass.

    python -m pytest -q tests/harness/test_reliability_gpu.py
"""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.results import read_results

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

CASES = ["decode/b3-l37-mixed-h8x2-d128-p1-bf16", "decode/b4-l300-h8x2-d128-p16-bf16"]


def test_a_context_breaking_triton_kernel_costs_only_its_rows(tmp_path):
    args = ["sweep", "--plugin", "tests/support/faulty_triton.py", "--no-timing", "--out", str(tmp_path / "run"),
            "-b", "torch", "-b", "faulty-crash", "-b", "triton"]  # fmt: skip
    for c in CASES:
        args += ["--case", c]
    r = CliRunner().invoke(app, args, catch_exceptions=False)
    assert r.exit_code == 1, r.output
    rows = {(x.case_id, x.backend): x for x in read_results(tmp_path / "run" / "results.jsonl")}
    assert len(rows) == 2 * 3
    for case in CASES:
        crash = rows[(case, "faulty-crash")]
        assert crash.status == "error" and "illegal" in crash.reason.lower(), crash.reason
        assert rows[(case, "torch")].status == "pass" and rows[(case, "triton")].status == "pass"
    logs = list((tmp_path / "run" / "logs").glob("worker-*.log"))
    assert len(logs) >= 3, "a fresh worker after each broken context"
