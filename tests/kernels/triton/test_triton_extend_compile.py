"""Extend's opt-in variants (TMA loads, persistent grid, 128-key blocks) compile for sm_90 on this CPU-only
machine (tools/probes/triton_sm90_compile.py: the real pipeline to ptxas, with a stand-in driver), fit in
Hopper's shared memory and do not spill. Case ids take the extend knobs as the probe's `@name=value`
options (`plan_extend(x, **knobs)`); the numbers are in kernels/triton/NOTES.md (Extend)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HOPPER_SMEM_PER_BLOCK = 232448  # 227 KiB, the opt-in maximum per block on sm_90
SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "probes" / "triton_sm90_compile.py"
PREFILL = "extend/b1-q256-pre0-h32x8-d128-p16-bf16"  # causal prefill, Llama-3 8B heads
PREFIX = "extend/b1-q256-pre512-h32x8-d128-p64-bf16"  # a prefix in 64-slot pages: cache blocks by TMA too
VARIANTS = [
    f"{PREFILL}@extend_tma=1",
    f"{PREFILL}@extend_persistent=1",
    f"{PREFILL}@extend_tma=1@extend_persistent=1",
    f"{PREFILL}@extend_block_n=128",  # 128 x 128 tiles, 3 stages: 224 KiB
    f"{PREFILL}@extend_block_n=128@extend_stages=2@extend_tma=1",
    f"{PREFIX}@extend_tma=1",  # unmasked and masked cache blocks by TMA (mixed with cp.async, ptxas crashed)
    "extend/b4-q512-pre0-mixed-h32x8-d128-p16-bf16@extend_tma=1",  # ragged: masked boxes across requests
    "extend/b2-q6-pre17-h4x2-d64-p16-kvshared-swa5-cap5-sink-fp8_e4m3-bf16@extend_tma=1@extend_block_n=16",
    "extend/b1-q5-pre8187-h32x8-d128-p16-bf16@extend_tma=1@extend_persistent=1",  # split path + merge
]


@pytest.fixture(scope="module")
def compiled() -> dict[str, list[dict]]:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("no bundled ptxas")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run(
        [sys.executable, str(SCRIPT), *VARIANTS], capture_output=True, text=True, env=env, cwd=SCRIPT.parents[2],
        timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    rows: dict[str, list[dict]] = {}
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rows.setdefault(row["case"], []).append(row)
    return rows


@pytest.mark.parametrize("case_id", VARIANTS)
def test_variant_compiles_fits_and_does_not_spill(compiled, case_id):
    rows = compiled[case_id]
    assert not [r["error"] for r in rows if "error" in r], rows
    for r in rows:
        assert r["shared"] <= HOPPER_SMEM_PER_BLOCK, f"{r['kernel']}: {r['shared']} bytes of shared memory"
        assert r["spill_bytes"] == 0, f"{r['kernel']}: spills {r['spill_bytes']} bytes ({r['regs']} regs)"
