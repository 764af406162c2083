"""The `cute` backend (our CuTe DSL kernels) on a CPU: skip reasons, limits, and the pure-Python helpers."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.kernels.cute import common, decode_plan, gdn_decode
from attnbench.references import gdn as ref_gdn
from helpers import run_one


def test_registered_with_its_ops():
    assert get_backend("cute").ops == frozenset({"decode", "gdn_decode"})


@pytest.mark.parametrize("case_id", ["decode/b2-l45-h4x2-d64-p16-bf16", "gdn_decode/b4-h4x4-d128x128-bf16"])
def test_cpu_rows_are_skips_with_a_reason(case_id):
    row = run_one(case_id, get_backend("cute"))
    assert row.status == "skip"
    expected = common.unavailable() or "CUDA"
    assert row.reason and expected.split(" (")[0] in row.reason


def test_unavailable_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(common, "_find", lambda name: False)
    assert "CuTe DSL is not installed" in common.unavailable()
    monkeypatch.setattr(common, "_find", lambda name: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "CUDA GPU" in common.unavailable()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert "sm_80" in common.unavailable()


@pytest.mark.parametrize(
    "case_id, expect",
    [
        ("decode/b2-l45-h4x2-d64-p16-bf16", None),
        ("decode/b2-l45-h8x8-d128-p1-fp16", None),
        ("decode/b2-l45-h16x1-d128-p64-swa7-cap5-sink-bf16", None),
        ("decode/b2-l45-h4x2-d128-p16-fp32", "bf16/fp16"),
        ("decode/b2-l45-h4x2-d256-p16-bf16", "head dims (64, 128)"),
        ("decode/b2-l45-h4x2-d128x64-p16-bf16", "head_dim_v == head_dim"),
        ("decode/b2-l40-h16x1-d576x512-p16-mla-scale0.1352337788608801-bf16", "absorbed-MLA"),
        ("decode/b2-l45-h4x2-d128-p16-fp8_e4m3-bf16", "fp8 KV"),
        ("gdn_decode/b4-h4x4-d128x128-bf16", None),
        ("gdn_decode/b8-h16x32-d128x128-pad2-packed-fp16", None),
        ("gdn_decode/b4-h4x4-d64x64-bf16", "K = V = 128"),
        ("gdn_decode/b4-h4x4-d128x128-fp32", "bf16/fp16"),
        ("gdn_extend/b2-t130-h16x32-d128x128-bf16", "no gdn_extend kernel"),
    ],
)
def test_case_limits(case_id, expect):
    case = Case.from_id(case_id, "cuda")
    backend = get_backend("cute")
    reason = backend.limits(case) if case.op_name in backend.ops else backend.supports(case)
    if expect is None:
        assert reason is None
    else:
        assert reason and expect in reason, reason


def test_heads_per_cta():
    assert [decode_plan.heads_per_cta(g) for g in (1, 2, 4, 8, 16, 32, 6, 7)] == [1, 2, 4, 8, 8, 8, 6, 7]


def test_visible_range_window():
    assert decode_plan.visible_range(10, -1) == (0, 10)
    assert decode_plan.visible_range(10, 3) == (6, 10)  # W + 1 keys including the query's own
    assert decode_plan.visible_range(3, 100) == (0, 3)


def test_plan_splits_cover_every_visible_key_once():
    lens, window = [5000, 17, 300, 4096], 1000
    items = decode_plan.plan_splits(lens, window, units=8, num_sms=132)
    for b, L in enumerate(lens):
        mine = [(s, e, f) for bb, s, e, f in items if bb == b]
        s0, e0 = decode_plan.visible_range(L, window)
        assert mine[0][0] == s0 and mine[-1][1] == e0
        assert all(a[1] == c[0] for a, c in zip(mine, mine[1:]))  # contiguous, no overlap
        assert all(s < e for s, e, _ in mine)
        assert all(f == int(len(mine) == 1) for _, _, f in mine)


def test_plan_splits_small_batch_splits_long_requests():
    items = decode_plan.plan_splits([8192], -1, units=8, num_sms=132)
    assert len(items) > 1 and all(e - s >= decode_plan.DEFAULT.few_min_split for _, s, e, _ in items)
    big = decode_plan.plan_splits([4096] * 64, -1, units=8, num_sms=132)
    assert len(big) >= 64


@pytest.mark.parametrize(
    "batch, keys, splits",
    [(1, 1024, 4), (1, 4096, 16), (1, 8192, 16), (16, 1024, 2), (16, 4096, 8), (64, 4096, 4)],
)
def test_plan_splits_make_the_splits_measured_fastest(batch, keys, splits):
    """Llama-3 8B heads (8 CTAs a request unsplit) on 132 SMs: the split counts that ran fastest on an
    H200 (decode_plan.plan_splits' docstring): about one CTA an SM while the unsplit CTAs fill under
    half the SMs, else 4 CTAs an SM in splits of 512 keys or more."""
    items = decode_plan.plan_splits([keys] * batch, -1, units=8, num_sms=132)
    assert len(items) == batch * splits


def test_merge_list():
    items = [(0, 0, 5, 0), (0, 5, 9, 0), (1, 0, 3, 1), (2, 0, 4, 0), (2, 4, 8, 0), (2, 8, 9, 0)]
    assert decode_plan.merge_list(items) == [(0, 0, 2), (2, 3, 6)]
    assert decode_plan.merge_list([(0, 0, 5, 1)]) == []


def test_score_multipliers_match_the_canonical_scores():
    qk, scale, cap = torch.tensor([3.0, -7.5, 20.0]), 0.125, 5.0
    q_mul, _ = decode_plan.score_multipliers(scale, 0.0)
    assert torch.allclose(qk * q_mul, qk * scale / math.log(2.0))  # log2 units
    q_mul, post = decode_plan.score_multipliers(scale, cap)
    capped = cap * torch.tanh(qk * scale / cap)
    assert torch.allclose(post * torch.tanh(qk * q_mul), capped / math.log(2.0))


def test_gdn_gate_twin_matches_reference():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(64, 8, generator=gen) * 8  # spans the softplus threshold
    b = torch.randn(64, 8, generator=gen) * 2
    A_log = torch.log(torch.rand(8, generator=gen) * 15 + 1)
    dt = torch.rand(8, generator=gen) * 0.1
    decay, beta = gdn_decode.gates_twin(A_log, a, dt, b)
    g_ref, beta_ref = ref_gdn.gating(A_log, a.double(), dt, b.double())
    assert torch.allclose(decay.double(), torch.exp(g_ref), rtol=1e-5, atol=1e-6)
    assert torch.allclose(beta.double(), beta_ref, rtol=1e-6)


def test_gdn_grid():
    assert gdn_decode.grid(256, 32, 128) == (4, 256 * 32, 1)
    assert gdn_decode.grid(256, 32, 128, bv=128) == (1, 256 * 32, 1)
    assert [gdn_decode.threads(bv) for bv in (32, 64, 128)] == [128, 256, 512]


def test_rows_aligned_check_names_the_problem():
    t = torch.zeros(4, 3, 128, dtype=torch.bfloat16)
    common.check_rows_aligned(t, 16)
    with pytest.raises(ValueError, match="strides"):
        common.check_rows_aligned(torch.zeros(4, 3, 132, dtype=torch.bfloat16)[..., :128], 16)
    with pytest.raises(ValueError, match="data_ptr"):
        common.check_rows_aligned(torch.zeros(4 * 3 * 128 + 1, dtype=torch.bfloat16)[1:].view(4, 3, 128), 16)


def test_decode_lane_layout():
    # 128-bit loads (8 elements): D / (8 VPL) lanes per key row, the rest of the warp reads other keys
    assert decode_plan.VEC == 8
    assert decode_plan.schedule(4) == (2, 2, False, decode_plan.DEFAULT.async_stages)
    assert decode_plan.schedule(8)[:2] == (1, 2)  # registers: q and accumulators of 8 heads
