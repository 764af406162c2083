"""The float64 attention references against hand-worked cases and identities."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.case import Case
from attnbench.references.attention import merge_state, paged_attention

D64 = torch.float64


def dense(q, K, V, **kw):
    """One request, page_size 1, identity page table: q [n, Hq, D], K/V [L, Hkv, D*]."""
    L, n = K.shape[0], q.shape[0]
    return paged_attention(
        q,
        K[:, None],
        V[:, None],
        torch.tensor([0, L]),
        torch.arange(L),
        torch.tensor([L]),
        torch.tensor([0, n]),
        **{"sm_scale": 1.0, **kw},
    )


def one(x):
    return torch.tensor(x, dtype=D64)


# ---- hand-worked -----------------------------------------------------------------------------------
def test_two_keys_softmax_by_hand():
    # scores 0 and ln 3 -> weights 1/4, 3/4; values 4, 8 -> 7; lse = ln 4
    q, K, V = one([[[1.0]]]), one([[[0.0]], [[math.log(3)]]]), one([[[4.0]], [[8.0]]])
    o, lse = dense(q, K, V)
    assert o.item() == pytest.approx(7.0, abs=1e-12)
    assert lse.item() == pytest.approx(math.log(4), abs=1e-12)


def test_sink_only_adds_to_the_denominator():
    # denominator 1 + 3 + e^{ln 4} = 8 -> o = (4 + 24) / 8, lse = ln 8
    q, K, V = one([[[1.0]]]), one([[[0.0]], [[math.log(3)]]]), one([[[4.0]], [[8.0]]])
    o, lse = dense(q, K, V, sinks=one([math.log(4)]))
    assert o.item() == pytest.approx(3.5, abs=1e-12)
    assert lse.item() == pytest.approx(math.log(8), abs=1e-12)


def test_soft_cap_applies_tanh_after_scaling():
    # s = 2 * ln 3 (sm_scale 2), cap 2 -> 2 tanh(ln 3) = 1.6
    q, K, V = one([[[1.0]]]), one([[[0.0]], [[math.log(3)]]]), one([[[0.0]], [[1.0]]])
    o, lse = dense(q, K, V, sm_scale=2.0, soft_cap=2.0)
    w = math.exp(1.6) / (1 + math.exp(1.6))
    assert o.item() == pytest.approx(w, abs=1e-12)
    assert lse.item() == pytest.approx(math.log(1 + math.exp(1.6)), abs=1e-12)


def test_window_zero_sees_only_itself_and_window_one_two_keys():
    q = one([[[1.0]]])
    K = one([[[5.0]], [[0.0]], [[0.0]]])
    V = one([[[100.0]], [[1.0]], [[3.0]]])
    o, _ = dense(q, K, V, window=0)
    assert o.item() == pytest.approx(3.0)
    o, _ = dense(q, K, V, window=1)  # keys 1, 2: equal scores
    assert o.item() == pytest.approx(2.0)


def test_causal_is_bottom_right_aligned():
    # 2 queries over 3 keys: query 0 (position 1) sees keys 0, 1; query 1 sees all three
    q = torch.zeros(2, 1, 1, dtype=D64)
    K = torch.zeros(3, 1, 1, dtype=D64)
    V = one([[[3.0]], [[5.0]], [[10.0]]])
    o, lse = dense(q, K, V, causal=True)
    assert o[:, 0, 0].tolist() == pytest.approx([4.0, 6.0])
    assert lse[:, 0].tolist() == pytest.approx([math.log(2), math.log(3)])


def test_gqa_maps_query_head_to_kv_head_by_integer_division():
    # Hq 4, Hkv 2: heads 0, 1 read kv head 0; heads 2, 3 read kv head 1
    q = torch.zeros(1, 4, 1, dtype=D64)
    K = torch.zeros(1, 2, 1, dtype=D64)
    V = one([[[1.0], [2.0]]])
    o, _ = dense(q, K, V)
    assert o[0, :, 0].tolist() == [1.0, 1.0, 2.0, 2.0]


def test_custom_mask_replaces_causality_and_an_empty_row_is_zero_with_lse_minus_inf():
    q = torch.zeros(2, 1, 1, dtype=D64)
    K = torch.zeros(3, 1, 1, dtype=D64)
    V = one([[[3.0]], [[5.0]], [[10.0]]])
    mask = torch.tensor([[False, False, False], [True, False, True]]).flatten()
    o, lse = dense(q, K, V, custom_mask=mask, mask_indptr=torch.tensor([0, 6]))
    assert o[:, 0, 0].tolist() == [0.0, 6.5]
    assert lse[0, 0].item() == -math.inf and lse[1, 0].item() == pytest.approx(math.log(2))


def test_merge_state_by_hand():
    v_a, v_b = one([[[2.0]]]), one([[[8.0]]])
    s_a, s_b = one([[0.0]]), one([[math.log(3)]])
    v, s = merge_state(v_a, s_a, v_b, s_b)
    assert v.item() == pytest.approx(6.5) and s.item() == pytest.approx(math.log(4))
    v, s = merge_state(v_a, one([[-math.inf]]), v_b, one([[-math.inf]]))
    assert v.item() == 0.0 and s.item() == -math.inf


# ---- identities on generated cases ---------------------------------------------------------------
def _ref(case_id: str, **override):
    case = Case.from_id(case_id)
    x = case.make_inputs()
    for k, v in override.items():
        setattr(x, k, v)
    return case, x, case.op.expected(case.params, x, D64)


def test_window_at_least_the_length_is_no_window():
    _, x, full = _ref("extend/b2-q7-pre20-mixed-h4x2-d32-p16-bf16")
    _, _, wide = _ref("extend/b2-q7-pre20-mixed-h4x2-d32-p16-bf16", window=10_000)
    assert torch.equal(full["o"], wide["o"]) and torch.equal(full["lse"], wide["lse"])


def test_huge_soft_cap_is_no_soft_cap():
    _, _, full = _ref("decode/b3-l40-mixed-h4x2-d32-p16-bf16")
    _, _, capped = _ref("decode/b3-l40-mixed-h4x2-d32-p16-bf16", soft_cap=1e9)
    torch.testing.assert_close(full["o"], capped["o"], rtol=1e-12, atol=1e-12)


def test_sink_minus_infinity_is_no_sink():
    _, x, full = _ref("decode/b2-l30-h4x4-d16-p16-bf16")
    _, _, sunk = _ref("decode/b2-l30-h4x4-d16-p16-bf16", sinks=torch.full((4,), -math.inf))
    assert torch.equal(full["o"], sunk["o"]) and torch.equal(full["lse"], sunk["lse"])


def test_merging_two_halves_gives_the_whole():
    torch.manual_seed(0)
    L, H, D = 50, 4, 16
    q = torch.randn(1, H, D, dtype=D64)
    K, V = torch.randn(L, H, D, dtype=D64), torch.randn(L, H, D, dtype=D64)
    o, lse = dense(q, K, V, causal=False)
    oa, la = dense(q, K[:20], V[:20], causal=False)
    ob, lb = dense(q, K[20:], V[20:], causal=False)
    om, lm = merge_state(oa, la, ob, lb)
    torch.testing.assert_close(om, o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lm, lse, rtol=1e-12, atol=1e-12)


def test_mla_is_decode_with_one_kv_head_and_576_512():
    # the MLA value cache is a view of the latent; an explicit copy must give the same reference
    case, x, mla = _ref("decode/b2-l33-h16x1-d576x512-p16-mla-bf16")
    assert x.v_cache.untyped_storage().data_ptr() == x.k_cache.untyped_storage().data_ptr()
    x.v_cache = x.k_cache[..., :512].clone()
    plain = case.op.expected(case.params, x, D64)
    assert torch.equal(plain["o"], mla["o"]) and torch.equal(plain["lse"], mla["lse"])
    assert case.params.scale == pytest.approx(192**-0.5)


def test_encoder_equals_causal_on_the_last_query():
    _, x, causal = _ref("extend/b1-q9-pre5-h4x2-d32-p16-bf16")
    _, _, enc = _ref("extend/b1-q9-pre5-h4x2-d32-p16-bidirectional-bf16")
    assert torch.equal(causal["o"][-1], enc["o"][-1])
    assert not torch.equal(causal["o"][0], enc["o"][0])


def test_decode_equals_the_last_row_of_a_causal_extend_over_the_same_keys():
    torch.manual_seed(1)
    L, Hq, Hkv, D = 37, 8, 2, 32
    q = torch.randn(5, Hq, D, dtype=D64)
    K, V = torch.randn(L, Hkv, D, dtype=D64), torch.randn(L, Hkv, D, dtype=D64)
    o_ext, l_ext = dense(q, K, V, causal=True, window=9)
    o_dec, l_dec = dense(q[-1:], K, V, causal=True, window=9)
    # float64 ulps only: the two paths run matmuls of different shapes, whose BLAS summation order differs
    torch.testing.assert_close(o_dec, o_ext[-1:], rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(l_dec, l_ext[-1:], rtol=1e-13, atol=1e-13)


def test_chunking_over_queries_changes_nothing(monkeypatch):
    import attnbench.references.attention as ref

    _, x, whole = _ref("extend/b2-q40-pre30-h4x2-d16-p16-custom-bf16")
    monkeypatch.setattr(ref, "_SCORE_BUDGET", 4 * 70 * 3)  # 3 query rows per chunk
    _, _, chunked = _ref("extend/b2-q40-pre30-h4x2-d16-p16-custom-bf16")
    torch.testing.assert_close(chunked["o"], whole["o"], rtol=1e-13, atol=1e-13)  # BLAS order may differ
    torch.testing.assert_close(chunked["lse"], whole["lse"], rtol=1e-13, atol=1e-13)


def test_the_twin_is_close_to_but_not_the_reference():
    case, x, ref64 = _ref("decode/b2-l200-h4x2-d64-p16-bf16")
    twin = case.op.expected(case.params, x, torch.bfloat16)
    assert twin["o"].dtype == torch.bfloat16 and twin["lse"].dtype == torch.float32
    err = (twin["o"].double() - ref64["o"]).abs().max().item()
    assert 0 < err < 2**-7 * ref64["o"].abs().max().item()
