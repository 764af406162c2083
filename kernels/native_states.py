"""GDN state pools between the canonical layout and the libraries' native one (pure PyTorch, CPU-tested).

attnbench's pool is `[N, HV, K, V]`; SGLang's Triton pool, FlashInfer's GDN kernels and verify
buffers hold `[N, HV, V, K]` (K contiguous). Backends own the layout of stateful inputs
(docs/architecture.md): `prepare` converts the pristine pool once (`state_v_major`), the timed closure runs
the kernel on the native pool, and the closure's `finalize` writes the states back
(`state_canonical_`) for checking, untimed.
"""

from __future__ import annotations

import torch


def state_v_major(pool: torch.Tensor, spare: int = 0) -> torch.Tensor:
    """Canonical GDN states `[..., K, V]` -> SGLang's/FlashInfer's native `[..., V, K]` (a new
    contiguous tensor: state[..., k, v] == native[..., v, k]); with `spare`, that many zero slots
    follow the pool's own (a scratch slot for `zero_fresh_states_`)."""
    native = pool.transpose(-1, -2)
    if spare:
        native = torch.cat([native, native.new_zeros(spare, *native.shape[1:])])
    return native.contiguous()


def state_canonical_(dst: torch.Tensor, native: torch.Tensor, slots: torch.Tensor | None = None) -> torch.Tensor:
    """Write native `[..., V, K]` states back into canonical `[..., K, V]` `dst`, in place; with
    `slots`, only `dst[slots] = native[slots]` (so slots the kernel must not touch stay bit-identical)."""
    if slots is None:
        dst.copy_(native.transpose(-1, -2))
    else:
        dst[slots] = native[slots].transpose(-1, -2)
    return dst


def zero_fresh_states_(native_pool: torch.Tensor, slots: torch.Tensor, has_initial_state: torch.Tensor) -> None:
    """Pool-indexed extend kernels (SGLang's chunked GDN, FlashInfer's with `state_indices`) always read
    a request's slot; a request without an initial state starts from a slot the server cleared when
    it scheduled it. Clear those slots of the native pool, in place, in the timed call (the flags and
    slots are the batch's, rewritten between steps) and without a host sync: `native_pool` carries one
    spare slot at its end (`state_v_major(pool, spare=1)`), which the other requests' entries (and
    padding, -1) clear instead."""
    s = slots.long()
    keep = has_initial_state.to(s.device) | (s < 0)
    native_pool.index_fill_(0, torch.where(keep, native_pool.shape[0] - 1, s), 0)


LAYOUTS = ("kv", "vk")  # GDN pool layouts: "kv" canonical `[N, HV, K, V]`, "vk" K-last `[N, HV, V, K]`


def canonical_view(pool: torch.Tensor, layout: str) -> torch.Tensor:
    """A pool in `layout` as a `[..., K, V]`-indexed view of the same memory (no copy)."""
    return pool if layout == "kv" else pool.transpose(-1, -2)


def native_pool(x, spare: int = 0) -> tuple[torch.Tensor, bool]:
    """(the `[N, HV, V, K]` pool a K-last kernel runs on, whether it is `x.state_pool` itself).

    A pool handed in that layout (`x.state_layout == "vk"`, a gdn_chain step) is used as it is: its last
    slot is the chain's scratch slot, which stands for the `spare` slots. Otherwise the canonical pool
    is converted (`state_v_major`, a copy the caller's `finalize` writes back)."""
    if x.state_layout == "vk":
        return x.state_pool, True
    return state_v_major(x.state_pool, spare), False


def write_back_real_slots(x, native: torch.Tensor, shared: bool):
    """The `finalize` of a closure that runs a K-last kernel on `native` (from `native_pool(x)`): the real
    requests' slots (`x.state_indices >= 0`) written back into the canonical `x.state_pool`, read when it
    runs, not when `prepare` did: the slots are the batch's, rewritten in place between calls (a server's
    next step, the replay check's batch B). Nothing for a pool handed in the native layout (`shared`)."""

    def finalize(outputs):
        if not shared:
            idx = x.state_indices.long()
            state_canonical_(x.state_pool, native, idx[idx >= 0])
        return outputs

    return finalize


def native_pool_written_back(x, spare: int = 0):
    """(the K-last pool a kernel runs on, `native_pool(x, spare)`, and the `finalize` that writes the real
    requests' slots back into the canonical pool, `write_back_real_slots`): what an adapter of a K-last
    decode or extend kernel takes in `prepare`."""
    pool, shared = native_pool(x, spare)
    return pool, write_back_real_slots(x, pool, shared)
