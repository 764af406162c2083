"""Triton kernels of the spec family: EAGLE tree building and greedy tree verification.

One program per request. Semantics: SGLang `build_tree_kernel_efficient` and `verify_tree_greedy`
(attnbench docs/spec.md). Tree verification attention is the backend's custom-mask extend kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MASK_MODES = {"full": 0, "qlen": 1, "qlen_packed": 2}


@triton.jit
def _build_tree_kernel(
    # Pointers to inputs
    p_parent_list,  # [B, M] int64
    p_selected,  # [B, N - 1] int64
    p_seq_lens,  # [B] int64
    # Pointers to outputs
    p_mask,  # full / qlen: bool viewed as uint8; qlen_packed: [B * N, NBYTES] uint8
    p_positions,  # [B * N] int64
    p_retrive_index,  # [B, N] int64
    p_next_token,  # [B, N] int64
    p_next_sibling,  # [B, N] int64
    # Sizes
    B,
    M,
    topk,
    depth,
    # Meta-parameters
    N: tl.constexpr,
    BN: tl.constexpr,  # next power of two >= N (and >= 16)
    BB: tl.constexpr,  # next power of two >= B
    BL: tl.constexpr,  # prefix columns written per step (full mode)
    MASK_MODE: tl.constexpr,  # 0 full, 1 qlen, 2 qlen_packed
    NBYTES: tl.constexpr,  # bytes per packed row
):
    i_b = tl.program_id(0)
    o_n = tl.arange(0, BN)
    m_n = o_n < N
    m_d = m_n & (o_n >= 1)  # draft nodes

    # node i >= 1 is candidate selected[i - 1]; its parent candidate is parent_list[candidate // topk]
    b_cand = tl.load(p_selected + i_b * (N - 1) + o_n - 1, mask=m_d, other=0)
    b_tb = b_cand // topk
    b_pcand = tl.load(p_parent_list + i_b * M + b_tb, mask=m_d & (b_tb > 0), other=-2)
    m_match = (b_cand[None, :] == b_pcand[:, None]) & m_d[None, :]  # [child, node]
    b_first = tl.min(tl.where(m_match, o_n[None, :], BN), axis=1)
    b_parent = tl.where(m_d, tl.where(b_tb == 0, 0, b_first), -1)

    # ancestors and depth: pointer jumping, one level per round (gathers as one-hot reductions)
    b_anc = (o_n[:, None] == o_n[None, :]) & m_n[:, None]
    b_depth = tl.zeros([BN], dtype=tl.int64)
    b_cur = b_parent
    for _ in range(depth):
        m_live = b_cur >= 0
        b_anc = b_anc | ((o_n[None, :] == b_cur[:, None]) & m_live[:, None])
        b_depth += m_live.to(tl.int64)
        b_up = tl.sum(tl.where(o_n[None, :] == b_cur[:, None], b_parent[None, :], 0), axis=1)
        b_cur = tl.where(m_live, b_up, -1)

    # children and siblings in increasing index
    m_child = (b_parent[None, :] == o_n[:, None]) & m_d[None, :]  # [parent, node]
    b_next = tl.min(tl.where(m_child, o_n[None, :], BN), axis=1)
    m_sib = (b_parent[None, :] == b_parent[:, None]) & (o_n[None, :] > o_n[:, None]) & m_d[None, :] & m_d[:, None]
    b_sib = tl.min(tl.where(m_sib, o_n[None, :], BN), axis=1)
    b_len = tl.load(p_seq_lens + i_b)
    o_row = i_b * N + o_n
    tl.store(p_next_token + o_row, tl.where(b_next == BN, -1, b_next).to(tl.int64), mask=m_n)
    tl.store(p_next_sibling + o_row, tl.where(b_sib == BN, -1, b_sib).to(tl.int64), mask=m_n)
    tl.store(p_retrive_index + o_row, o_row.to(tl.int64), mask=m_n)
    tl.store(p_positions + o_row, b_len + b_depth, mask=m_n)

    m_nn = m_n[:, None] & m_n[None, :]
    if MASK_MODE == 1:
        tl.store(p_mask + i_b * N * N + o_n[:, None] * N + o_n[None, :], b_anc.to(tl.uint8), mask=m_nn)
    elif MASK_MODE == 0:
        # request b's block starts after sum_{b' < b} N * (L_b' + N) elements; its rows are L_b + N long
        o_b = tl.arange(0, BB)
        b_before = tl.sum(tl.load(p_seq_lens + o_b, mask=o_b < i_b, other=0), axis=0)
        b_start = (b_before + i_b * N) * N
        b_row = b_len + N
        p_rows = p_mask + b_start + o_n[:, None] * b_row
        b_ones = tl.full([BN, BL], 1, dtype=tl.uint8)
        for c0 in range(0, b_len, BL):
            o_c = c0 + tl.arange(0, BL)
            tl.store(p_rows + o_c[None, :], b_ones, mask=m_n[:, None] & (o_c < b_len)[None, :])
        tl.store(p_rows + b_len + o_n[None, :], b_anc.to(tl.uint8), mask=m_nn)
    else:
        for k in tl.static_range(NBYTES):
            m_in = (o_n >= 8 * k) & (o_n < 8 * k + 8) & m_n
            b_weight = tl.where(m_in, 1 << tl.where(m_in, o_n - 8 * k, 0), 0)
            b_byte = tl.sum(b_anc.to(tl.int32) * b_weight[None, :], axis=1)
            tl.store(p_mask + o_row * NBYTES + k, b_byte.to(tl.uint8), mask=m_n)


def build_eagle_tree(x) -> dict[str, torch.Tensor]:
    """Launch `_build_tree_kernel` on `EagleBuildTreeInputs` `x` (writes its outputs)."""
    B, n = x.selected_index.shape[0], x.draft_tokens
    mode = MASK_MODES[x.mask_mode]
    mask = x.tree_mask.view(torch.uint8)
    _build_tree_kernel[(B,)](
        x.parent_list, x.selected_index, x.seq_lens,
        mask, x.positions, x.retrive_index, x.retrive_next_token, x.retrive_next_sibling,
        B, x.parent_list.shape[1], x.topk, x.depth,
        N=n, BN=max(16, triton.next_power_of_2(n)), BB=max(16, triton.next_power_of_2(B)), BL=64,
        MASK_MODE=mode, NBYTES=x.tree_mask.shape[1] if mode == 2 else 1,
    )  # fmt: skip
    return {
        "tree_mask": x.tree_mask,
        "positions": x.positions,
        "retrive_index": x.retrive_index,
        "retrive_next_token": x.retrive_next_token,
        "retrive_next_sibling": x.retrive_next_sibling,
    }


@triton.jit
def _verify_greedy_kernel(
    # Pointers to inputs
    p_candidates,  # [B, N] int64
    p_retrive_index,  # [B, N] int64
    p_next_token,  # [B, N] int64
    p_next_sibling,  # [B, N] int64
    p_target,  # [B * N] int64
    # Pointers to outputs
    p_predicts,  # [B * N] int32, written on the accepted path only
    p_accept_index,  # [B, S] int32
    p_accept_length,  # [B] int32
    # Sizes
    N,
    S,
    # Meta-parameters
    BS: tl.constexpr,  # next power of two >= S
):
    i_b = tl.program_id(0)
    p_row = i_b * N
    i_last = tl.load(p_retrive_index + p_row)
    tl.store(p_accept_index + i_b * S, i_last.to(tl.int32))
    i_acc = tl.zeros((), dtype=tl.int64)
    i_cur = tl.zeros((), dtype=tl.int64)
    i_go = tl.full((), 1, dtype=tl.int64)  # 0 once a step accepts nothing
    for _ in range(1, S):
        if i_go == 1:
            i_cur = tl.load(p_next_token + p_row + i_cur)
            i_want = tl.load(p_target + i_last)
            i_found = tl.zeros((), dtype=tl.int64)
            while (i_cur != -1) & (i_found == 0):
                if tl.load(p_candidates + p_row + i_cur) == i_want:
                    i_found = i_found + 1
                else:
                    i_cur = tl.load(p_next_sibling + p_row + i_cur)
            if i_found == 1:
                tl.store(p_predicts + i_last, i_want.to(tl.int32))
                i_acc += 1
                i_last = tl.load(p_retrive_index + p_row + i_cur)
                tl.store(p_accept_index + i_b * S + i_acc, i_last.to(tl.int32))
            else:
                i_go = i_go * 0
    tl.store(p_accept_length + i_b, i_acc.to(tl.int32))
    tl.store(p_predicts + i_last, tl.load(p_target + i_last).to(tl.int32))
    o_s = tl.arange(0, BS)
    tl.store(p_accept_index + i_b * S + o_s, tl.full([BS], -1, dtype=tl.int32), mask=(o_s > i_acc) & (o_s < S))


def verify_greedy(x) -> dict[str, torch.Tensor]:
    """Launch `_verify_greedy_kernel` on `VerifyGreedyInputs` `x` (writes its outputs)."""
    B, n = x.candidates.shape
    S = x.accept_index.shape[1]
    _verify_greedy_kernel[(B,)](
        x.candidates, x.retrive_index, x.retrive_next_token, x.retrive_next_sibling, x.target_predict,
        x.predicts, x.accept_index, x.accept_length,
        n, S, BS=max(2, triton.next_power_of_2(S)),
    )  # fmt: skip
    return {"predicts": x.predicts, "accept_index": x.accept_index, "accept_length": x.accept_length}
