"""The fused merge of our Triton split decode (`DecodeConfig.fused_merge`, `MLAConfig.fused_merge`) under
TRITON_INTERPRET=1.

With the fused merge, the last split program of a (request, head block) to finish merges the group's
partials inside the split launch (decode.py, `merge_if_last`) and resets its arrival counter. These
tests force split plans (`min_chunk=32, num_sms=132`: few programs on many SMs) and check: the float64
verdict of the harness on every kernel branch (GQA, the MHA vector path, a 64 + 32 head split, window,
soft cap and sinks, fp8 caches, fp32 queries, MLA on both kernels); agreement with the two-launch path
(bit for bit where the two merges add the same terms in the same order); repeated calls bit for bit
with the counters back at zero (what a CUDA graph replay relies on); and `triton-det`'s batch
invariance with the merge fused. The interpreter runs programs one after another, so it checks the
merge's arithmetic and bookkeeping, not the atomics' memory ordering (that needs the GPU sweep).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from attnbench.backend import LOAD_PROBLEMS, get_backend, load_builtin, load_plugin
from attnbench.buffers import bits, clone_tensors
from attnbench.case import Case
from helpers import KERNEL, decode_request, kernel_verdict, run_one

pytestmark = [
    pytest.mark.interpreter,
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning"),
]

load_builtin()
PLUGIN = Path(__file__).resolve().parents[3] / "tools" / "bench" / "decode_variants.py"

CASES = [
    "decode/b4-l300-mixed-h8x2-d64-p16-bf16",  # GQA, uneven split counts (5, 1, 1, 4)
    "decode/b3-l200-skewed-h4x4-d80-p1-bf16",  # MHA vector path, token slots, one head per program
    "decode/b3-l260-mixed-h8x1-d96-p64-fp16",  # MQA, 64 + 32 head split
    "decode/b3-l150-mixed-h8x2-d64-p16-swa100-cap5-sink-bf16",  # window, soft cap, sinks added by the merge
    "decode/b2-l160-mixed-h16x1-d576x512-p16-mla-bf16",  # MLA sizes on the generic kernel: 512-wide partials
    "decode/b4-l300-mixed-h8x2-d64-p16-fp8_e4m3-kvscalehead-bf16",  # fp8 cache, per-head scales
    "decode/b2-l100-mixed-h4x2-d64-p16-fp8_e4m3-kvscalehead-fp32",  # fp32 queries: ieee dots, precise exp2
]


def _plans(x, fused: bool, **kw):
    from attnbench.kernels.triton.decode import default_decode_config, plan_decode

    cfg = dataclasses.replace(default_decode_config(x), fused_merge=fused)
    return plan_decode(x, config=cfg, **kw)


def _run(x, plan):
    from attnbench.kernels.triton.decode import bind_decode

    return bind_decode(x, plan)()


@pytest.mark.parametrize("case_id", CASES)
def test_fused_merge_matches_float64(case_id):
    from attnbench.kernels.triton.decode import _launches

    case = Case.from_id(case_id)
    pristine = case.make_inputs()
    work = clone_tensors(pristine)
    plan = _plans(work, True, min_chunk=32, num_sms=132)
    assert max(plan.splits) >= 2 and plan.fused, plan.splits
    assert len(_launches(work, plan)) == 1  # no merge launch
    verdict = kernel_verdict(case, pristine, work, _run(work, plan))
    assert verdict.ok, verdict.reason
    assert not plan.counters.any(), "the last program of each group resets its counter"


def _agree(fused: dict, unfused: dict, splits: list[int]):
    """Split requests merged from at most three partials: bit for bit (both merges add w0 p0 + w1 p1 + w2 p2
    left to right: the two-launch kernel's 16-split `tl.sum` pads with zeros, and the interpreter's pairwise
    sum over 16 lanes keeps that order for three terms); more: within a few fp32 ulps of each other."""
    for b, n in enumerate(splits):
        fo, uo, fl, ul = fused["o"][b], unfused["o"][b], fused["lse"][b], unfused["lse"][b]
        if n <= 3:
            assert torch.equal(bits(fo), bits(uo)), f"request {b} ({n} splits): o"
            assert torch.equal(bits(fl), bits(ul)), f"request {b} ({n} splits): lse"
        else:
            torch.testing.assert_close(fl, ul, rtol=4 * 2**-23, atol=0, msg=f"request {b}: lse")
            torch.testing.assert_close(fo.float(), uo.float(), rtol=2 * torch.finfo(fo.dtype).eps, atol=1e-6)


@pytest.mark.parametrize("case_id", CASES)
def test_fused_merge_agrees_with_the_two_launch_path(case_id):
    x = Case.from_id(case_id).make_inputs()
    a, b = clone_tensors(x), clone_tensors(x)
    unfused = _run(a, _plans(a, False, min_chunk=32, num_sms=132))
    plan = _plans(b, True, min_chunk=32, num_sms=132)
    _agree(_run(b, plan), unfused, plan.splits)


def test_fused_merge_repeats_bit_for_bit_and_leaves_counters_at_zero():
    """Each call starts from counters at zero (the merging program resets them): a second and third call of
    the same bound closure, as in a timing loop or a CUDA graph replay, give the same bits."""
    x = Case.from_id("decode/b3-l150-mixed-h8x2-d64-p16-swa100-cap5-sink-bf16").make_inputs()
    plan = _plans(x, True, min_chunk=32, num_sms=132)
    from attnbench.kernels.triton.decode import bind_decode

    run = bind_decode(x, plan)
    first = {k: v.clone() for k, v in run().items()}
    for _ in range(2):
        x.o.fill_(float("nan"))
        x.lse.fill_(float("nan"))
        out = run()
        assert not plan.counters.any()
        assert torch.equal(bits(out["o"]), bits(first["o"])) and torch.equal(bits(out["lse"]), bits(first["lse"]))


def test_counters_left_set_break_the_merge():
    """What the reset prevents: a counter left at 1 makes the second-to-last program merge too early (the
    last partial not yet written: NaN here) and the last one never merge."""
    x = Case.from_id("decode/b3-l150-mixed-h8x2-d64-p16-swa100-cap5-sink-bf16").make_inputs()
    plan = _plans(x, True, min_chunk=32, num_sms=132)
    good = {k: v.clone() for k, v in _run(x, plan).items()}
    split = [b for b, n in enumerate(plan.splits) if n > 1]
    plan.part_o.fill_(float("nan"))
    plan.counters.fill_(1)
    out = _run(x, plan)
    assert not torch.equal(bits(out["o"][split]), bits(good["o"][split]))


def test_fused_merge_tables():
    from attnbench.kernels.triton.decode import fused_merge_tables

    rows, counters = fused_merge_tables([3, 1, 2, 1], 4, torch.device("cpu"))
    assert rows.tolist() == [0, 0, 0, -1, 1, 1, -1]
    assert counters.shape == (2, 4) and counters.dtype == torch.int32 and not counters.any()


@pytest.mark.parametrize(
    "case_id",
    ["decode/b4-l300-mixed-h8x2-d64-p16-bf16", "decode/b4-l300-mixed-h8x2-d64-p16-fp8_e4m3-kvscalehead-bf16"],
)
def test_deterministic_fused_merge_is_batch_invariant(case_id):
    """triton-det's promise (a request alone equals itself in a batch, bit for bit) with the merge fused:
    the merging program reads the request's own partials in split order whatever else the batch holds."""
    x = Case.from_id(case_id).make_inputs()
    plan = _plans(x, True, deterministic=True, split_tile=64)
    assert plan.fused and max(plan.splits) >= 4
    batch = _run(x, plan)
    for b in range(len(x.seq_lens_host)):
        alone = decode_request(x, b)
        out = _run(alone, _plans(alone, True, deterministic=True, split_tile=64))
        assert torch.equal(bits(out["o"]), bits(batch["o"][b : b + 1])), f"request {b}: o"
        assert torch.equal(bits(out["lse"]), bits(batch["lse"][b : b + 1])), f"request {b}: lse"


# ---- the MLA kernel (decode_mla.py) and the backend's knob ----------------------------------------


def test_mla_kernel_fused_merge_agrees_with_two_launches():
    from attnbench.kernels.triton import decode_mla as m

    x = Case.from_id("decode/b3-l200-mixed-h128x1-d576x512-p64-mla-bf16").make_inputs()
    a, b = clone_tensors(x), clone_tensors(x)
    cfg = m.mla_config(x.q.shape[1], x.k_cache.shape[1], 90)
    unfused = m.bind_mla_decode(a, m.plan_mla_decode(a, config=cfg, deterministic=True, split_tile=64))()
    plan = m.plan_mla_decode(
        b, config=dataclasses.replace(cfg, fused_merge=True), deterministic=True, split_tile=64
    )  # fmt: skip
    assert plan.fused and plan.splits == [1, 1, 4] and len(m._launches(b, plan)) == 1
    _agree(m.bind_mla_decode(b, plan)(), unfused, plan.splits)
    assert not plan.counters.any()


@pytest.mark.parametrize(
    "case_id, backend",
    [
        ("decode/b3-l200-mixed-h128x1-d576x512-p64-mla-bf16", "triton:fused_merge=1,split_keys=64"),  # MLA kernel
        # MLA kernel: a window start inside a block, sink and cap, two splits
        ("decode/b2-l150-h16x1-d576x512-p16-mla-swa100-sink-cap5-fp16", "triton:fused_merge=1,split_keys=64"),
        ("decode/b3-l600-mixed-h4x2-d32-p16-fp8_e5m2-kvscalehead-bf16", "triton-det:fused_merge=1"),
        ("decode/b3-l600-mixed-h8x1-d64-p16-swa400-cap5-sink-bf16", "triton-det:fused_merge=1"),  # MQA, window
        ("decode/b2-l600-mixed-h4x4-d32-p1-bf16", "triton-det:fused_merge=1"),  # MHA vector path, 3 splits
    ],
)
def test_fused_merge_through_the_harness(case_id, backend):
    """The knob through `run_one`: float64 verdict, NaN-poisoned cache and outputs, the determinism repeats
    (the counters must be back at zero after every call) and the stale-output check."""
    row = run_one(case_id, get_backend(backend), **KERNEL)
    assert row.status == "pass", row.reason
    assert row.prepare_info["config"]["fused_merge"] is True
    assert row.prepare_info["max_splits"] >= 2 and row.prepare_info["config"]["two_stage"] is False


def test_fused_and_unfused_plugin_variants():
    load_plugin(str(PLUGIN))
    assert not [p for p in LOAD_PROBLEMS if "decode_variants" in p]
    for name, fused in (("triton-fused", True), ("triton-unfused", False)):
        row = run_one("decode/b4-l300-mixed-h8x2-d64-p16-bf16", get_backend(name), repeats=1)
        assert row.status == "pass", row.reason
        assert row.prepare_info["config"]["fused_merge"] is fused


@pytest.mark.parametrize(
    "case_id, backend, tile",
    [
        ("decode/b3-l200-mixed-h8x2-d64-p16-bf16", "triton:decode_warps=8,decode_stages=2", (8, 2)),
        ("decode/b3-l200-mixed-h8x2-d64-p16-bf16", "triton-det:decode_warps=2,block_n=32", (2, None)),
        # an MLA case under a tiling knob runs the generic kernel, which the knob sizes (as block_n does)
        ("decode/b3-l200-mixed-h128x1-d576x512-p64-mla-bf16", "triton:decode_stages=1", (None, 1)),
        # PDL is planned for compiled kernels on sm_90+ only: here the knob reaches the config, nothing else
        ("decode/b3-l200-mixed-h8x2-d64-p16-bf16", "triton:decode_pdl=1,split_keys=64", (None, None)),
    ],
)
def test_decode_tiling_knobs_reach_the_config_and_pass(case_id, backend, tile):
    """`decode_warps` / `decode_stages` (issue #34: the unsplit B16 L1024 decode runs one 4-warp program
    per SM at 60% of DRAM bandwidth, h100-session22) fix the stage-1 tiling, turn the tuner off, and the
    rows pass the sweep's checks."""
    row = run_one(case_id, get_backend(backend), **KERNEL)
    assert row.status == "pass", row.reason
    cfg = row.prepare_info["config"]
    warps, stages = tile
    assert warps is None or cfg["num_warps"] == warps
    assert stages is None or cfg["num_stages"] == stages
    assert "autotune_us" not in row.prepare_info
    if "block_n=32" in backend:
        assert cfg["block_n"] == 32
    if "decode_pdl=1" in backend:
        assert cfg["pdl"] is True and row.prepare_info["max_splits"] > 1


def test_pdl_marks_the_merge_launch_only_where_there_is_one():
    from attnbench.kernels.triton import decode as d

    x = Case.from_id("decode/b3-l200-mixed-h8x2-d64-p16-bf16").make_inputs()
    cfg = dataclasses.replace(d.default_decode_config(x), pdl=True)
    assert not d.pdl_supported(x.q.device)  # the interpreter, a CPU: planned without PDL
    plan = d.plan_decode(x, config=cfg, deterministic=True, split_tile=64)
    assert plan.merge is not None and "PDL" not in plan.meta and "launch_pdl" not in plan.merge_meta
    plan = d.with_pdl(plan)
    assert plan.meta["PDL"] == 1 and plan.merge_meta["PDL"] == 1 and plan.merge_meta["launch_pdl"] is True
    whole = d.plan_decode(x, config=cfg, deterministic=True, split_tile=1024)
    assert whole.merge is None and d.with_pdl(whole).meta == whole.meta  # nothing to merge: one launch


def test_an_overlapped_merge_lets_the_split_rule_cut_shorter(monkeypatch):
    """B16 L1024 on 132 SMs: two splits of 512 keys where the merge is PDL-launched (it overlaps the
    splits), none where it waits for them (SplitPolicy.fill_keys against fill_keys_overlapped)."""
    from attnbench.kernels.triton import decode as d

    x = Case.from_id("decode/b16-l1024-h32x8-d128-p16-bf16").make_inputs()
    monkeypatch.setattr(d, "pdl_supported", lambda device: True)
    cfg = d.default_decode_config(x)
    assert cfg.pdl  # the default
    overlapped = d.plan_decode(x, config=cfg, num_sms=132)
    assert max(overlapped.splits) == 2 and overlapped.merge_meta.get("launch_pdl") is True
    for waiting in (dataclasses.replace(cfg, pdl=False), dataclasses.replace(cfg, fused_merge=True)):
        assert max(d.plan_decode(x, config=waiting, num_sms=132).splits) == 1
    assert max(d.plan_decode(x, config=cfg, num_sms=132, policy=d.SplitPolicy(fill_keys_overlapped=1024)).splits) == 1
