"""`--sanitize memcheck` on a real GPU (needs CUDA and compute-sanitizer; skipped otherwise).

    python -m pytest -q tests/harness/test_sanitizer_gpu.py

The plugin tests/support/faulty_triton.py has two Triton decode kernels with real memory bugs that leave the
outputs right: the plain checks pass them, memcheck must fail them (and name their kernel), and the
same kernel without the bug, our Triton backend and torch must come out clean.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.results import read_results

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

PLUGIN = "tests/support/faulty_triton.py"
# page size 1: the last request's read past its sequence runs off the page table, and the pool's
# last page is in use, so a read one row past a page runs off the cache
CASES = ["decode/b3-l37-mixed-h8x2-d128-p1-bf16", "decode/b8-l1000-h8x2-d128-p1-bf16"]
FAULTY = ["faulty-seq", "faulty-page"]
CLEAN = ["faulty-none", "triton", "torch"]


def sweep(tmp_path, name, *extra):
    args = ["sweep", "--plugin", PLUGIN, "--no-timing", "--out", str(tmp_path / name)]
    for c in CASES:
        args += ["--case", c]
    for b in FAULTY + CLEAN:
        args += ["-b", b]
    r = CliRunner().invoke(app, args + list(extra), catch_exceptions=False)
    return r, {(row.case_id, row.backend): row for row in read_results(tmp_path / name / "results.jsonl")}


def test_the_plain_checks_miss_the_faulty_kernels(tmp_path):
    r, rows = sweep(tmp_path, "plain")
    assert all(row.status == "pass" for row in rows.values()), [
        (k, v.reason) for k, v in rows.items() if v.status != "pass"
    ]


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None and not __import__("os").path.exists(
    "/usr/local/cuda/bin/compute-sanitizer"), reason="needs compute-sanitizer")  # fmt: skip
def test_memcheck_catches_them_and_clears_the_rest(tmp_path):
    r, rows = sweep(tmp_path, "memcheck", "--sanitize", "memcheck", "--sanitize-max", "0")
    assert r.exit_code == 1, r.output
    for (case, backend), row in rows.items():
        if backend in FAULTY:
            assert row.status == "fail", (case, backend, row.reason)
            assert row.reason.startswith("memcheck: ") and "_faulty_decode_kernel" in row.reason, row.reason
            assert "out of bounds" in row.reason or "Address" in row.reason, row.reason
            assert (tmp_path / "memcheck" / row.sanitizer["log"]).is_file()
        else:
            assert row.status == "pass", (case, backend, row.reason)
            assert row.sanitizer["findings"] == 0
