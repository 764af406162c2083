"""Our GDN Triton kernels lower to sm_90 machine code, checked on a CPU (ptxas ships with triton).

The interpreter runs code the compiler would reject; this catches that class of GPU-only failure
without a GPU. Register and spill counts are printed (pytest -s), not asserted.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "probes" / "gdn_sm90_compile.py"
CHUNK = [
    "_chunk_cumsum_kernel",
    "_chunk_tri_batched_kernel",
    "_chunk_wu_kernel",
    "_chunk_state_kernel",
    "_chunk_state_regs_kernel",
    "_chunk_out_kernel",
    "_chunk_state_out_kernel",
]
# gating; decode and tree verify (canonical and K-last pool); the streamed decode's and the K-last decode's tilings; conv fn and update; the chunk kernels in bf16 and fp32
EXPECTED = [
    "_gdn_gating_kernel",
    *["_gdn_recurrent_kernel"] * 2,
    "_gdn_recurrent_kernel[vk]",
    *(
        f"_gdn_decode_stream_kernel[{t}]"
        for t in ("cols128,bv16,w4", "cols128,bv32,w4", "cols64,bv16,w2", "cols128,bv8,w1")
    ),
    *(f"_gdn_decode_vk_kernel[{t}]" for t in ("bv16,w4", "bv8,w4", "bv32,w4", "bv16,w2", "bv8,w1", "bv16,w1")),
    "_conv1d_prefill_kernel",
    "_conv1d_update_kernel",
    *CHUNK,
    *CHUNK,
    "_chunk_tri_batched_kernel[blocks,neumann]",
    "_chunk_tri_batched_kernel[blocks,subst]",
    "_chunk_tri_batched_kernel[once,subst]",
    "_chunk_tri_batched_kernel[fuse_out]",
    "_chunk_tri_batched_kernel[wu]",
    "_chunk_tri_batched_kernel[uncapped]",
    "_chunk_out_kernel[bvi64,maxnreg]",
    "_chunk_state_out_kernel[loop]",
    "_chunk_state_out_kernel[wu]",
]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_gdn_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=900)
    if run.returncode and "ptxas" in run.stderr and "not found" in run.stderr.lower():
        pytest.skip("no ptxas in this triton install")
    assert run.returncode == 0, run.stderr[-4000:]
    lines = run.stdout.strip().splitlines()
    print("\n".join(lines))
    assert [line.split()[0] for line in lines] == EXPECTED
