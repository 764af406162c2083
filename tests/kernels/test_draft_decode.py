"""Draft decode (`decode` with `draft_topk > 1`): EAGLE's draft step decodes topk candidates per request
over a shared prefix, batch x topk query rows whose page tables name the same prefix pages."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from typer.testing import CliRunner

from attnbench.backend import get_backend
from attnbench.buffers import alloc_output, storage_bytes
from attnbench.case import Case
from attnbench.cli.app import app
from attnbench.kernels.mutants import MUTANTS
from attnbench.ops.attention import AttentionInputs, DecodeParams
from attnbench.ops.paged import draft_pages
from attnbench.references import attention as ref
from helpers import KERNEL, run_one

PARTIAL = "decode/b3-l45-mixed-h8x2-d64-p16-topk4-step3-bf16"  # prefixes 42 / mixed: partial last pages
SLOTS = "decode/b2-l20-h4x2-d32-p1-topk2-step2-fp16"  # SGLang's token slots: the whole prefix shared
ALIGNED = "decode/b2-l49-h4x2-d32-p16-topk4-fp16"  # prefix 48 = 3 full pages: nothing to copy
MUTANT = {m.name: m for m in MUTANTS}


def _rows(x, r):
    """(page ids, K rows as stored) of candidate row r."""
    pages = x.kv_page_indices[int(x.kv_indptr[r]) : int(x.kv_indptr[r + 1])].long()
    return pages, x.k_cache[pages].flatten(0, 1)[: x.seq_lens_host[r]]


@pytest.mark.parametrize("case_id", [PARTIAL, SLOTS, ALIGNED])
def test_candidates_share_prefix_pages_copy_the_partial_one_and_own_their_draft_tokens(case_id):
    case = Case.from_id(case_id)
    p, x = case.params, case.make_inputs()
    k, step, ps = p.draft_topk, p.draft_step, p.page_size
    B = len(x.seq_lens_host) // k
    assert len(x.seq_lens_host) == x.q.shape[0] == p.batch * k  # batch x topk query rows
    assert x.qo_indptr.tolist() == list(range(B * k + 1)) and x.draft_topk == k
    owned: list[set[int]] = []
    copies = 0
    for b in range(B):
        L = x.seq_lens_host[b * k]
        P, full = L - step, (L - step) // ps
        assert all(x.seq_lens_host[b * k + c] == L for c in range(k)) and P >= 1
        tables = [_rows(x, b * k + c) for c in range(k)]
        first_pages, first_keys = tables[0]
        for pages, keys in tables:
            assert len(pages) == -(-L // ps)
            assert torch.equal(pages[:full], first_pages[:full])  # the same physical prefix pages
            assert not torch.isnan(keys.float()).any()  # every key a row sees is there
            assert torch.isnan(x.k_cache[pages[-1], (L - 1) % ps + 1 :].float()).all()  # and nothing past it
            assert torch.equal(keys[:P], first_keys[:P])  # the same prefix, copies included
            owned.append(set(pages[full:].tolist()))
        if P % ps:
            copies += 1
            for c in range(1, k):  # the partial last prefix page: a copy per candidate, on pages of its own
                assert tables[c][0][full] != first_pages[full]
        for c in range(1, k):  # each candidate's own draft tokens (distribution normal: they differ)
            assert not torch.equal(tables[c][1][P:], first_keys[P:])
        shared = set(first_pages[:full].tolist())
        assert all(not (o & shared) for o in owned[-k:])
    flat = [page for o in owned for page in o]
    assert len(flat) == len(set(flat)), "a candidate's own page is no other row's"
    assert (copies > 0) == (case_id == PARTIAL) or ps == 1
    prefix = [x.seq_lens_host[b * k] - step for b in range(B)]
    assert len(set(x.kv_page_indices.tolist())) == draft_pages(prefix, k, step, ps)[0]
    assert case.op.input_bytes(p, case.torch_dtype, case.seed) == storage_bytes(x)


def test_bytes_count_a_shared_prefix_once_and_flops_every_row():
    case = Case.from_id(PARTIAL)
    p, x = case.params, case.make_inputs()
    k, step, ps = p.draft_topk, p.draft_step, p.page_size
    prefix = [x.seq_lens_host[b * k] - step for b in range(p.batch)]
    # one read per cache slot: the shared full prefix pages once, each candidate's copy of the partial page
    # and its own draft tokens once per candidate
    keys = sum(P // ps * ps + k * (P % ps + step) for P in prefix)
    assert keys < sum(x.seq_lens_host)
    el = x.q.element_size()
    qol = x.q.numel() * el + x.o.numel() * el + x.lse.numel() * 4
    table = (x.kv_page_indices.numel() + x.kv_indptr.numel() + x.seq_lens.numel()) * 4
    assert case.op.bytes(p, x) == qol + keys * p.heads_kv * (p.head_dim + p.dv) * el + table
    assert case.op.flops(p, x) == 2.0 * p.heads_q * sum(x.seq_lens_host) * (p.head_dim + p.dv)


def _hand_case():
    """One request, prefix of 3 keys, two candidates of one draft token each, pages of 2, head dim 1.

    Scores q.k with q = 1: prefix keys 0 (weight 1 each), candidate 0's key ln 2 (weight 2), candidate 1's
    key 0 (weight 1). Values: prefix 1, 3, 2; candidate 0's token 5, candidate 1's -2. So
    o_0 = (1 + 3 + 2 + 2 * 5) / (3 + 2) = 3.2, lse_0 = ln 5; o_1 = (1 + 3 + 2 - 2) / 4 = 1, lse_1 = ln 4.
    Page 3 holds prefix keys 0, 1 (shared); pages 0 and 2 each hold a copy of prefix key 2 and then the
    candidate's own token; page 1 is spare (NaN).
    """
    nan = math.nan
    k = torch.tensor([[0.0, 0.0], [nan, nan], [0.0, 0.0], [0.0, 0.0]])
    k[0, 1] = math.log(2)
    v = torch.tensor([[2.0, 5.0], [nan, nan], [2.0, -2.0], [1.0, 3.0]])
    cache = lambda t: t.to(torch.float32).view(4, 2, 1, 1)  # noqa: E731  [P, page_size, Hkv, D]
    return AttentionInputs(
        q=torch.ones(2, 1, 1),
        k_cache=cache(k),
        v_cache=cache(v),
        kv_indptr=torch.tensor([0, 2, 4], dtype=torch.int32),
        kv_page_indices=torch.tensor([3, 0, 3, 2], dtype=torch.int32),
        seq_lens=torch.tensor([4, 4], dtype=torch.int32),
        qo_indptr=torch.tensor([0, 1, 2], dtype=torch.int32),
        o=alloc_output((2, 1, 1), torch.float32, "cpu"),
        lse=alloc_output((2, 1), torch.float32, "cpu"),
        sm_scale=1.0,
        seq_lens_host=(4, 4),
        q_lens_host=(1, 1),
        draft_topk=2,
    )


def test_reference_and_torch_on_a_draft_case_worked_by_hand():
    from attnbench.kernels.mutants.interactions import Bugs, attend
    from attnbench.kernels.torch.attention import paged_attention

    x = _hand_case()
    want_o, want_lse = torch.tensor([3.2, 1.0], dtype=torch.float64), torch.tensor([math.log(5), math.log(4)])
    o, lse = ref.paged_attention(
        x.q, x.k_cache, x.v_cache, x.kv_indptr, x.kv_page_indices, x.seq_lens, x.qo_indptr, sm_scale=1.0
    )
    torch.testing.assert_close(o.flatten(), want_o, rtol=1e-7, atol=0)
    torch.testing.assert_close(lse.flatten(), want_lse.double(), rtol=1e-7, atol=0)
    paged_attention(x)
    torch.testing.assert_close(x.o.flatten(), want_o.float(), rtol=1e-6, atol=0)
    torch.testing.assert_close(x.lse.flatten(), want_lse.float(), rtol=1e-6, atol=0)
    attend(x, Bugs(draft_rows_by_request=True))  # candidate 1 computed from candidate 0's pages
    assert x.o.flatten().tolist() == pytest.approx([3.2, 3.2])


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case_id", [PARTIAL, SLOTS])
def test_torch_and_triton_pass_draft_decode(case_id, backend):
    row = run_one(case_id, get_backend(backend), **KERNEL)
    assert row.status == "pass", row.reason


@pytest.mark.parametrize("case_id", [PARTIAL, SLOTS])
def test_a_decode_that_reads_the_first_candidates_pages_for_every_candidate_fails(case_id):
    row = run_one(case_id, MUTANT["draft-candidate0-pages"].backend())
    assert row.status == "fail", row.reason
    assert "o" in row.reason


def test_the_same_mutant_passes_a_plain_decode():
    """Its bug is in the draft structure only: with one candidate per request it is a correct decode."""
    row = run_one("decode/b3-l45-mixed-h8x2-d64-p16-bf16", MUTANT["draft-candidate0-pages"].backend())
    assert row.status == "pass", row.reason


def test_ids_carry_the_draft_parameters_only_when_set():
    plain = Case.from_id("decode/b3-l37-mixed-h8x2-d128-p16-bf16")
    assert (plain.params.draft_topk, plain.params.draft_step) == (1, 1)
    assert Case("decode", DecodeParams(batch=3, kv_len=37, lens="mixed", heads_q=8, heads_kv=2)).id == (
        "decode/b3-l37-mixed-h8x2-d128-p16-bf16"
    )
    for case_id in (PARTIAL, ALIGNED):
        assert Case.from_id(case_id).id == case_id
    assert "step" not in ALIGNED and Case.from_id(ALIGNED).params.draft_step == 1


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(draft_step=3), "draft_step 3 needs draft_topk > 1"),
        (dict(draft_topk=4, draft_step=3, kv_len=3), "kv_len 3 leaves no prefix for draft_step 3"),
        (dict(draft_topk=2, draft_step=2, kv_lens=[9, 2, 5]), r"kv_lens\[1\] = 2 leaves no prefix for draft_step 2"),
        (dict(draft_topk=2, window=7, kv_pool="swa"), "draft_topk > 1 with kv_pool swa is not part of"),
        (dict(draft_topk=0), "greater than or equal to 1"),
    ],
)
def test_validation_refuses_what_the_contract_forbids(bad, message):
    with pytest.raises(ValidationError, match=message):
        DecodeParams(**bad)


def test_explicit_lengths_are_per_request_and_give_topk_rows_each():
    p = DecodeParams(kv_lens=[9, 40, 5], draft_topk=2, draft_step=2, heads_q=4, heads_kv=2, head_dim=16, page_size=4)
    case = Case("decode", p, "fp16")
    x = case.make_inputs()
    assert x.seq_lens.tolist() == [9, 9, 40, 40, 5, 5]
    assert case.op.input_bytes(p, case.torch_dtype, 0) == storage_bytes(x)


def test_a_suite_with_a_conflicting_draft_case_exits_2_with_file_line(tmp_path):
    bad = tmp_path / "draft.yaml"
    bad.write_text("cases:\n  - op: decode\n    params: {kv_len: 2, draft_topk: 4, draft_step: 2}\n")
    res = CliRunner().invoke(app, ["sweep", str(bad), "--out", str(tmp_path / "out"), "--device", "cpu"])
    assert res.exit_code == 2, res.output
    assert f"{bad}:3:" in res.output and "leaves no prefix for draft_step 2" in res.output


def test_smoke_holds_draft_decode_with_pages_and_partial_prefix_pages():
    """The pairwise axis (coverage.SPACE) gives smoke draft cases on pages > 1 whose prefixes end mid-page."""
    from attnbench.plan.suite import load

    paged = partial = 0
    for case in load("smoke").cases:
        p = case.params
        if case.op.name != "decode" or p.draft_topk == 1 or p.page_size == 1:
            continue
        paged += 1
        rows, _ = case.op.request_lengths(p, case.seed)
        partial += any((L - p.draft_step) % p.page_size for L in rows)
    assert paged and partial, (paged, partial)
