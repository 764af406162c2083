"""Extend's opt-in launch variants under TRITON_INTERPRET=1: TMA loads (`ExtendConfig.use_tma`), the
persistent grid (`.persistent`) and the tiling knobs (`extend_block_n`, `extend_stages`).

Each variant runs the kernel on causal prefill, ragged batches whose key boxes cross request boundaries
(and the tensor's end), a paged prefix plus new tokens, a window, soft cap and sinks, shared KV, an fp8
cache and fp32 queries, judged by the harness against float64 (small tiles: 16-key boxes, so most
requests end inside a box). A box that crosses into the next request reads that request's rows; the
kernel masks their scores and zeroes their values in registers: `test_box_past_a_request_*` fill the
neighbour's rows with NaN, so a missing mask shows as NaN or as keys seen across requests. The knobs go
through the harness too (NaN-poisoned caches, determinism, stale-output check) with clear errors for bad
values, and a case where no source can take TMA is a skip with the reason.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from attnbench.backend import get_backend, load_builtin
from attnbench.buffers import clone_tensors
from attnbench.case import Case
from attnbench.errors import AttnbenchError
from helpers import KERNEL, kernel_verdict, run_one

pytestmark = [
    pytest.mark.interpreter,
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning"),
]

load_builtin()

CASES = [
    "extend/b3-q40-pre0-mixed-h4x2-d64-p16-bf16",  # causal prefill, ragged, no prefix (the targets row's shape)
    "extend/b3-q40-pre0-mixed-h4x2-d64-p16-bidirectional-bf16",  # ragged, every key of a request visible
    "extend/b2-q40-pre70-mixed-h4x2-d64-p16-bf16",  # paged prefix + new tokens (saved)
    "extend/b2-q40-pre70-h4x2-d64-p16-swa20-bf16",  # window edge inside the prefix: unaligned cache blocks
    "extend/b3-q40-pre30-mixed-h4x2-d64-p16-swa25-cap5-sink-bf16",  # window, soft cap, sinks
    "extend/b2-q40-pre30-h4x2-d64-p16-kvshared-swa25-cap5-bf16",  # new tokens from the cache: cache TMA only
    "extend/b2-q40-pre70-mixed-h4x2-d64-p16-fp8_e4m3-kvscalehead-bf16",  # fp8 cache by TMA, new tokens requantised
    "extend/b2-q20-pre12-mixed-h4x4-d32-p16-fp32",  # fp32 queries, MHA
]

# name -> (ExtendConfig fields over 16 x 16 tiles, plan_extend keywords); persistent on 3 "SMs": each program
# walks several items
VARIANTS = {
    "tma": (dict(use_tma=True), {}),
    "persistent": (dict(persistent=True), dict(num_sms=3)),
    "tma+persistent": (dict(use_tma=True, persistent=True), dict(num_sms=3)),
    "block_n32-stages2": (dict(block_n=32, num_stages=2), {}),
    "tma-block_n32": (dict(use_tma=True, block_n=32), {}),  # page 16: cache blocks by pointers, new by TMA
}


def _run(case_id: str, fields: dict, **kw):
    from attnbench.kernels.triton.extend import extend
    from attnbench.kernels.triton.extend_plan import ExtendConfig, plan_extend

    case = Case.from_id(case_id)
    pristine = case.make_inputs()
    work = clone_tensors(pristine)
    plan = plan_extend(work, config=dataclasses.replace(ExtendConfig(16, 16, 4, 1), **fields), **kw)
    return case, pristine, work, plan, extend(work, plan)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case_id", CASES)
def test_variant_matches_float64(case_id, variant):
    from attnbench.kernels.triton.extend_plan import TMAUnavailable

    fields, kw = VARIANTS[variant]
    case = Case.from_id(case_id)
    new_tma = "kvshared" not in case_id  # k_new given
    cache_tma = case.params.page_size % fields.get("block_n", 16) == 0
    if fields.get("use_tma") and not (new_tma or cache_tma):
        with pytest.raises(TMAUnavailable, match="page size 16 is not a multiple of block_n 32"):
            _run(case_id, fields, **kw)
        return
    case, pristine, work, plan, out = _run(case_id, fields, **kw)
    verdict = kernel_verdict(case, pristine, work, out)
    assert verdict.ok, verdict.reason
    meta = plan.meta
    if fields.get("use_tma"):  # what each source took
        assert (pristine.k_new is not None) == new_tma
        assert (meta.get("TMA_NEW", 0), meta.get("TMA_CACHE", 0)) == (int(new_tma), int(cache_tma))
    else:
        assert "TMA_NEW" not in meta and not plan.extra.get("k_new_desc")
    if fields.get("persistent"):
        assert meta["PERSISTENT"] == 1 and plan.grid == (3,) and plan.extra["n_items"] > 3
    else:
        assert "PERSISTENT" not in meta


def _poison_neighbours(x, b: int):
    """NaN into every new-token K/V row of the requests after `b` (what a box crossing b's end reads)."""
    start = int(x.qo_indptr[b + 1])
    x.k_new[start:] = float("nan")
    x.v_new[start:] = float("nan")


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the poisoned requests' own rows
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("variant", ["tma", "tma+persistent"])
def test_box_past_a_request_never_reaches_its_rows(variant, bidirectional):
    """Request 0 of a ragged prefill (its 19 tokens end inside a 16-key box) gives the same bits when the
    rows after it hold NaN: the box's rows past the request are masked out of the scores and zeroed
    before P.V (0 x NaN would be NaN); causal or not (without causality only the range mask hides them)."""
    from attnbench.kernels.triton.extend import extend
    from attnbench.kernels.triton.extend_plan import ExtendConfig, plan_extend

    case = Case.from_id("extend/b3-q40-pre0-mixed-h4x2-d64-p16" + ("-bidirectional" if bidirectional else "") + "-bf16")
    pristine = case.make_inputs()
    fields, kw = VARIANTS[variant]
    cfg = dataclasses.replace(ExtendConfig(16, 16, 4, 1), **fields)
    clean = clone_tensors(pristine)
    out = extend(clean, plan_extend(clean, config=cfg, **kw))
    verdict = kernel_verdict(case, pristine, clean, out)
    assert verdict.ok, verdict.reason
    lens = pristine.q_lens_host
    assert lens[0] % 16, lens  # the request ends inside a box
    n0 = int(pristine.qo_indptr[1])
    poisoned = clone_tensors(pristine)
    _poison_neighbours(poisoned, 0)
    out_p = extend(poisoned, plan_extend(poisoned, config=cfg, **kw))
    assert torch.equal(out_p["o"][:n0], out["o"][:n0]), "the next request's rows reached request 0"
    assert torch.equal(out_p["lse"][:n0], out["lse"][:n0])


def test_box_past_the_tensor_end_reads_zeros_not_keys():
    """The last request of a non-causal batch ends inside a box that runs past the new-token tensor:
    TMA fills those rows with zeros, whose scores (0, not -inf) must be masked out like any key past
    the request."""
    case, pristine, work, plan, out = _run(
        "extend/b3-q40-pre0-mixed-h4x2-d64-p16-bidirectional-bf16", dict(use_tma=True)
    )
    assert pristine.q_lens_host[-1] % 16 and plan.meta["TMA_NEW"] == 1
    verdict = kernel_verdict(case, pristine, work, out)
    assert verdict.ok, verdict.reason


def test_candidates_carry_the_variant_only_when_asked():
    from attnbench.kernels.triton.extend_plan import extend_candidates

    plain = extend_candidates(128, 128, 8192, 90)
    assert plain and not any(c.use_tma or c.persistent for c in plain)
    tma = extend_candidates(128, 128, 8192, 90, use_tma=True, persistent=True)
    assert [dataclasses.replace(c, use_tma=False, persistent=False) for c in tma] == plain
    assert all(c.use_tma and c.persistent for c in tma)


def test_knobs_apply_over_the_config_and_reject_bad_values():
    from attnbench.kernels.triton.extend_plan import ExtendConfig, check_extend_knobs, with_extend_knobs

    c = with_extend_knobs(ExtendConfig(128, 64, 8, 3), dict(extend_block_n=128, extend_stages=2, extend_tma=1))
    assert c == ExtendConfig(128, 128, 8, 2, use_tma=True)
    with pytest.raises(ValueError, match="extend_block_n=48 is not allowed; choose one of 16, 32, 64, 128"):
        check_extend_knobs({"extend_block_n": 48})
    with pytest.raises(ValueError, match="unknown extend knob 'extend_tmaa'"):
        check_extend_knobs({"extend_tmaa": 1})


@pytest.mark.parametrize(
    "spec, words",
    [
        ("triton:extend_tma=2", ["extend_tma='2' is not allowed", "0, 1"]),
        ("triton:extend_block_n=256", ["extend_block_n='256' is not allowed", "16, 32, 64, 128"]),
        ("triton:extend_persistent=yes", ["extend_persistent='yes' is not allowed"]),
    ],
)
def test_bad_knob_values_are_clear_errors(spec, words):
    with pytest.raises(AttnbenchError) as e:
        get_backend(spec)
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize(
    "backend",
    ["triton:extend_tma=1", "triton:extend_persistent=1", "triton:extend_block_n=32,extend_stages=2",
     "triton-det:extend_tma=1,extend_persistent=1", "triton:extend_tma=1,extend_block_n=16"],
)  # fmt: skip
def test_knobs_through_the_harness(backend):
    """The knobs reach the plan (prepare_info) and pass the sweep's checks: float64, NaN-poisoned cache slots
    and outputs, determinism, the stale-output check. With 16-key blocks over 16-slot pages the cache is read
    by TMA too: its last block of each prefix holds poisoned slots past the sequence, and a window start
    inside a block puts keys before the range in the first box."""
    row = run_one("extend/b3-q40-pre30-mixed-h4x2-d64-p16-swa25-cap5-sink-bf16", get_backend(backend), **KERNEL)
    assert row.status == "pass", row.reason
    cfg, info = row.prepare_info["config"], row.prepare_info
    assert cfg["use_tma"] == ("extend_tma=1" in backend)
    assert cfg["persistent"] == ("extend_persistent=1" in backend)
    if cfg["use_tma"]:  # pages of 16 keys: cache blocks by TMA only where block_n divides them
        cache = ["k_cache_desc", "v_cache_desc"] if 16 % cfg["block_n"] == 0 else []
        assert info["tma"] == sorted(["k_new_desc", "v_new_desc", *cache])
    if cfg["persistent"]:
        assert info["grid"] <= 132
    if "extend_block_n=32" in backend:
        assert (cfg["block_n"], cfg["num_stages"]) == (32, 2)


def test_tma_where_no_source_can_take_it_is_a_skip():
    """Head dim 13 (a 16-column box would read the next head) and one-token pages: nothing by TMA."""
    row = run_one("extend/b2-q6-pre17-h4x2-d13-p1-bf16", get_backend("triton:extend_tma=1"), repeats=1)
    assert row.status == "skip", (row.status, row.reason)
    assert "no key source can be read by tensor descriptor" in row.reason and "head dim 13" in row.reason


@pytest.mark.parametrize("window", ["", "-swa20"])
def test_cache_box_slots_past_the_prefix_never_reach_the_rows(window):
    """Cache blocks by TMA (16-key blocks, 16-slot pages): the last block of each prefix holds the slots
    after it, NaN here; with a window the first box also holds keys before the window. Same bits as with
    those slots clean, and the clean run passes float64."""
    from attnbench.kernels.triton.extend import extend
    from attnbench.kernels.triton.extend_plan import ExtendConfig, plan_extend

    case = Case.from_id(f"extend/b2-q20-pre37-mixed-h4x2-d64-p16-kvattend{window}-bf16")
    pristine = case.make_inputs()
    cfg = ExtendConfig(16, 16, 4, 1, use_tma=True)
    clean = clone_tensors(pristine)
    plan = plan_extend(clean, config=cfg)
    assert plan.meta["TMA_CACHE"] == 1 and plan.meta["SAVE_KV"] is False
    out = extend(clean, plan)
    verdict = kernel_verdict(case, pristine, clean, out)
    assert verdict.ok, verdict.reason
    poisoned = clone_tensors(pristine)
    page = pristine.k_cache.shape[1]
    hit = 0
    for b, (L, n) in enumerate(zip(pristine.seq_lens_host, pristine.q_lens_host, strict=True)):
        pages = pristine.kv_page_indices[int(pristine.kv_indptr[b]) : int(pristine.kv_indptr[b + 1])].tolist()
        for pos in range(L - n, len(pages) * page):  # every slot of the request's pages after its prefix
            poisoned.k_cache[pages[pos // page], pos % page] = float("nan")
            poisoned.v_cache[pages[pos // page], pos % page] = float("nan")
            hit += (pos // 16) == ((L - n - 1) // 16)  # in the prefix's last block
    assert hit, "no poisoned slot shares a block with the prefix's last key"
    out_p = extend(poisoned, plan_extend(poisoned, config=cfg))
    assert torch.equal(out_p["o"], out["o"]) and torch.equal(out_p["lse"], out["lse"])
