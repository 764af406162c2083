"""The inputs of the GDN ops and the helpers that draw them from a case seed (per-request lengths, pool
slots, trees, gate parameters), shared with gdn_chain."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench.ops import rng


# ---- inputs ---------------------------------------------------------------------------------------
@dataclass
class GatingInputs:
    A_log: torch.Tensor  # [HV] fp32
    a: torch.Tensor  # [T, HV] case dtype
    b: torch.Tensor  # [T, HV] case dtype
    dt_bias: torch.Tensor  # [HV] case dtype
    g: torch.Tensor  # [T, HV] fp32 output, log-space decay
    beta: torch.Tensor  # [T, HV] fp32 output


@dataclass
class ConvInputs:
    """Inputs of causal_conv1d. Update mode: T = B, one token per request, every request has a state.
    Verify mode: T = B * draft (token b * draft + t), every request has a state, the pool is only read."""

    x: torch.Tensor  # [T, dim] case dtype, token-major
    weight: torch.Tensor  # [dim, W] case dtype
    bias: torch.Tensor  # [dim] case dtype
    conv_states: torch.Tensor  # [N, dim, W-1] case dtype, written
    cache_indices: torch.Tensor  # [B] int32 slot per request, -1 = padding (update and verify modes)
    has_initial_state: torch.Tensor  # [B] bool
    query_start_loc: torch.Tensor  # [B+1] int32
    y: torch.Tensor  # [T, dim] output, case dtype
    update: bool = False
    lens_host: tuple[int, ...] = ()
    verify: bool = False
    parents: torch.Tensor | None = None  # [B, draft] int32 (tree verify): -1 = the pool state
    intermediate_conv_windows: torch.Tensor | None = None  # [B, draft, dim, W-1] output, case dtype (verify)


@dataclass
class CommitInputs:
    """Inputs of gdn_commit: the verify outputs, the accepted tokens, and the two pools it writes."""

    inter_states: torch.Tensor  # [B, T, HV, K, V] fp32: the recurrent state after each draft token
    inter_conv_windows: torch.Tensor  # [B, T, dim, W-1] case dtype: the conv window after each draft token
    last_accepted: torch.Tensor  # [B] int32: draft index of the last accepted token, -1 = none
    state_pool: torch.Tensor  # [N, HV, K, V] fp32, written
    conv_states: torch.Tensor  # [N, dim, W-1] case dtype, written
    state_indices: torch.Tensor  # [B] int32 slot of each request in both pools, negative = padding
    # the layout of `state_pool` as handed in: "kv" canonical; a gdn_chain step gets the layout its backend
    # declares (`implements(state_layout=...)`), "vk" `[N, HV, V, K]` with one scratch slot at the end
    state_layout: str = "kv"


@dataclass
class GDNInputs:
    """Inputs of gdn_decode (T = B), gdn_extend (T = sum of lengths) and gdn_verify (T = B * draft)."""

    q: torch.Tensor  # [T, H, K] case dtype, not normalised (packed decode: a view into mixed_qkv)
    k: torch.Tensor  # [T, H, K]
    v: torch.Tensor  # [T, HV, V]
    state_pool: torch.Tensor  # [N, HV, K, V] fp32
    state_indices: torch.Tensor  # [B] int32, negative = padding
    o: torch.Tensor  # [T, HV, V] output, case dtype
    scale: float
    a: torch.Tensor | None = None  # [T, HV] raw gates (decode, verify)
    b: torch.Tensor | None = None  # [T, HV]
    A_log: torch.Tensor | None = None  # [HV] fp32
    dt_bias: torch.Tensor | None = None  # [HV] case dtype
    g: torch.Tensor | None = None  # [T, HV] fp32 log-space decay (extend)
    beta: torch.Tensor | None = None  # [T, HV] fp32 (extend)
    cu_seqlens: torch.Tensor | None = None  # [B+1] int32 (extend)
    has_initial_state: torch.Tensor | None = None  # [B] bool (extend)
    mixed_qkv: torch.Tensor | None = None  # [B, 2 H K + HV V] (packed decode): [q | k | v] per row
    parents: torch.Tensor | None = None  # [B, draft] int32 (tree verify): -1 = the pool state
    inter_states: torch.Tensor | None = None  # [B, draft, HV, K, V] fp32 output (verify)
    lens_host: tuple[int, ...] = ()
    # state_slots: the first slot of the region requests' slots are drawn from (0 for a default pool); the
    # slots before it are spare (NaN). The reference reads only the region (`Op.written_rows`)
    pool_base: int = 0
    # the layout `state_pool` is in: "kv" (canonical `[N, HV, K, V]`) or, handed by a gdn_chain to a backend
    # that declares it (`implements(state_layout=...)`), "vk" `[N, HV, V, K]` with one scratch slot at the end
    state_layout: str = "kv"

    @property
    def batch(self) -> int:
        return self.state_indices.shape[0]

    @property
    def draft(self) -> int:
        return self.inter_states.shape[1] if self.inter_states is not None else 1


# ---- shared generation ------------------------------------------------------------------------------
def _generators(seed: int, device: torch.device) -> tuple[torch.Generator, torch.Generator]:
    host = torch.Generator().manual_seed(seed)
    data = torch.Generator().manual_seed(seed + 7919)  # CPU: the same data on any device (ops/rng.py)
    return host, data


def _randn(shape, dtype, gen, device, std: float = 1.0) -> torch.Tensor:
    return rng.randn(shape, gen, std).to(device=device, dtype=dtype)


def _rand(shape, lo, hi, gen, device) -> torch.Tensor:
    return rng.rand(shape, gen, lo, hi).to(device)


def _lengths(n: int, most: int, kind: str, host: torch.Generator) -> list[int]:
    """Per-request lengths whose maximum is `most` (ids name the longest), at a seeded position."""
    if kind == "equal" or n == 1:
        return [most] * n
    rest = torch.randint(1, most + 1, (n - 1,), generator=host).tolist()
    at = int(torch.randint(0, n, (1,), generator=host))
    return rest[:at] + [most] + rest[at:]


def _initial(n: int, kind: str, host: torch.Generator) -> list[bool]:
    if kind == "all":
        return [True] * n
    if kind == "none":
        return [False] * n
    return [True] + (torch.rand(n - 1, generator=host) < 0.5).tolist()


def _pool_slots(batch: int) -> int:
    """State-pool slots for `batch` requests: ~12% spare (at least 2)."""
    return batch + max(2, batch // 8)


def _slots(batch: int, pad: int, host: torch.Generator, total: int | None = None) -> tuple[int, list[int], int]:
    """(pool size, slot per request, first slot of the requests' region): shuffled distinct slots, ~12%
    spare, `pad` random rows at -1. `total` (`state_slots`) makes the pool that large, the requests' slots
    drawn from its last `_pool_slots(batch)` slots (the rest spare)."""
    pool = _pool_slots(batch)
    if total is not None and total < pool:
        raise ValueError(f"state_slots {total} cannot hold {batch} requests and their spare slots ({pool} slots)")
    base = 0 if total is None else total - pool
    slots = (torch.randperm(pool, generator=host)[:batch] + base).tolist()
    for i in torch.randperm(batch, generator=host)[:pad].tolist():
        slots[i] = -1
    return base + pool, slots, base


def _tree_parents(batch: int, draft: int, host: torch.Generator) -> torch.Tensor:
    """`[B, draft]` int32 parents: token 0 is the root (from the pool state, -1); token t > 0 hangs off
    one of 0..t-1, drawn per request."""
    par = torch.zeros(batch, draft, dtype=torch.int32)
    par[:, 0] = -1
    for t in range(1, draft):
        par[:, t] = torch.randint(0, t, (batch,), generator=host, dtype=torch.int32)
    return par


def _gate_params(heads_v: int, dtype, gen, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A_log [HV] fp32 (rates 1..16) and dt_bias [HV] (softplus^-1 of dt in 0.001..0.1), as Mamba inits."""
    A_log = torch.log(_rand((heads_v,), 1.0, 16.0, gen, device))
    dt = _rand((heads_v,), 0.001, 0.1, gen, device)
    dt_bias = (dt + torch.log(-torch.expm1(-dt))).to(dtype)  # softplus^-1(dt)
    return A_log, dt_bias


_LENGTHS = "per-request lengths: a backend plans its launch from them in prepare, and every buffer is sized by them"


def _regrow(p, x) -> None:
    """Another tree of the same size for every request, seeded from the current one (deterministic)."""
    seed = int(
        (x.parents.long() * torch.arange(1, x.parents.numel() + 1).view_as(x.parents).to(x.parents.device)).sum()
    )
    new = _tree_parents(x.parents.shape[0], x.parents.shape[1], torch.Generator().manual_seed(seed + 1))
    x.parents.copy_(new)
