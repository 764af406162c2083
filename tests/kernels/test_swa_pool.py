"""`kv_pool: swa`: a hybrid model's sliding-window layer keeps its K/V in its own pool, in which the
pages before each request's window were freed and now belong to other requests (they hold their data)."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.cli.app import app
from attnbench.kernels.mutants import MUTANTS
from attnbench.ops.paged import window_start_page
from attnbench.references import attention as ref
from helpers import KERNEL, run_one

# gpt-oss in miniature: window, sinks, pages of 16 (and of 1, SGLang's token slots), decode and extend
# over a prefix with the new tokens saved, attended from k_new, or read from the cache
CASES = [
    "decode/b3-l70-mixed-h8x2-d64-p16-swa7-poolswa-sink-bf16",
    "decode/b3-l70-mixed-h8x2-d64-p1-swa7-poolswa-sink-bf16",
    "extend/b2-q8-pre30-h8x2-d64-p4-swa5-poolswa-sink-bf16",
    "extend/b3-q7-pre40-mixed-h4x4-d32-p16-swa6-poolswa-kvattend-fp16",
    "extend/b2-q7-pre21-h4x4-d32-p1-custom-swa6-poolswa-kvshared-fp16",
]
MUTANT = {m.name: m for m in MUTANTS}


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case_id", CASES)
def test_torch_and_triton_pass_on_the_swa_pool(case_id, backend):
    row = run_one(case_id, get_backend(backend), **KERNEL)
    assert row.status == "pass", row.reason


@pytest.mark.parametrize("case_id", CASES)
def test_freed_pages_hold_other_requests_data_and_the_mapping_translates(case_id):
    case = Case.from_id(case_id)
    x = case.make_inputs()
    assert torch.equal(x.kv_page_indices, x.full_to_swa[x.full_page_indices.long()])
    assert sorted(x.full_to_swa.tolist()) == list(range(x.k_cache.shape[0]))  # a bijection: no id out of range
    ps, indptr, freed = x.page_size, x.kv_indptr.tolist(), 0
    for b, (L, n) in enumerate(zip(x.seq_lens_host, x.q_lens_host)):
        pages = x.kv_page_indices[indptr[b] : indptr[b + 1]].long()
        first = window_start_page(L - n, case.params.window, ps) // ps
        # another request's keys and values: finite, so a tile loaded across the window start and masked
        # stays harmless (as in a server); a key given weight is wrong
        freed_k, freed_v = x.k_cache[pages[:first]].float(), x.v_cache[pages[:first]].float()
        assert torch.isfinite(freed_k).all() and torch.isfinite(freed_v).all()
        assert first == 0 or freed_k.abs().amax() > 0
        cached = L if getattr(case.params, "new_kv", "shared") == "shared" else L - n
        assert not torch.isnan(x.k_cache[pages[first:]].flatten(0, 1)[: cached - first * ps]).any()
        freed += first
    assert freed > 0, "the case must free pages, or it tests nothing"


@pytest.mark.parametrize("case_id", [CASES[1], CASES[4]])
def test_a_kernel_that_reads_one_key_before_its_window_fails(case_id):
    """off-by-one-window sees W + 2 keys: with token-slot pages (size 1) the extra key sits in a freed page."""
    row = run_one(case_id, MUTANT["off-by-one-window"].backend())
    assert row.status == "fail", row.reason


@pytest.mark.parametrize("case_id", CASES)
def test_a_kernel_that_skips_the_full_to_swa_translation_fails(case_id):
    row = run_one(case_id, MUTANT["swa-pool-untranslated"].backend())
    assert row.status == "fail", row.reason


def test_reference_reads_keys_no_query_sees_as_zero():
    """A freed page's poison (NaN) at keys outside every window changes nothing; the same keys visible do."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 2, 8, generator=g),
        torch.randn(1, 6, 1, 8, generator=g),
        torch.randn(1, 6, 1, 8, generator=g),
    )
    args = dict(kv_indptr=torch.tensor([0, 1]), kv_page_indices=torch.tensor([0]), seq_lens=torch.tensor([6]),
                qo_indptr=torch.tensor([0, 2]), sm_scale=0.3, sinks=torch.tensor([0.5, -1.0]))  # fmt: skip
    o, lse = ref.paged_attention(q, k, v, window=2, **args)
    kp, vp = k.clone(), v.clone()
    kp[0, :2], vp[0, :2] = math.nan, math.nan  # queries at 4 and 5 with window 2 see keys 2..5
    o2, lse2 = ref.paged_attention(q, kp, vp, window=2, **args)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    assert torch.isnan(ref.paged_attention(q, kp, vp, window=3, **args)[0]).any()


def test_swa_pool_without_a_window_exits_2_with_file_line(tmp_path):
    bad = tmp_path / "pool.yaml"
    bad.write_text("cases:\n  - op: extend\n    params: {q_len: 8, prefix_len: 30, kv_pool: swa}\n")
    res = CliRunner().invoke(app, ["sweep", str(bad), "--out", str(tmp_path / "out"), "--device", "cpu"])
    assert res.exit_code == 2, res.output
    assert f"{bad}:3:" in res.output and "kv_pool swa needs a window" in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("case_id", CASES)
def test_a_kernel_that_loads_freed_keys_and_masks_them_passes(case_id):
    """Loading the keys before the window and masking them (a tile across the window start, as FA4 does)
    is harmless in a server, where freed pages hold other requests' finite data: it must pass here too."""
    from attnbench.kernels.mutants.interactions import Bugs, attention_mutant

    row = run_one(case_id, attention_mutant("loads-all-keys-and-masks", Bugs()))
    assert row.status == "pass", row.reason
