"""GDN state pools between the canonical and the native layout (kernels/native_states.py)."""

from __future__ import annotations

import torch

from attnbench.kernels import native_states as conv


def test_gdn_state_layout_round_trip():
    pool = torch.randn(5, 2, 3, 4)  # [N, HV, K, V]
    native = conv.state_v_major(pool)
    assert native.shape == (5, 2, 4, 3) and native.is_contiguous()
    assert native[1, 0, 2, 1] == pool[1, 0, 1, 2]
    back = torch.zeros_like(pool)
    conv.state_canonical_(back, native)
    assert torch.equal(back, pool)
    only = torch.full_like(pool, 7.0)
    conv.state_canonical_(only, native, torch.tensor([3, 0]))
    assert torch.equal(only[[0, 3]], pool[[0, 3]]) and bool((only[[1, 2, 4]] == 7).all())


def test_zero_fresh_states_clears_only_requests_without_one():
    """In place and sync-free (the timed call runs it): entries that keep their state, and padding (-1),
    clear the spare slot at the end instead."""
    native = conv.state_v_major(torch.ones(4, 1, 2, 2), spare=1)
    assert native.shape == (5, 1, 2, 2) and native[4].abs().sum() == 0 and bool((native[:4] == 1).all())
    native[4] = 1
    conv.zero_fresh_states_(
        native, torch.tensor([2, 0, 3, -1], dtype=torch.int32), torch.tensor([True, False, False, False])
    )
    assert native[[0, 3, 4]].abs().sum() == 0 and bool((native[[1, 2]] == 1).all())
    native = conv.state_v_major(torch.ones(4, 1, 2, 2), spare=1)
    conv.zero_fresh_states_(native, torch.tensor([2, 0, -1], dtype=torch.int32), torch.tensor([False, True, False]))
    assert native[2].abs().sum() == 0 and bool((native[[0, 1, 3]] == 1).all())


def test_write_back_reads_the_slots_when_it_runs():
    """A K-last closure's finalize writes back the slots the batch names after the call (rewritten in place
    since prepare: a server's next step, the replay check's batch B), and only the real ones."""
    from types import SimpleNamespace

    x = SimpleNamespace(state_pool=torch.zeros(5, 1, 2, 3), state_indices=torch.tensor([0, 1], dtype=torch.int32),
                        state_layout="kv")  # fmt: skip
    native, shared = conv.native_pool(x)
    finalize = conv.write_back_real_slots(x, native, shared)
    x.state_indices.copy_(torch.tensor([3, -1], dtype=torch.int32))  # batch B, written in place
    native.fill_(2.0)  # what the replayed kernel wrote
    assert finalize({"o": 1}) == {"o": 1}
    assert bool((x.state_pool[3] == 2).all()) and bool((x.state_pool[[0, 1, 2, 4]] == 0).all())
    x.state_layout = "vk"  # a pool handed in the kernel's layout is the kernel's own: nothing to write back
    x.state_pool = native
    native2, shared2 = conv.native_pool(x)
    assert native2 is native and shared2
