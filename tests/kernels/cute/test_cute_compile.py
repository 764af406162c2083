"""Our CuTe DSL kernels lower to sm_90a machine code with 128-bit loads and no spills, checked without
a GPU (tools/probes/cute_sm90_compile.py compiles them with fake tensors; the DSL needs Python 3.12).

Register counts are printed (pytest -s), not asserted.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "probes" / "cute_sm90_compile.py"


def _has_dsl() -> bool:
    try:
        return importlib.util.find_spec("cutlass.cute") is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.skipif(not _has_dsl(), reason="needs nvidia-cutlass-dsl (cutlass.cute), which needs Python 3.12")
def test_cute_kernels_compile_for_sm90_with_vector_loads():
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=900)
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    print(run.stdout)
    assert run.returncode == 0, run.stderr[-3000:]
    mains = {r["config"] for r in rows if r["kernel"] == "main"}
    assert {"decode-gqa4-d128-p16", "gdn-bv32"} <= mains, mains
