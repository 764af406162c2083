"""The Triton attention kernels compile for sm_90 (Hopper) on this CPU-only machine.

The interpreter runs Python semantics; this lowers the same kernels through Triton's real pipeline
for sm_90 (tools/probes/triton_sm90_compile.py, a stand-in driver, the bundled ptxas), so constructs that
do not lower, shared memory over the per-block limit and register spills in the kernels that must
be fast are caught without a GPU.
"""

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

# the kernels behind the performance targets: they must not spill
FAST = [
    "decode/b2-l300-h32x8-d128-p16-bf16",  # GQA decode (both stages)
    "decode/b2-l3000-h32x8-d128-p16-bf16@pdl=1",  # the merge as a programmatic dependent (griddepcontrol)
    "decode/b2-l3000-h128x1-d576x512-p64-mla-bf16@pdl=1",  # the same after the warp-specialized MLA kernel
    "decode/b2-l300-h128x1-d576x512-p64-mla-bf16",  # MLA decode: the warp-specialized Gluon kernel (decode_mla_ws.py)
    "decode/b2-l300-h128x1-d576x512-p64-mla-bf16@impl=wgmma",  # the Gluon kernel without roles (decode_mla_gluon.py)
    "decode/b2-l300-h128x1-d576x512-p64-mla-bf16@impl=triton",  # the Triton MLA kernel (decode_mla.py)
    "extend/b1-q256-pre0-h32x8-d128-p16-bf16",  # causal prefill, head dim 128
    "extend/b1-q256-pre0-h32x8-d128-p16-bf16@kernel=ws",  # the same by the Gluon prefill (prefill_ws.py)
    "extend/b2-q200-pre0-h8x1-d64-p16-fp16@kernel=ws",  # ragged, head dim 64, MQA, fp16
    "extend/b2-q200-pre300-h8x2-d128-p16-bf16@kernel=ws",  # over a paged prefix: whole blocks by TMA, the end gathered
    "extend/b2-q200-pre300-h8x2-d64-p1-bf16@kernel=ws",  # pages of one slot: every prefix block gathered
    "extend/b1-q5-pre8187-h32x8-d128-p16-bf16",  # spec verify: GQA-packed split path (planned for 132 SMs) + merge
    "extend/b64-q16-pre1024-h32x8-d128-p16-bf16@pack=1",  # a batch of 16-token requests: packed 64-row tiles (forced)
    "extend/b64-q8-pre1024-h32x8-d128-p16-bf16",  # spec verify, a batch: GQA-packed 32-row tiles, unsplit
    # fp8 decode on fp16 tensor cores, V converted in its load layout (DecodeConfig.fp8_dequant "f16-rows", "f16-bits")
    "decode/b2-l300-h32x8-d128-p16-fp8_e4m3-bf16@fp8_dequant=2",
    "decode/b2-l300-h32x8-d128-p16-fp8_e4m3-bf16@fp8_dequant=3",
    # the fused merge (DecodeConfig/MLAConfig.fused_merge): split requests merged inside the split launch
    "decode/b2-l3000-h32x8-d128-p16-bf16@fused_merge=1",  # GQA, 12 splits a request
    "decode/b2-l300-h128x1-d576x512-p64-mla-bf16@fused_merge=1",  # MLA kernel, 3 splits
]
# one case per constexpr branch: must compile and fit in shared memory
BRANCHES = [
    "decode/b2-l45-h4x4-d128-p1-bf16",  # MHA vector path, token slots
    "decode/b2-l300-h128x1-d576x512-p64-mla-bf16@mla=0",  # MLA on the generic kernel (tiling variants)
    "decode/b2-l300-h128x1-d576x512-p64-mla-swa100-cap5-sink-bf16",  # MLA kernel: masked head block, cap, sink
    "decode/b2-l300-h128x1-d576x512-p128-mla-swa100-fp16",  # Gluon ws kernel: masked head block, fp16, pages of 128
    "decode/b2-l300-h128x1-d576x512-p128-mla-swa100-fp16@impl=wgmma",
    "decode/b2-l300-h128x1-d576x512-p64-mla-bf16@use_tma=1",  # MLA kernel, blocks by tensor descriptor
    "decode/b2-l45-h8x1-d96-p64-fp16",  # MQA, 64 + 32 head split
    "decode/b2-l300-h8x2-d64-p16-swa7-cap5-sink-bf16",
    "decode/b2-l45-h4x2-d192x128-p16-fp32",  # ieee dots, Dk != Dv
    "extend/b2-q6-pre17-h4x2-d64-p16-bidirectional-bf16",
    "extend/b2-q6-pre17-h4x2-d64-p16-custom-bf16",
    "extend/b2-q6-pre17-h4x2-d64-p16-kvattend-bf16",
    "extend/b2-q6-pre17-h4x2-d64-p1-kvshared-swa5-cap5-sink-bf16",
    "extend/b2-q6-pre17-h4x1-d13-p16-bf16",
    "extend/b2-q64-pre17-h4x1-d256-p16-bf16",
    "extend/b2-q5-pre20-h16x1-d576x512-p16-mla-bf16",
    "extend/b2-q6-pre12-h4x4-d32-p16-fp32",
    "merge_state/t33-h4-d64-empty-bf16",
    # extend's GQA packing forced off (ID@pack=0) where the plan packs, and packed odd groups
    "extend/b1-q5-pre8187-h32x8-d128-p16-bf16@pack=0",
    "extend/b2-q6-pre17-h4x2-d64-p16-custom-bf16@pack=0",
    "extend/b2-q6-pre17-h6x2-d80-p16-bf16",  # G = 3: 5 tokens per 16 rows
    "extend/b2-q5-pre20-h128x1-d576x512-p16-mla-bf16",  # 64 of 128 heads per tile
    # extend's split path, forced (ID@splits=N): partials + the merge with empty splits
    "extend/b2-q6-pre17-h4x2-d64-p16-custom-bf16@splits=3",
    "extend/b2-q6-pre17-h4x2-d64-p1-kvshared-swa5-cap5-sink-bf16@splits=3",
    "extend/b2-q5-pre20-h16x1-d576x512-p16-mla-bf16@splits=3",
    # fp8 KV caches (KV_FP8: fp8 loads converted to the query dtype, scales folded in; save rounds to fp8)
    "decode/b2-l300-h32x8-d128-p16-fp8_e4m3-bf16",
    "decode/b2-l300-h128x1-d576x512-p64-mla-fp8_e4m3-bf16",
    "decode/b2-l45-h4x4-d128-p1-fp8_e5m2-kvscalehead-fp16",
    "decode/b2-l45-h4x2-d192x128-p16-fp8_e4m3-fp32",
    "decode/b2-l3000-h4x4-d128-p1-bf16@fused_merge=1",  # MHA vector path, fused merge
    "decode/b2-l3000-h8x2-d64-p16-swa2000-cap5-sink-fp8_e4m3-kvscalehead-bf16@fused_merge=1",  # sink in the merge
    "decode/b2-l300-h32x8-d128-p16-fp8_e4m3-bf16@fp8_dequant=1",  # fp16 tensor cores, operand-layout conversion
    "decode/b2-l45-h8x1-d96-p64-fp8_e5m2-fp16@fp8_dequant=2",  # e5m2 by byte permutes, 64 + 32 split
    "decode/b2-l300-h8x2-d64-p16-swa7-cap5-sink-fp8_e4m3-kvscalehead-bf16@fp8_dequant=3",
    "extend/b1-q256-pre0-h32x8-d128-p16-fp8_e4m3-kvscalehead-bf16",
    "extend/b1-q5-pre8187-h32x8-d128-p16-fp8_e5m2-bf16",
    "extend/b2-q6-pre17-h4x2-d64-p16-kvattend-fp8_e5m2-bf16",
    "extend/b2-q6-pre17-h4x2-d64-p1-kvshared-swa5-cap5-sink-fp8_e4m3-kvscalehead-bf16",
    "extend/b2-q6-pre17-h4x2-d80-p16-fp8_e5m2-fp16",
    "extend/b2-q5-pre20-h16x1-d576x512-p16-mla-fp8_e4m3-bf16",
    "extend/b2-q5-pre20-h16x1-d576x512-p16-mla-fp8_e5m2-bf16@splits=3",
]


def _compile(ids: list[str]) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    half = (len(ids) + 1) // 2
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), *part],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=SCRIPT.parents[2],
        )  # fmt: skip
        for part in (ids[:half], ids[half:])
    ]
    rows = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows


@pytest.fixture(scope="module")
def compiled() -> dict[str, list[dict]]:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip(f"no bundled ptxas at {ptxas}")
    by_case: dict[str, list[dict]] = {}
    for row in _compile(FAST + BRANCHES):
        by_case.setdefault(row["case"], []).append(row)
    return by_case


@pytest.mark.parametrize("case_id", FAST + BRANCHES)
def test_compiles_for_sm90(compiled, case_id):
    rows = compiled[case_id]
    errors = [r["error"] for r in rows if "error" in r]
    assert not errors, errors[0]
    for r in rows:
        assert r["shared"] <= HOPPER_SMEM_PER_BLOCK, f"{r['kernel']}: {r['shared']} bytes of shared memory"


# spills measured and accepted: the Triton MLA kernel with pointer loads spills 88 bytes (255 registers: the 64 x 512
# fp32 accumulator is half of them) and ran 1-3% faster on an H100 than the same kernel with TMA loads
# (8 bytes) and 14-22% faster than the generic kernel (0 bytes): reports/examples/h100-session10
MEASURED_SPILLS = {
    ("decode/b2-l300-h128x1-d576x512-p64-mla-bf16@impl=triton", "_mla_decode_kernel"): 88,
    ("decode/b2-l300-h128x1-d576x512-p64-mla-bf16@fused_merge=1", "_mla_decode_kernel"): 88,  # the same spill
    # the Gluon prefill over a prefix: 60 bytes, in its loader warps (40 registers: the work-item loop, a block's
    # 8 page rows read early)
    ("extend/b2-q200-pre300-h8x2-d128-p16-bf16@kernel=ws", "prefill_ws_kernel"): 60,
}


@pytest.mark.parametrize("case_id", FAST)
def test_fast_kernels_do_not_spill(compiled, case_id):
    for r in compiled[case_id]:
        allowed = MEASURED_SPILLS.get((case_id, r["kernel"]), 0)
        assert r["spill_bytes"] <= allowed, f"{r['kernel']}: spills {r['spill_bytes']} bytes ({r['regs']} regs)"
