"""The FA4 adapter on a CPU: conversions, skip reasons, and the call it makes (through a fake FA4)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.errors import Unsupported
from attnbench.kernels.cute import fa4
from attnbench.plan.suite import load
from helpers import run_one


def test_page_table_from_csr_hand_example():
    indptr = torch.tensor([0, 3, 3, 5], dtype=torch.int32)  # request 1 has no pages
    pages = torch.tensor([7, 2, 9, 4, 0], dtype=torch.int32)
    table = fa4.page_table_from_csr(indptr, pages)
    assert table.dtype == torch.int32 and table.is_contiguous()
    assert table.tolist() == [[7, 2, 9], [0, 0, 0], [4, 0, 0]]


def test_window_size_conversion():
    assert fa4.window_size(-1, True) == (None, None)
    assert fa4.window_size(127, True) == (127, 0)  # keys [p-127, p]
    assert fa4.window_size(5, False) == (5, None)  # bidirectional: no right bound


def test_lse_layout_conversion():
    lse_ht = torch.arange(6, dtype=torch.float32).view(2, 3)  # [Hq 2, T 3]
    out = torch.empty(3, 2)
    fa4.lse_heads_tokens_to_canonical(lse_ht, out)
    assert out.tolist() == [[0, 3], [1, 4], [2, 5]]


def test_tma_partial_page_rule():
    assert fa4.reads_partial_pages_by_tma([256, 130], 128, 128)
    assert not fa4.reads_partial_pages_by_tma([256, 128], 128, 128)  # whole pages only
    assert not fa4.reads_partial_pages_by_tma([45, 30], 16, 128)  # cp.async pages: predicated rows


@pytest.mark.parametrize(
    "case_id, expect",
    [
        ("decode/b2-l45-h4x2-d64-p16-bf16", None),
        ("decode/b2-l45-h4x2-d128-p16-fp32", "fp16/bf16"),
        ("decode/b2-l45-h4x2-d13-p16-bf16", "divisible by 8"),
        ("decode/b2-l45-h4x2-d72-p16-bf16", "multiples of 16"),
        ("decode/b2-l45-h4x2-d80-p16-bf16", None),
        ("decode/b2-l40-h16x1-d576x512-p16-mla-scale0.1352337788608801-bf16", "Blackwell"),
        ("extend/b2-q6-pre17-h4x2-d192x128-p16-bf16", None),
        ("extend/b2-q7-pre19-h4x2-d64-p16-custom-bf16", "custom masks"),
        ("extend/b2-q7-pre19-h4x2-d64-p16-kvattend-bf16", "one source"),
        ("extend/b2-q7-pre0-h4x2-d72-p16-kvattend-bf16", None),  # ragged: no paged loader
        ("extend/b2-q8-pre30-h8x2-d64-p1-swa5-cap5-sink-bf16", None),
    ],
)
def test_case_reasons(case_id, expect):
    reason = fa4.case_reason(Case.from_id(case_id))
    assert (reason is None) if expect is None else (reason and expect in reason), reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-machine skips")
def test_every_smoke_row_is_a_skip_on_cpu():
    b = get_backend("fa4")
    for case in load("smoke").cases:
        if case.op_name in b.ops:
            assert b.supports(case)
    row = run_one("decode/b2-l45-h4x2-d64-p16-bf16", b)
    assert row.status == "skip" and row.reason


# ---- the call, through a fake flash_attn.cute.interface ----------------------------------------------
@pytest.fixture
def fake_fa4(monkeypatch):
    calls = []

    def _flash_attn_fwd(q, k, v, **kw):
        calls.append((q, k, v, kw))
        kw["out"].fill_(1.0)
        kw["lse"].copy_(torch.arange(kw["lse"].numel(), dtype=torch.float32).view(kw["lse"].shape))
        return kw["out"], kw["lse"]

    interface = types.ModuleType("flash_attn.cute.interface")
    interface._flash_attn_fwd = _flash_attn_fwd
    interface._tile_size_fwd_sm90 = lambda d, dv, causal, local: types.SimpleNamespace(n_block_size=128)
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", types.ModuleType("flash_attn.cute"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", interface)
    monkeypatch.setattr(fa4, "_arch_major", lambda: 9)
    return calls


def test_decode_call(fake_fa4):
    case = Case.from_id("decode/b3-l70-skewed-h8x2-d64-p16-swa7-cap5-sink-bf16")
    x = case.make_inputs()
    fn = get_backend("fa4").prepare(case, x)
    assert len(fake_fa4) == 2  # compile call + timing call in prepare
    fake_fa4.clear()
    out = fn()
    [(q, k, v, kw)] = fake_fa4
    assert q.shape == (3, 1, 8, 64) and q.data_ptr() == x.q.data_ptr()
    assert k is x.k_cache and v is x.v_cache
    assert kw["seqused_k"] is x.seq_lens and kw["max_seqlen_k"] == 70
    assert torch.equal(kw["page_table"], fa4.page_table_from_csr(x.kv_indptr, x.kv_page_indices))
    assert (kw["window_size_left"], kw["window_size_right"], kw["softcap"]) == (7, 0, 5.0)
    assert kw["learnable_sink"] is x.sinks and kw["softmax_scale"] == x.sm_scale and kw["num_splits"] == 1
    assert kw["out"].data_ptr() == x.o.data_ptr() and kw["lse"].shape == (3, 8, 1)
    assert torch.equal(out["lse"], torch.arange(24, dtype=torch.float32).view(3, 8))  # [B, Hq, 1] is [B, Hq]


def test_extend_save_call(fake_fa4):
    case = Case.from_id("extend/b3-q9-pre21-mixed-h8x2-d64-p16-bf16")
    x = case.make_inputs()
    fn = get_backend("fa4").prepare(case, x)
    fake_fa4.clear()
    fn()
    [(q, k, v, kw)] = fake_fa4
    assert q is x.q and kw["cu_seqlens_q"] is x.qo_indptr and kw["max_seqlen_q"] == max(x.q_lens_host)
    assert k is x.k_cache and kw["seqused_k"] is x.seq_lens
    assert torch.equal(x.k_cache.view(-1, 2, 64)[x.slot_mapping], x.k_new)  # saved before attending
    T = x.q.shape[0]
    assert kw["lse"].shape == (8, T)
    assert torch.equal(x.lse, torch.arange(8 * T, dtype=torch.float32).view(8, T).t())


def test_prefix_free_attend_is_ragged(fake_fa4):
    case = Case.from_id("extend/b2-q7-pre0-h4x2-d72-p16-kvattend-bf16")
    x = case.make_inputs()
    get_backend("fa4").prepare(case, x)
    q, k, v, kw = fake_fa4[-1]
    assert k is x.k_new and v is x.v_new and kw["cu_seqlens_k"] is x.qo_indptr and "page_table" not in kw


def test_tma_page_with_partial_last_page_is_a_skip(fake_fa4):
    case = Case.from_id("decode/b2-l200-h4x2-d128-p128-bf16")
    with pytest.raises(Unsupported, match="TMA"):
        get_backend("fa4").prepare(case, case.make_inputs())
    case = Case.from_id("decode/b2-l256-h4x2-d128-p128-bf16")  # whole pages: runs
    get_backend("fa4").prepare(case, case.make_inputs())


def test_fa4_compile_cache_goes_to_the_attnbench_cache_unless_the_user_chose(monkeypatch, tmp_path):
    """FA4's on-disk compile cache (off by default in FA4) is turned on in the attnbench cache root;
    a user's own setting of either variable wins."""
    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv("ATTNBENCH_COMPILE_CACHE", raising=False)  # tests run with it off (conftest)
    monkeypatch.delenv(fa4.CACHE_ENV, raising=False)
    monkeypatch.delenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", raising=False)
    fa4.use_compile_cache()
    import os

    assert os.environ[fa4.CACHE_ENV] == "1"
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] == str(tmp_path / "compile" / "fa4")
    monkeypatch.setenv(fa4.CACHE_ENV, "0")
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "/elsewhere")
    fa4.use_compile_cache()
    assert os.environ[fa4.CACHE_ENV] == "0" and os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] == "/elsewhere"


def test_the_cache_root_is_shared_by_every_cache(monkeypatch, tmp_path):
    from attnbench.run import peaks
    from attnbench.store import refcache

    monkeypatch.delenv("ATTNBENCH_CACHE", raising=False)
    monkeypatch.delenv("ATTNBENCH_REF_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert refcache.default_dir() == tmp_path / "attnbench" / "refs"
    assert peaks.cache_path() == tmp_path / "attnbench" / "peaks.json"  # XDG honoured here too now
