"""The Triton attention backend compiled on a CUDA GPU (skipped without one).

    python -m pytest -q tests/kernels/triton/test_triton_gpu.py

Runs every smoke case with both registered variants, the performance-target shapes once each for
correctness (timing is the suites' job: `attnbench sweep decode extend mla swa --backend triton`),
and checks what only a GPU can: the bound fast launch equals the ordinary launch bit for bit, and
the deterministic decode is batch-invariant with real GPU reductions.
"""

from __future__ import annotations

import pytest
import torch

from attnbench.backend import get_backend, load_builtin
from attnbench.buffers import bits, clone_tensors
from attnbench.case import Case
from attnbench.plan.suite import load
from helpers import run_one

pytestmark = pytest.mark.gpu

load_builtin()
SMOKE = load("smoke", "cuda").cases

# the shapes of the performance targets (and their neighbours), checked once each at full size
TARGETS = [
    "decode/b64-l4096-h32x8-d128-p16-bf16",
    "decode/b1-l8192-h32x8-d128-p16-bf16",  # many splits, two stages
    "decode/b64-l4096-skewed-h32x8-d128-p16-bf16",
    "decode/b64-l4096-h32x8-d128-p1-bf16",
    "decode/b32-l4096-h32x32-d128-p16-bf16",  # MHA
    "decode/b16-l4096-h128x1-d576x512-p64-mla-bf16",  # MLA, 4 splits per request
    "decode/b64-l4096-h64x8-d64-p16-swa127-sink-bf16",
    "extend/b1-q2048-pre0-h32x8-d128-p16-bf16",  # prefill: the autotuned path
    "extend/b4-q512-pre1024-h32x8-d128-p16-bf16",
    "extend/b2-q256-pre1024-h32x8-d128-p16-custom-bf16",
    "extend/b1-q1024-pre0-h128x1-d576x512-p64-mla-bf16",
    "extend/b1-q1024-pre2048-h16x8-d256-p16-swa1023-cap50-bf16",
    "extend/b64-q8-pre1024-h32x8-d128-p16-custom-bf16",  # spec verify, a batch: GQA-packed tiles
    "extend/b1-q5-pre8187-h32x8-d128-p16-custom-bf16",  # spec verify, one request: packed + split
]


@pytest.mark.parametrize("backend", ["triton", "triton-det"])
@pytest.mark.parametrize("case", SMOKE, ids=[c.id for c in SMOKE])
def test_smoke_on_gpu(case, backend):
    b = get_backend(backend)
    if case.op_name not in b.ops:  # triton-det covers the attention ops only
        pytest.skip(f"{backend} has no {case.op_name} kernel")
    row = run_one(case, b)
    assert row.status == "pass", row.reason


@pytest.mark.parametrize("case_id", TARGETS)
def test_target_shapes(case_id):
    row = run_one(case_id, get_backend("triton"), device="cuda")
    assert row.status == "pass", row.reason


@pytest.mark.parametrize(
    "case_id", ["decode/b1-l8192-h32x8-d128-p16-bf16", "extend/b2-q300-pre200-h8x2-d128-p16-custom-bf16"]
)
def test_bound_launch_equals_plain_launch(case_id):
    from attnbench.kernels.triton import decode, extend, extend_plan

    x = Case.from_id(case_id, "cuda").make_inputs()
    y = clone_tensors(x)
    if case_id.startswith("decode"):
        bound = decode.bind_decode(x, decode.plan_decode(x))()
        plain = decode.decode(y, decode.plan_decode(y))
    else:
        bound = extend.bind_extend(x, extend_plan.plan_extend(x))()
        plain = extend.extend(y, extend_plan.plan_extend(y))
    torch.cuda.synchronize()
    for name in ("o", "lse"):
        assert torch.equal(bits(bound[name]), bits(plain[name])), name


def test_deterministic_decode_is_batch_invariant_on_gpu():
    from attnbench.kernels.triton.decode import decode, plan_decode
    from helpers import decode_request as _request

    x = Case.from_id("decode/b6-l3000-mixed-h32x8-d128-p16-swa2000-sink-bf16", "cuda").make_inputs()
    batch = decode(x, plan_decode(x, deterministic=True))
    for b in range(len(x.seq_lens_host)):
        alone = _request(x, b)
        out = decode(alone, plan_decode(alone, deterministic=True))
        assert torch.equal(bits(out["o"]), bits(batch["o"][b : b + 1])), f"request {b}: o"
        assert torch.equal(bits(out["lse"]), bits(batch["lse"][b : b + 1])), f"request {b}: lse"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("backend", ["triton", "triton-det"])
@pytest.mark.parametrize(
    "case_id", ["decode/b64-l4096-h64x8-d64-p16-swa127-sink-bf16", "extend/b4-q512-pre1024-h32x8-d128-p16-bf16"]
)
def test_a_case_on_the_second_gpu_while_the_first_is_current(case_id, backend):
    """Triton launches on the current device: the runner must make the case's GPU current (the pytest
    plugin under xdist runs worker gw1 on cuda:1 in a process whose current device is cuda:0)."""
    torch.cuda.set_device(0)
    row = run_one(case_id, get_backend(backend), device="cuda:1")
    assert row.status == "pass", row.reason
    assert torch.cuda.current_device() == 0


@pytest.mark.parametrize(
    "case_id", ["extend/b64-q8-pre1024-h32x8-d128-p16-custom-bf16", "extend/b1-q5-pre8187-h32x8-d128-p16-bf16"]
)
def test_gqa_packed_extend_matches_unpacked(case_id):
    """The planner's GQA-packed tiles against one head per tile, compiled (wgmma shapes differ)."""
    from attnbench.kernels.triton import extend, extend_plan

    x = Case.from_id(case_id, "cuda").make_inputs()
    y = clone_tensors(x)
    packed, unpacked = extend_plan.plan_extend(x), extend_plan.plan_extend(y, pack=False)
    assert packed.meta["HEADS"] == 4 and unpacked.meta["HEADS"] == 1
    a, b = extend.extend(x, packed), extend.extend(y, unpacked)
    torch.cuda.synchronize()
    torch.testing.assert_close(a["o"].float(), b["o"].float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(a["lse"], b["lse"], atol=1e-5, rtol=1e-5)
