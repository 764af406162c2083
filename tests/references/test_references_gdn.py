"""The float64 GDN references against hand-worked steps, each other, and their own identities."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.references import gdn as ref

D64 = torch.float64


def t64(x):
    return torch.tensor(x, dtype=D64)


def silu(x: float) -> float:
    return x / (1 + math.exp(-x))


# ---- gating -----------------------------------------------------------------------------------------
def test_gating_by_hand():
    # A = 2, softplus(0) = ln 2 -> g = -2 ln 2; above the threshold softplus(x) = x; beta = sigmoid(b)
    A_log, dt_bias = t64([math.log(2.0), math.log(3.0)]), t64([0.0, 1.0])
    a, b = t64([[0.0, 24.0]]), t64([[0.0, math.log(3.0)]])
    g, beta = ref.gating(A_log, a, dt_bias, b)
    assert g[0, 0].item() == pytest.approx(-2 * math.log(2), abs=1e-15)
    assert g[0, 1].item() == pytest.approx(-3 * 25.0, abs=1e-12)  # 24 + 1 > 20: softplus is the identity
    assert beta[0].tolist() == pytest.approx([0.5, 0.75], abs=1e-15)


def test_softplus_threshold_is_strict():
    x = t64([20.0, 19.5, -30.0])
    sp = ref.softplus(x)
    assert sp[0].item() == pytest.approx(math.log1p(math.exp(20.0)), abs=1e-15)  # x == 20 still uses the log
    assert sp[1].item() == pytest.approx(math.log1p(math.exp(19.5)), abs=1e-15)
    assert sp[2].item() == pytest.approx(math.exp(-30.0), rel=1e-12)  # no cancellation for very negative x


# ---- conv1d -----------------------------------------------------------------------------------------
def test_conv1d_update_by_hand():
    w, bias = t64([[1.0, 2.0, 3.0, 4.0]]), t64([0.5])
    states = t64([[[9.0, 9.0, 9.0]], [[1.0, 1.0, 1.0]]])  # slot 1 is the request's
    y, new = ref.causal_conv1d_update(t64([[2.0]]), w, bias, states, torch.tensor([1]))
    assert y.item() == pytest.approx(silu(0.5 + 1 + 2 + 3 + 4 * 2), abs=1e-12)
    assert new[1, 0].tolist() == [1.0, 1.0, 2.0]
    assert new[0, 0].tolist() == [9.0, 9.0, 9.0]  # other slots untouched


def test_conv1d_prefill_by_hand_varlen_and_initial_state():
    w, bias = t64([[1.0, 2.0, 3.0, 4.0]]), t64([0.5])
    states = t64([[[5.0, 6.0, 7.0]], [[1.0, 1.0, 1.0]], [[8.0, 8.0, 8.0]]])
    x = t64([[1.0], [2.0], [10.0]])  # request 0: tokens 1, 2 (no initial state); request 1: token 10
    y, new = ref.causal_conv1d(
        x, w, bias, states, torch.tensor([0, 1]), torch.tensor([False, True]), torch.tensor([0, 2, 3])
    )
    assert y[:, 0].tolist() == pytest.approx(
        [silu(0.5 + 4 * 1), silu(0.5 + 3 * 1 + 4 * 2), silu(0.5 + 1 + 2 + 3 + 40)], abs=1e-12
    )
    assert new[0, 0].tolist() == [0.0, 1.0, 2.0]  # zeros before a short request without a state
    assert new[1, 0].tolist() == [1.0, 1.0, 10.0]
    assert new[2, 0].tolist() == [8.0, 8.0, 8.0]


def test_conv1d_verify_windows_by_hand_chain_tree_and_padding():
    # width 3, one channel: y = silu(0.5 + 1 w0 + 2 w1 + 3 x), window = the last two raw inputs on the path
    w, bias = t64([[1.0, 2.0, 3.0]]), t64([0.5])
    states = t64([[[9.0, 9.0]], [[7.0, 8.0]], [[5.0, 5.0]]])  # request 0 reads slot 1
    x = t64([[[1.0], [10.0], [100.0]], [[6.0], [6.0], [6.0]]])  # [B=2, T=3, dim=1]; request 1 is padding
    idx = torch.tensor([1, -1])
    y, win = ref.causal_conv1d_verify(x, w, bias, states, idx)
    assert y[0, :, 0].tolist() == pytest.approx(
        [silu(0.5 + 7 + 16 + 3), silu(0.5 + 8 + 2 + 30), silu(0.5 + 1 + 20 + 300)], abs=1e-12
    )
    assert win[0, :, 0].tolist() == [[8.0, 1.0], [1.0, 10.0], [10.0, 100.0]]
    # a tree: token 1 is a sibling of token 0 (both from the pool), token 2 a child of token 0
    parents = torch.tensor([[-1, -1, 0], [-1, 0, 1]])
    y, win = ref.causal_conv1d_verify(x, w, bias, states, idx, parents)
    assert y[0, :, 0].tolist() == pytest.approx(
        [silu(0.5 + 7 + 16 + 3), silu(0.5 + 7 + 16 + 30), silu(0.5 + 8 + 2 + 300)], abs=1e-12
    )
    assert win[0, :, 0].tolist() == [[8.0, 1.0], [8.0, 10.0], [1.0, 100.0]]  # the path, not the packed order
    assert states.tolist() == [[[9.0, 9.0]], [[7.0, 8.0]], [[5.0, 5.0]]]  # the pool is only read


def test_conv1d_verify_chain_window_is_prefill_state_of_the_prefix():
    g = torch.Generator().manual_seed(3)
    B, T, dim, W = 2, 5, 3, 4
    x, w = torch.randn(B, T, dim, generator=g, dtype=D64), torch.randn(dim, W, generator=g, dtype=D64)
    bias, states = torch.randn(dim, generator=g, dtype=D64), torch.randn(3, dim, W - 1, generator=g, dtype=D64)
    idx = torch.tensor([2, 0])
    y, win = ref.causal_conv1d_verify(x, w, bias, states, idx)
    for t in range(T):  # prefill of the first t + 1 tokens: the same last output and the window as its state
        n = t + 1
        qsl = torch.tensor([0, n, 2 * n])
        yp, new = ref.causal_conv1d(x[:, :n].reshape(-1, dim), w, bias, states, idx, torch.tensor([True, True]), qsl)
        torch.testing.assert_close(y[:, t], yp.view(B, n, dim)[:, -1], rtol=0, atol=1e-14)
        assert torch.equal(win[:, t], new[idx])


def test_commit_by_hand():
    # one-element states: request r's state after draft step t is 10 (r + 1) + t, its window -(that)
    inter = t64([[[10.0], [11.0]], [[20.0], [21.0]], [[30.0], [31.0]], [[40.0], [41.0]]]).view(4, 2, 1, 1, 1)
    windows = -inter.view(4, 2, 1, 1)
    pool, conv = t64([0.0, 1.0, 2.0, 3.0, 4.0]).view(5, 1, 1, 1), t64([0.5, 1.5, 2.5, 3.5, 4.5]).view(5, 1, 1)
    last = torch.tensor([1, -1, 0, 0])  # request 0 accepts 2 tokens, 1 none, 2 one, 3 is padding
    idx = torch.tensor([2, 0, 4, -1])
    new_pool, new_conv = ref.gdn_commit(inter, windows, last, pool, conv, idx)
    assert new_pool.flatten().tolist() == [0.0, 1.0, 11.0, 3.0, 30.0]
    assert new_conv.flatten().tolist() == [0.5, 1.5, -11.0, 3.5, -30.0]
    assert pool.flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]  # inputs untouched


def test_conv1d_no_activation_is_linear():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(5, 3, generator=g, dtype=D64), torch.randn(3, 4, generator=g, dtype=D64), None
    st = torch.zeros(1, 3, 3, dtype=D64)
    one = (torch.tensor([0]), torch.tensor([True]), torch.tensor([0, 5]))
    y1, _ = ref.causal_conv1d(x, w, b, st, *one, silu=False)
    y2, _ = ref.causal_conv1d(2 * x, w, b, st, *one, silu=False)
    torch.testing.assert_close(y2, 2 * y1, rtol=1e-14, atol=1e-14)


# ---- the delta rule ------------------------------------------------------------------------------------
def test_single_step_by_hand():
    # K = 2, V = 1. k = (1, 0) normalises to ~(1, 0); q = (3, 4) to ~(0.6, 0.8); scale 1.
    S0 = t64([[[2.0], [1.0]]])  # [HV=1, K=2, V=1]
    q, k, v = t64([[[3.0, 4.0]]]), t64([[[1.0, 0.0]]]), t64([[[5.0]]])
    g, beta = t64([[math.log(0.5)]]), t64([[0.25]])
    o, final, _ = ref.recurrent_gated_delta_rule(q, k, v, g, beta, scale=1.0, initial_state=S0)
    nk = 1 / math.sqrt(1 + 1e-6)
    nq = 1 / math.sqrt(25 + 1e-6)
    S = [2.0 * 0.5, 1.0 * 0.5]  # decay first
    u = 0.25 * (5.0 - S[0] * nk)  # delta against the decayed state
    S = [S[0] + nk * u, S[1]]
    assert final[0, :, 0].tolist() == pytest.approx(S, abs=1e-14)
    assert o.item() == pytest.approx(3 * nq * S[0] + 4 * nq * S[1], abs=1e-14)  # from the updated state


def test_gva_maps_v_head_to_qk_head_hv_div_group():
    g = torch.Generator().manual_seed(1)
    T, H, HV, K, V = 3, 2, 4, 4, 3
    q, k = torch.randn(T, H, K, generator=g, dtype=D64), torch.randn(T, H, K, generator=g, dtype=D64)
    v = torch.randn(T, HV, V, generator=g, dtype=D64)
    gg, beta = -torch.rand(T, HV, generator=g, dtype=D64), torch.rand(T, HV, generator=g, dtype=D64)
    o, _, _ = ref.recurrent_gated_delta_rule(q, k, v, gg, beta)
    for hv in range(HV):
        h = hv // (HV // H)
        oh, _, _ = ref.recurrent_gated_delta_rule(
            q[:, h : h + 1], k[:, h : h + 1], v[:, hv : hv + 1], gg[:, hv : hv + 1], beta[:, hv : hv + 1]
        )
        torch.testing.assert_close(o[:, hv : hv + 1], oh, rtol=0, atol=1e-15)


def _random_seq(T, H, HV, K, V, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(T, H, K, generator=g, dtype=D64), torch.randn(T, H, K, generator=g, dtype=D64)
    v = torch.randn(T, HV, V, generator=g, dtype=D64)
    a, b = torch.randn(T, HV, generator=g, dtype=D64), torch.randn(T, HV, generator=g, dtype=D64)
    A_log = torch.log(torch.rand(HV, generator=g, dtype=D64) * 15 + 1)
    dt_bias = torch.log(torch.expm1(torch.rand(HV, generator=g, dtype=D64) * 0.1 + 0.001))
    gg, beta = ref.gating(A_log, a, dt_bias, b)
    h0 = torch.randn(HV, K, V, generator=g, dtype=D64) * 0.5
    return q, k, v, gg, beta, h0


@pytest.mark.parametrize("T,chunk", [(1, 64), (63, 64), (64, 64), (150, 64), (150, 16), (40, 32)])
def test_chunked_equals_recurrent(T, chunk):
    q, k, v, g, beta, h0 = _random_seq(T, 2, 4, 16, 8, seed=T)
    o_r, s_r, _ = ref.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0)
    o_c, s_c = ref.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, chunk_size=chunk)
    torch.testing.assert_close(o_c, o_r, rtol=1e-11, atol=1e-12)
    torch.testing.assert_close(s_c, s_r, rtol=1e-11, atol=1e-12)


def test_chunked_equals_recurrent_with_strong_decay_and_no_initial_state():
    q, k, v, g, beta, _ = _random_seq(130, 1, 2, 8, 8, seed=5)
    g = g * 40  # decays down to ~e^-100 within a chunk: the form must not divide by underflowed products
    o_r, s_r, _ = ref.recurrent_gated_delta_rule(q, k, v, g, beta)
    o_c, s_c = ref.chunk_gated_delta_rule(q, k, v, g, beta)
    assert torch.isfinite(o_c).all() and torch.isfinite(s_c).all()
    torch.testing.assert_close(o_c, o_r, rtol=1e-11, atol=1e-12)
    torch.testing.assert_close(s_c, s_r, rtol=1e-11, atol=1e-12)


def test_chunked_twin_is_close_but_not_exact():
    q, k, v, g, beta, h0 = _random_seq(100, 2, 2, 16, 16, seed=3)
    o64, s64 = ref.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0)
    o16, s16 = ref.chunk_gated_delta_rule(
        q.bfloat16(), k.bfloat16(), v.bfloat16(), g.float(), beta.float(), initial_state=h0.float(),
        precision=torch.bfloat16,
    )  # fmt: skip
    assert o16.dtype == torch.bfloat16 and s16.dtype == torch.float32
    err = (o16.double() - o64).abs().max().item() / o64.abs().max().item()
    assert 1e-4 < err < 5e-2


def test_state_after_every_step_and_parents():
    q, k, v, g, beta, h0 = _random_seq(5, 1, 2, 4, 4, seed=7)
    _, final, states = ref.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0)
    torch.testing.assert_close(states[-1], final, rtol=0, atol=0)
    # a tree: 0 <- root, 1 <- 0, 2 <- 0, 3 <- 2, 4 <- root
    parents = [-1, 0, 0, 2, -1]
    o_t, _, st_t = ref.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0, parents=parents)
    for node, path in {1: [0, 1], 2: [0, 2], 3: [0, 2, 3], 4: [4]}.items():
        o_p, s_p, _ = ref.recurrent_gated_delta_rule(q[path], k[path], v[path], g[path], beta[path], initial_state=h0)
        torch.testing.assert_close(st_t[node], s_p, rtol=0, atol=1e-15)
        torch.testing.assert_close(o_t[node], o_p[-1], rtol=0, atol=1e-15)


# ---- pool-addressed forms ------------------------------------------------------------------------------
def _pool_case(B=3, HV=2, H=1, K=4, V=4, N=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, H, K, generator=g, dtype=D64), torch.randn(B, H, K, generator=g, dtype=D64)
    v = torch.randn(B, HV, V, generator=g, dtype=D64)
    a, b = torch.randn(B, HV, generator=g, dtype=D64), torch.randn(B, HV, generator=g, dtype=D64)
    A_log, dt_bias = torch.randn(HV, generator=g, dtype=D64), torch.randn(HV, generator=g, dtype=D64)
    pool = torch.randn(N, HV, K, V, generator=g, dtype=D64)
    return q, k, v, a, b, A_log, dt_bias, pool


def test_decode_is_one_recurrent_step_per_slot_and_padding_is_untouched():
    q, k, v, a, b, A_log, dt_bias, pool = _pool_case()
    idx = torch.tensor([4, -1, 1])
    o, after = ref.gdn_decode(q, k, v, a, b, A_log, dt_bias, pool, idx)
    g, beta = ref.gating(A_log, a, dt_bias, b)
    for i, slot in enumerate(idx.tolist()):
        h0 = pool[slot] if slot >= 0 else None
        o_r, s_r, _ = ref.recurrent_gated_delta_rule(q[i : i + 1], k[i : i + 1], v[i : i + 1], g[i : i + 1],
                                                     beta[i : i + 1], initial_state=h0)  # fmt: skip
        torch.testing.assert_close(o[i], o_r[0], rtol=0, atol=1e-14)
        if slot >= 0:
            torch.testing.assert_close(after[slot], s_r, rtol=0, atol=1e-14)
    for slot in (0, 2, 3, 5):
        assert torch.equal(after[slot], pool[slot])


def test_verify_chain_matches_recurrence_and_leaves_the_pool():
    g0 = torch.Generator().manual_seed(2)
    B, T, H, HV, K, V = 2, 4, 1, 2, 4, 4
    q, k = torch.randn(B, T, H, K, generator=g0, dtype=D64), torch.randn(B, T, H, K, generator=g0, dtype=D64)
    v = torch.randn(B, T, HV, V, generator=g0, dtype=D64)
    a, b = torch.randn(B, T, HV, generator=g0, dtype=D64), torch.randn(B, T, HV, generator=g0, dtype=D64)
    A_log, dt_bias = torch.randn(HV, generator=g0, dtype=D64), torch.randn(HV, generator=g0, dtype=D64)
    pool = torch.randn(3, HV, K, V, generator=g0, dtype=D64)
    pool_before = pool.clone()
    idx = torch.tensor([2, 0])
    o, states = ref.gdn_verify(q, k, v, a, b, A_log, dt_bias, pool, idx)
    assert torch.equal(pool, pool_before)
    g, beta = ref.gating(A_log, a, dt_bias, b)
    for i in range(B):
        h0 = pool[idx[i]]
        o_r, _, s_r = ref.recurrent_gated_delta_rule(q[i], k[i], v[i], g[i], beta[i], initial_state=h0)
        torch.testing.assert_close(o[i], o_r, rtol=0, atol=1e-14)
        torch.testing.assert_close(states[i], s_r, rtol=0, atol=1e-14)
    chain = torch.arange(-1, T - 1).expand(B, T)
    o_c, s_c = ref.gdn_verify(q, k, v, a, b, A_log, dt_bias, pool, idx, chain)
    assert torch.equal(o_c, o) and torch.equal(s_c, states)


def test_extend_varlen_writes_final_states_and_ignores_slots_without_initial_state():
    g0 = torch.Generator().manual_seed(4)
    lens = [70, 3, 0]
    T, H, HV, K, V = sum(lens), 1, 2, 8, 4
    q, k = torch.randn(T, H, K, generator=g0, dtype=D64), torch.randn(T, H, K, generator=g0, dtype=D64)
    v = torch.randn(T, HV, V, generator=g0, dtype=D64)
    gg, beta = -torch.rand(T, HV, generator=g0, dtype=D64), torch.rand(T, HV, generator=g0, dtype=D64)
    pool = torch.randn(5, HV, K, V, generator=g0, dtype=D64)
    idx, init = torch.tensor([3, 0, 1]), torch.tensor([True, False, True])
    cu = torch.tensor([0, 70, 73, 73])
    o, after = ref.gdn_extend(q, k, v, gg, beta, pool, idx, cu, init)
    h0 = pool[3]
    o0, s0, _ = ref.recurrent_gated_delta_rule(q[:70], k[:70], v[:70], gg[:70], beta[:70], initial_state=h0)
    o1, s1, _ = ref.recurrent_gated_delta_rule(q[70:], k[70:], v[70:], gg[70:], beta[70:])
    torch.testing.assert_close(o[:70], o0, rtol=1e-11, atol=1e-12)
    torch.testing.assert_close(o[70:], o1, rtol=1e-11, atol=1e-12)
    torch.testing.assert_close(after[3], s0, rtol=1e-11, atol=1e-12)
    torch.testing.assert_close(after[0], s1, rtol=1e-11, atol=1e-12)
    assert torch.equal(after[1], pool[1])  # empty request with an initial state: unchanged
    assert torch.equal(after[2], pool[2]) and torch.equal(after[4], pool[4])


def test_extend_runs_every_request_chunk_by_chunk_as_one_sequence_would():
    """gdn_extend takes chunk c of every running request at once (zero tokens past a request's end):
    the same outputs and states as the one-sequence chunked form per request, reference and twin."""
    g0 = torch.Generator().manual_seed(5)
    lens = [130, 5, 64, 1]
    T, H, HV, K, V = sum(lens), 2, 4, 16, 8
    q, k = torch.randn(T, H, K, generator=g0).bfloat16(), torch.randn(T, H, K, generator=g0).bfloat16()
    v = torch.randn(T, HV, V, generator=g0).bfloat16()
    gg, beta = -torch.rand(T, HV, generator=g0), torch.rand(T, HV, generator=g0)
    pool = torch.randn(6, HV, K, V, generator=g0)
    idx, init = torch.tensor([5, 0, 2, 3]), torch.tensor([True, False, True, True])
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    for precision, tol in ((torch.float64, 1e-12), (torch.bfloat16, 1e-6)):
        o, after = ref.gdn_extend(q, k, v, gg, beta, pool, idx, cu, init, precision=precision)
        for b, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
            h0 = pool[idx[b]] if init[b] else None
            ob, sb = ref.chunk_gated_delta_rule(
                q[s:e], k[s:e], v[s:e], gg[s:e], beta[s:e], initial_state=h0, precision=precision
            )
            torch.testing.assert_close(o[s:e].double(), ob.double(), rtol=tol, atol=tol)
            torch.testing.assert_close(after[idx[b]].double(), sb.double(), rtol=tol, atol=tol)
        assert torch.equal(after[[1, 4]].double(), pool[[1, 4]].double())
