"""GDN-family op contracts: `gdn_gating`, `causal_conv1d`, `gdn_decode`, `gdn_extend`, `gdn_verify`,
`gdn_commit`.

Canonical semantics (docs/architecture.md "GDN"; the math is in `attnbench.references.gdn`):

- Heads: `H` q/k heads, `HV` v-heads (GVA: v-head `hv` reads q/k head `hv // (HV / H)`), head dims
  `K` (q/k) and `V`. q and k arrive raw (not normalised); kernels L2-normalise them
  (`x / sqrt(sum x^2 + 1e-6)`) and scale q by `scale` (default `K**-0.5`).
- Gates: raw `a`, `b` `[T, HV]` (case dtype), `A_log [HV]` fp32, `dt_bias [HV]` (case dtype);
  `g = -exp(A_log) * softplus(a + dt_bias)` (threshold 20), `beta = sigmoid(b)`, both fp32.
  `gdn_decode` and `gdn_verify` take the raw gates (the gating is fused); `gdn_extend` takes `g`,
  `beta` as `gdn_gating` makes them.
- States: a pool `[N, HV, K, V]` fp32 addressed by `state_indices [B]` int32; per step decay first,
  then the delta against the decayed state, then the output from the updated state. A negative
  index is padding: the pool is neither read nor written for it, and its output rows are
  unspecified (SGLang computes them from a zero state, FlashInfer writes zeros).
- Tokens are packed token-major: `q [T, H, K]`, `v [T, HV, V]`, `o [T, HV, V]`. Extend packs requests
  by `cu_seqlens [B+1]`; verify packs `draft` tokens per request (token `b * draft + t`).
- causal_conv1d: token-major `x [T, dim]` (SGLang's `causal_conv1d_fn` takes the `[dim, T]` transposed
  view of this same memory, `mixed_qkv.transpose(0, 1)`), `weight [dim, W]`, `bias [dim]`, conv
  states `[N, dim, W-1]` addressed by `cache_indices [B]`, SiLU. `mode: prefill` is the varlen form
  (`query_start_loc [B+1]`, `has_initial_state [B]`); `mode: update` is one decode token per request
  (`x [B, dim]`). Both write the new states (the last W-1 raw inputs, bit-exact copies).
  `mode: verify` is speculative verify: `seq_len` draft tokens per request packed like gdn_verify's
  (token `b * draft + t`, `x [B * draft, dim]`), a chain or a tree (`parents [B, draft]`, -1 = the
  pool state), every request from its pool state (`cache_indices`, -1 = padding: nothing read, its
  outputs unspecified). Each token's output continues its parent's window, and the window after each
  token (the W-1 most recent raw inputs along its path, root to token via parents, not the packed
  order) goes to `intermediate_conv_windows [B, draft, dim, W-1]` (case dtype, exact copies). The pool
  is NOT written in verify mode.
- Speculative decoding, verify -> commit (docs/conventions.md "GDN speculative verify and commit"):
  gdn_verify and causal_conv1d's verify mode keep the recurrent state and the conv window after every
  draft token and leave both pools alone; once the draft is judged, `gdn_commit` copies the state and
  the window after each request's last accepted token into its pool slots (none accepted: the pools
  keep the pre-verify state; rejected branches leave no trace). Decoding the accepted tokens one at a
  time (conv update + gdn_decode) ends in the same pools.

Inputs are realistic: pool slots hold random states, slots are shuffled, spare slots exist (and must
stay bitwise untouched), gates span strong and weak decay (`exp(g)` from ~0.02 to ~1), and some raw
gates `a` sit beyond the softplus threshold (20) and beyond float32 `exp` overflow (88.7).

Cost model (what `flops()` and `bytes()` count; per v-head, summed over heads and requests):

- gdn_decode / gdn_verify: FLOPs = 6 K V per token (S^T k, k u^T, S^T q at 2 FLOPs per
  multiply-add; the decay scaling, gating and normalisation are not counted). Bytes = the fp32 state
  read once per request and written once (decode) or written after every step to `inter_states`
  (verify) + q, k, v, o, raw gates, A_log, dt_bias, indices (and parents). Padding rows count for
  their q/k/v/o bytes but not for state traffic or FLOPs.
- gdn_extend: FLOPs of the chunked form at chunk size c = 64, per chunk of n <= c tokens:
  6 n K V (W S, (Gamma q) S, k^T U') + 4 n^2 (K + V) (k k^T, q k^T, T (beta Gamma k), P U')
  + n^3 / 3 (the triangular solve). Bytes = q, k, v, o + g, beta (fp32) + initial states read (requests
  with one) + final states written.
- gdn_gating: elementwise, no FLOPs counted. Bytes = a, b read, g, beta written, A_log, dt_bias.
- causal_conv1d: FLOPs = 2 W dim per token. Bytes = x read, y written, weight, bias, states read (the
  requests with an initial state) and written, indices. Verify mode: FLOPs of the real requests' tokens;
  bytes = x, y (all rows), weight, bias, the real requests' states read and their windows written
  (draft per request), indices and parents.
- gdn_commit: no FLOPs. Bytes = per real request that accepted a token, its state and conv window read
  from the verify buffers and written to the pools, + indices and accepted indices of every request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field, model_validator

from attnbench.buffers import alloc_output, output_bytes
from attnbench.ops import rng
from attnbench.ops.base import (
    WEIGHTS,
    IdField,
    Op,
    OutputSpec,
    Params,
    Perturbation,
    SmokeSpace,
    negated,
    rolled,
    tensor_bytes,
)
from attnbench.ops.replay_batches import gdn_batch
from attnbench.references import gdn as ref

CHUNK = 64  # the chunk size the gdn_extend cost model counts


# ---- parameters -----------------------------------------------------------------------------------
class GatingParams(Params):
    tokens: int = Field(64, ge=1, description="rows of a and b (tokens of the batch)")
    heads_v: int = Field(8, ge=1)


class ConvParams(Params):
    mode: Literal["prefill", "update", "verify"] = Field(
        "prefill", description="varlen prefill, one token each, or speculative verify (draft tokens each)"
    )
    batch: int = Field(2, ge=1)
    seq_len: int = Field(
        1, ge=1, description="prefill: tokens per request (the most, for mixed); update: 1; verify: draft tokens"
    )
    dim: int = Field(256, ge=1, description="channels: 2 H K + HV V of the model")
    width: int = Field(4, ge=2, le=4)
    lens: Literal["equal", "mixed"] = "equal"
    init: Literal["all", "none", "mixed"] = Field("all", description="which requests have an initial state")
    tree: bool = Field(False, description="verify: the draft tokens form a tree (parents array), not a chain")
    pad: int = Field(0, ge=0, description="verify: padding requests (cache index -1)")

    @model_validator(mode="after")
    def _update(self):
        if self.mode == "update" and (self.seq_len != 1 or self.lens != "equal" or self.init != "all"):
            raise ValueError("mode update: one token per request, each with a state (seq_len 1, init all)")
        if self.mode == "verify" and (self.lens != "equal" or self.init != "all"):
            raise ValueError("mode verify: seq_len draft tokens per request, each from its state (init all)")
        if self.mode != "verify" and (self.tree or self.pad):
            raise ValueError("tree and pad are parameters of mode verify")
        if self.pad >= self.batch:
            raise ValueError(f"pad ({self.pad}) must leave at least one real request of batch {self.batch}")
        return self


class GDNParams(Params):
    """Shared by gdn_decode, gdn_extend and gdn_verify."""

    batch: int = Field(4, ge=1)
    heads_qk: int = Field(4, ge=1, description="H: q/k heads")
    heads_v: int = Field(8, ge=1, description="HV: v-heads (a multiple of H)")
    head_dim_k: int = Field(128, ge=1)
    head_dim_v: int = Field(128, ge=1)
    scale: float | None = Field(None, gt=0.0, description="multiplies the normalised q; default K**-0.5")
    state_slots: int | None = Field(
        None,
        ge=1,
        description="slots in the state pool (default: the batch + ~12% spare): a production-size pool with every "
        "slot a request uses at its end, past 2^31 elements where it is that large (int32 offsets); the slots "
        "before are spare and NaN",
    )

    @model_validator(mode="after")
    def _heads(self):
        if self.heads_v % self.heads_qk:
            raise ValueError(f"heads_v ({self.heads_v}) must be a multiple of heads_qk ({self.heads_qk})")
        return self

    @property
    def q_scale(self) -> float:
        return self.head_dim_k**-0.5 if self.scale is None else self.scale


class GDNDecodeParams(GDNParams):
    pad: int = Field(0, ge=0, description="padding rows (state index -1) among the batch")
    packed: bool = Field(False, description="q, k, v come as one mixed_qkv [B, 2 H K + HV V] row per request")

    @model_validator(mode="after")
    def _pad(self):
        if self.pad >= self.batch:
            raise ValueError(f"pad ({self.pad}) must leave at least one real request of batch {self.batch}")
        return self


class GDNExtendParams(GDNParams):
    seq_len: int = Field(128, ge=1, description="tokens per request (the most, for mixed)")
    lens: Literal["equal", "mixed"] = "equal"
    init: Literal["all", "none", "mixed"] = Field("all", description="requests that start from a pool state")


class GDNCommitParams(Params):
    batch: int = Field(4, ge=1)
    draft: int = Field(4, ge=1, description="T: draft tokens per request of the verify before")
    heads_v: int = Field(8, ge=1, description="HV: v-heads")
    head_dim_k: int = Field(128, ge=1)
    head_dim_v: int = Field(128, ge=1)
    dim: int = Field(256, ge=1, description="conv channels: 2 H K + HV V of the model")
    width: int = Field(4, ge=2, le=4, description="conv width W (windows of W-1 raw inputs)")
    pad: int = Field(0, ge=0, description="padding requests (slot -1)")
    accept: Literal["mixed", "none", "all"] = Field(
        "mixed", description="accepted draft tokens per request: random 0..draft, none, or all"
    )

    @model_validator(mode="after")
    def _pad(self):
        if self.pad >= self.batch:
            raise ValueError(f"pad ({self.pad}) must leave at least one real request of batch {self.batch}")
        return self


class GDNVerifyParams(GDNParams):
    draft: int = Field(4, ge=1, description="T: draft tokens per request")
    tree: bool = Field(False, description="tokens form a tree (parents array), not a chain")
    pad: int = Field(0, ge=0, description="padding requests (state index -1)")

    @model_validator(mode="after")
    def _pad(self):
        if self.pad >= self.batch:
            raise ValueError(f"pad ({self.pad}) must leave at least one real request of batch {self.batch}")
        return self


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
    cache_indices: torch.Tensor  # [B] int32 slot per request
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


def _heads_feature(p: GDNParams) -> str:
    return "gva" if p.heads_v > p.heads_qk else "hv=h"


def _dims_features(p: GDNParams) -> list[str]:
    f = []
    if p.head_dim_k != p.head_dim_v:
        f.append("k!=v")
    if p.head_dim_k not in (64, 128, 256) or p.head_dim_v not in (64, 128, 256):
        f.append("odd-dim")
    return f


_LENGTHS = "per-request lengths: a backend plans its launch from them in prepare, and every buffer is sized by them"


def _move_gates(p, x) -> None:
    """Log decays halved (still < 0), beta -> 1 - beta (still in (0, 1))."""
    x.g.mul_(0.5)
    x.beta.copy_(1.0 - x.beta)


def _regrow(p, x) -> None:
    """Another tree of the same size for every request, seeded from the current one (deterministic)."""
    seed = int(
        (x.parents.long() * torch.arange(1, x.parents.numel() + 1).view_as(x.parents).to(x.parents.device)).sum()
    )
    new = _tree_parents(x.parents.shape[0], x.parents.shape[1], torch.Generator().manual_seed(seed + 1))
    x.parents.copy_(new)


# ---- gdn_gating -------------------------------------------------------------------------------------
# smoke coverage (harness/ops/coverage.py) shared by gdn_decode, gdn_extend and gdn_verify
GDN_HELD = {
    "state_slots": (None, "production-size pools past 2^31 elements (int32 offsets) are suites/large.yaml's, on a GPU")
}
GDN_SMOKE = {
    "heads_qk,heads_v": [(2, 2), (1, 4), (2, 6)],
    # (128, 128), the production shape: K and V wider than a 64-wide tile (per-tile norms, tiled states)
    "head_dim_k,head_dim_v": [(16, 16), (32, 16), (16, 48), (128, 128)],
    "scale": [None, 0.4],
    "dtype": ["bf16", "fp16", "fp32"],
}


class GDNGatingOp(Op):
    """g = -exp(A_log) softplus(a + dt_bias) (threshold 20), beta = sigmoid(b), fp32 outputs."""

    name = "gdn_gating"
    smoke = SmokeSpace(space={"tokens": [1, 33, 300], "heads_v": [4, 6], "dtype": ["bf16", "fp16", "fp32"]})
    family = "gdn"
    preset_key = "gdn_gating"
    Params = GatingParams
    id_fields = (IdField("t", ("tokens",), always=True), IdField("h", ("heads_v",), always=True))
    outputs = {"g": OutputSpec(("token", "head")), "beta": OutputSpec(("token", "head"))}

    def input_bytes(self, p: GatingParams, dtype, seed: int) -> int:
        T, HV = p.tokens, p.heads_v
        params = tensor_bytes((HV,), torch.float32) + tensor_bytes((HV,), dtype)  # A_log, dt_bias
        return params + 2 * tensor_bytes((T, HV), dtype) + 2 * output_bytes((T, HV), torch.float32)

    def build_inputs(self, p: GatingParams, dtype, seed, device) -> GatingInputs:
        _, gen = _generators(seed, device)
        T, HV = p.tokens, p.heads_v
        A_log, dt_bias = _gate_params(HV, dtype, gen, device)
        a = _randn((T, HV), torch.float32, gen, device, std=2.0)
        # every 16th element above the softplus threshold (20), so the linear branch is exercised, and
        # every 16th from the 8th beyond float32 exp overflow (88.7), where log(1 + exp(x)) is inf
        a.view(-1)[::16] = _rand((a.view(-1)[::16].numel(),), 28.0, 48.0, gen, device)
        a.view(-1)[8::16] = _rand((a.view(-1)[8::16].numel(),), 90.0, 130.0, gen, device)
        b = _randn((T, HV), dtype, gen, device, std=2.0)
        g = alloc_output((T, HV), torch.float32, device)
        beta = alloc_output((T, HV), torch.float32, device)
        return GatingInputs(A_log, a.to(dtype), b, dt_bias, g, beta)

    def expected(self, p, x: GatingInputs, precision):
        g, beta = ref.gating(x.A_log, x.a, x.dt_bias, x.b, precision=precision)
        return {"g": g, "beta": beta}

    held = {"A_log": WEIGHTS, "dt_bias": WEIGHTS}

    def perturbations(self, p: GatingParams) -> tuple[Perturbation, ...]:
        return (negated("raw gates", ("a", "b")),)

    def bytes(self, p: GatingParams, x: GatingInputs) -> float:
        el = x.a.element_size()
        return float(2 * x.a.numel() * el + 2 * x.g.numel() * 4 + p.heads_v * (4 + x.dt_bias.element_size()))


# ---- causal_conv1d ----------------------------------------------------------------------------------
class CausalConv1dOp(Op):
    """Depthwise causal conv1d + SiLU over per-request windows; writes the last W-1 raw inputs back.

    Verify mode (speculative decoding) writes no state: it keeps the window after every draft token in
    `intermediate_conv_windows` for `gdn_commit` (module docstring)."""

    name = "causal_conv1d"
    smoke = SmokeSpace(
        # dim 130: channels over more than one 64- or 128-wide tile (per-tile bias and weight offsets)
        space={"batch": [1, 3, 5], "seq_len": [1, 2, 3, 9, 40], "dim": [40, 48, 130],
               "width": [2, 3, 4], "pad": [0, 1], "dtype": ["bf16", "fp16", "fp32"]},
        # update mode fixes five axes (seq_len 1, lens, init, tree, pad): the greedy fill and its random
        # repairs miss completions of (batch, update) and (width, update), which would be listed as forbidden
        # though allowed; one update case per batch and width
        seeds=[
            {"batch": b, "mode": "update", "width": w, "dim": c, "dtype": dt}
            for b, w, c, dt in ((1, 2, 40, "bf16"), (3, 3, 48, "fp16"), (5, 4, 40, "fp32"))
        ],
    )  # fmt: skip
    family = "gdn"
    preset_key = "gdn_conv"
    Params = ConvParams
    id_fields = (
        IdField("b", ("batch",), always=True),
        IdField("t", ("seq_len",), always=True),
        IdField("", ("lens",)),
        IdField("c", ("dim",), always=True),
        IdField("w", ("width",)),
        IdField("init", ("init",)),
        IdField("pad", ("pad",)),
        IdField("tree", ("tree",)),
        IdField("", ("mode",)),
    )
    outputs = {
        "y": OutputSpec(("token", "channel")),
        "intermediate_conv_windows": OutputSpec(("request", "step", "channel", "tap"), exact=True),
    }

    def outputs_for(self, p: ConvParams) -> dict[str, OutputSpec]:
        return self.outputs if p.mode == "verify" else {"y": self.outputs["y"]}

    def features(self, p: ConvParams) -> tuple[str, ...]:
        f = [p.mode]
        if p.lens == "mixed":
            f.append("varlen")
        if p.init != "all":
            f.append(f"init-{p.init}")
        if p.width != 4:
            f.append(f"width{p.width}")
        if p.mode == "verify":
            f.append("tree" if p.tree else "chain")
        if p.pad:
            f.append("padding")
        return tuple(f)

    def writes_for(self, p: ConvParams):
        if p.mode == "verify":
            return {}  # the pool is only read: any change to it is an error (checks: inputs unchanged)
        return {"conv_states": OutputSpec(("slot", "channel", "tap"), exact=True)}

    def unspecified(self, p: ConvParams, x: ConvInputs):
        if not p.pad:
            return {}
        pad = x.cache_indices < 0
        return {"y": pad.repeat_interleave(p.seq_len)[:, None], "intermediate_conv_windows": pad[:, None, None, None]}

    def input_bytes(self, p: ConvParams, dtype, seed: int) -> int:
        host, _ = _generators(seed, None)
        B, D, W = p.batch, p.dim, p.width
        T, N = sum(_lengths(B, p.seq_len, p.lens, host)), _pool_slots(B)
        data = tensor_bytes((T, D), dtype) + tensor_bytes((D, W + 1), dtype) + tensor_bytes((N, D, W - 1), dtype)
        total = data + 4 * B + B + 4 * (B + 1) + output_bytes((T, D), dtype)  # slots, has_initial, starts, y
        if p.mode == "verify":  # the windows; the parents of a tree
            total += output_bytes((B, p.seq_len, D, W - 1), dtype) + (4 * T if p.tree else 0)
        return total

    def build_inputs(self, p: ConvParams, dtype, seed, device) -> ConvInputs:
        host, gen = _generators(seed, device)
        B, D, W = p.batch, p.dim, p.width
        lens = _lengths(B, p.seq_len, p.lens, host)
        init = _initial(B, p.init, host)
        N, slots, _ = _slots(B, p.pad, host)
        T = sum(lens)
        qsl = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32)
        verify = p.mode == "verify"
        parents = _tree_parents(B, p.seq_len, host).to(device) if p.tree else None
        windows = alloc_output((B, p.seq_len, D, W - 1), dtype, device) if verify else None
        return ConvInputs(
            x=_randn((T, D), dtype, gen, device),
            weight=_randn((D, W), dtype, gen, device, std=W**-0.5),
            bias=_randn((D,), dtype, gen, device, std=0.5),
            conv_states=_randn((N, D, W - 1), dtype, gen, device),
            cache_indices=torch.tensor(slots, dtype=torch.int32, device=device),
            has_initial_state=torch.tensor(init, dtype=torch.bool, device=device),
            query_start_loc=qsl.to(device),
            y=alloc_output((T, D), dtype, device),
            update=p.mode == "update",
            lens_host=tuple(lens),
            verify=verify,
            parents=parents,
            intermediate_conv_windows=windows,
        )

    def expected(self, p, x: ConvInputs, precision):
        if p.mode == "verify":
            B, T = p.batch, p.seq_len
            y, windows = ref.causal_conv1d_verify(
                x.x.view(B, T, -1), x.weight, x.bias, x.conv_states, x.cache_indices, x.parents,
                precision=precision,
            )  # fmt: skip
            return {"y": y.flatten(0, 1), "intermediate_conv_windows": windows}
        y, states = ref.causal_conv1d(
            x.x, x.weight, x.bias, x.conv_states, x.cache_indices, x.has_initial_state, x.query_start_loc,
            precision=precision,
        )  # fmt: skip
        return {"y": y, "conv_states": states}

    held = {
        "weight": WEIGHTS,
        "bias": WEIGHTS,
        "query_start_loc": _LENGTHS,
        "has_initial_state": "read in prefill mode only, where it is rotated (update and verify modes continue every "
        "request from its pool state)",
    }

    def perturbations(self, p: ConvParams) -> tuple[Perturbation, ...]:
        """Inputs by value; slots and initial-state flags rotated among the requests; verify mode (the pool
        only read): the pool's states by value, and a tree's parents redrawn. The weights are held."""
        perts = [negated("inputs", ("x",)), rolled("slots", ("cache_indices",))]
        if p.mode == "prefill":
            perts.append(rolled("initial-state flags", ("has_initial_state",)))
        if p.mode == "verify":
            perts.append(negated("states", ("conv_states",)))
            if p.tree:
                perts.append(Perturbation("tree", ("parents",), _regrow))
        return tuple(perts)

    def row_requests(self, p, x: ConvInputs):
        return torch.repeat_interleave(torch.arange(len(x.lens_host)), torch.tensor(x.lens_host))

    def flops(self, p: ConvParams, x: ConvInputs) -> float:
        if p.mode == "verify":
            return 2.0 * p.width * p.dim * p.seq_len * (p.batch - p.pad)
        return 2.0 * p.width * p.dim * x.x.shape[0]

    def bytes(self, p: ConvParams, x: ConvInputs) -> float:
        el = x.x.element_size()
        state = p.dim * (p.width - 1) * el
        if p.mode == "verify":
            real = p.batch - p.pad
            total = 2 * x.x.numel() * el + (x.weight.numel() + x.bias.numel()) * el + real * (1 + p.seq_len) * state
            return float(total + x.cache_indices.numel() * 4 + (x.parents.numel() * 4 if p.tree else 0))
        reads = sum(bool(i) for i in x.has_initial_state.tolist())
        total = 2 * x.x.numel() * el + (x.weight.numel() + x.bias.numel()) * el
        total += (reads + p.batch) * state + (x.cache_indices.numel() + x.query_start_loc.numel()) * 4
        return float(total)


# ---- the delta-rule ops -------------------------------------------------------------------------------
_GDN_ID = (
    IdField("b", ("batch",), always=True),
    IdField("t", ("seq_len",), always=True),
    IdField("t", ("draft",), always=True),
    IdField("", ("lens",)),
    IdField("h", ("heads_qk", "heads_v"), always=True),
    IdField("d", ("head_dim_k", "head_dim_v"), always=True),
    IdField("init", ("init",)),
    IdField("pad", ("pad",)),
    IdField("packed", ("packed",)),
    IdField("tree", ("tree",)),
    IdField("scale", ("scale",)),
    IdField("slots", ("state_slots",)),
)


def _pool_region(x: GDNInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(the pool's slots from `pool_base` on (a view), the requests' slots relative to them; padding stays
    negative): what the reference reads, so a pool past 2^31 elements is never copied or converted whole."""
    if not x.pool_base:
        return x.state_pool, x.state_indices
    idx = x.state_indices
    return x.state_pool[x.pool_base :], torch.where(idx >= 0, idx - x.pool_base, idx)


def _id_fields(params: type[Params]) -> tuple[IdField, ...]:
    return tuple(f for f in _GDN_ID if f.fields[0] in params.model_fields)


class _GDNOp(Op):
    family = "gdn"
    # o and states go through head_dim_k-long dot products (S^T k, S^T q): fp32 rounding floor (tolerance.py)
    outputs = {"o": OutputSpec(("token", "head", "dim"), floor_units="head_dim_k")}

    def _bytes_for(self, p: GDNParams, dtype, T: int, B: int, raw_gates: bool) -> int:
        """Bytes of q, k, v (or mixed_qkv, the same), the state pool, slots, o and the gates of T tokens."""
        H, HV, K, V = p.heads_qk, p.heads_v, p.head_dim_k, p.head_dim_v
        pool = tensor_bytes((p.state_slots or _pool_slots(B), HV, K, V), torch.float32)
        total = 2 * tensor_bytes((T, H, K), dtype) + tensor_bytes((T, HV, V), dtype) + pool + 4 * B
        if raw_gates:  # a, b; A_log, dt_bias
            total += 2 * tensor_bytes((T, HV), dtype) + tensor_bytes((HV,), torch.float32) + tensor_bytes((HV,), dtype)
        else:  # g, beta
            total += 2 * tensor_bytes((T, HV), torch.float32)
        return total + output_bytes((T, HV, V), dtype)

    def _qkv(self, p: GDNParams, T: int, dtype, gen, device):
        H, HV, K, V = p.heads_qk, p.heads_v, p.head_dim_k, p.head_dim_v
        return (
            _randn((T, H, K), dtype, gen, device),
            _randn((T, H, K), dtype, gen, device),
            _randn((T, HV, V), dtype, gen, device),
        )

    def _pool(self, p: GDNParams, N: int, gen, device, base: int = 0) -> torch.Tensor:
        """Random states in slots `base..N-1` (the requests' region); the spare slots before it NaN."""
        shape = (p.heads_v, p.head_dim_k, p.head_dim_v)
        region = _randn((N - base, *shape), torch.float32, gen, device, std=0.5)
        if not base:
            return region
        pool = torch.full((N, *shape), float("nan"), dtype=torch.float32, device=device)
        pool[base:] = region
        return pool

    def written_rows(self, p, x: GDNInputs) -> dict[str, int]:
        """A production-size pool (`state_slots`): the expectation covers the slots from `pool_base` on; the
        spare slots before must stay bitwise as they were."""
        return {name: x.pool_base for name in self.writes_for(p)} if x.pool_base else {}

    def _raw_gates(self, p: GDNParams, T: int, dtype, gen, device, edges: bool = True):
        """Raw gates; with `edges`, every 16th `a` (from the 5th) in 20..120: softplus's linear branch and
        beyond float32 exp overflow (the recurrent ops, which fuse the gating; the chunked extend gets its
        g from typical gates)."""
        A_log, dt_bias = _gate_params(p.heads_v, dtype, gen, device)
        a = _randn((T, p.heads_v), torch.float32, gen, device)
        if edges:
            a.view(-1)[5::16] = _rand((a.view(-1)[5::16].numel(),), 20.0, 120.0, gen, device)
        b = _randn((T, p.heads_v), dtype, gen, device, std=1.5)
        return a.to(dtype), b, A_log, dt_bias

    held = {
        "A_log": WEIGHTS,
        "dt_bias": WEIGHTS,
        "cu_seqlens": _LENGTHS,
        "mixed_qkv": "the packed storage of q, k and v (packed decode): the perturbations of those change it",
    }

    def perturbations(self, p: GDNParams) -> tuple[Perturbation, ...]:
        """q, k, v by value; the gates (raw gates, or extend's g and beta; their parameters are held); the
        slots (and extend's initial-state flags) rotated among the requests; verify: a tree's parents
        redrawn (its pool is held, as decode's and extend's, which write it)."""
        perts = [negated("queries", ("q",)), negated("keys", ("k",)), negated("values", ("v",))]
        if self.name == "gdn_extend":
            perts += [Perturbation("gates", ("g", "beta"), _move_gates)]
            perts += [rolled("initial-state flags", ("has_initial_state",))]
        else:
            perts += [negated("raw gates", ("a", "b"))]
        perts.append(rolled("slots", ("state_indices",)))
        if self.name == "gdn_verify" and p.tree:
            perts.append(Perturbation("tree", ("parents",), _regrow))
        return tuple(perts)

    def row_requests(self, p, x: GDNInputs):
        return torch.repeat_interleave(torch.arange(len(x.lens_host)), torch.tensor(x.lens_host))

    def _io_bytes(self, x: GDNInputs) -> int:
        el = x.q.element_size()
        total = (x.q.numel() + x.k.numel() + x.v.numel() + x.o.numel()) * el + x.state_indices.numel() * 4
        for t in (x.a, x.b, x.A_log, x.dt_bias, x.g, x.beta, x.cu_seqlens, x.parents):
            if t is not None:
                total += t.numel() * t.element_size()
        return total


class GDNDecodeOp(_GDNOp):
    """One recurrent step per request over the state pool, gating fused; `packed` reads mixed_qkv."""

    name = "gdn_decode"
    smoke = SmokeSpace(
        space=GDN_SMOKE | {"batch": [3, 6], "pad": [0, 1, 2]},
        held=GDN_HELD,
        seed_ids=["gdn_decode/b5-h2x4-d16x16-packed-bf16"],
    )
    Params = GDNDecodeParams
    id_fields = _id_fields(GDNDecodeParams)
    graph_captured = True  # the replay check (docs/replay.md): batch B from harness/ops/replay_batches.py
    replay_batch = gdn_batch

    def features(self, p: GDNDecodeParams) -> tuple[str, ...]:
        f = [_heads_feature(p), *_dims_features(p)]
        if p.pad:
            f.append("padding")
        if p.packed:
            f.append("packed")
        return tuple(f)

    def writes_for(self, p):
        return {"state_pool": OutputSpec(("slot", "head", "k", "v"), floor_units="head_dim_k")}

    def unspecified(self, p, x: GDNInputs):
        return {"o": (x.state_indices < 0)[:, None, None]} if p.pad else {}

    def input_bytes(self, p: GDNDecodeParams, dtype, seed: int) -> int:
        return self._bytes_for(p, dtype, p.batch, p.batch, raw_gates=True)

    def build_inputs(self, p: GDNDecodeParams, dtype, seed, device) -> GDNInputs:
        host, gen = _generators(seed, device)
        B, H, HV, K, V = p.batch, p.heads_qk, p.heads_v, p.head_dim_k, p.head_dim_v
        N, slots, base = _slots(B, p.pad, host, p.state_slots)
        mixed = None
        if p.packed:
            mixed = _randn((B, 2 * H * K + HV * V), dtype, gen, device)
            q = mixed[:, : H * K].view(B, H, K)
            k = mixed[:, H * K : 2 * H * K].view(B, H, K)
            v = mixed[:, 2 * H * K :].view(B, HV, V)
        else:
            q, k, v = self._qkv(p, B, dtype, gen, device)
        a, b, A_log, dt_bias = self._raw_gates(p, B, dtype, gen, device)
        return GDNInputs(
            q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, mixed_qkv=mixed,
            state_pool=self._pool(p, N, gen, device, base), pool_base=base,
            state_indices=torch.tensor(slots, dtype=torch.int32, device=device),
            o=alloc_output((B, HV, V), dtype, device),
            scale=p.q_scale,
            lens_host=(1,) * B,
        )  # fmt: skip

    def expected(self, p, x: GDNInputs, precision):
        pool, slots = _pool_region(x)
        o, pool = ref.gdn_decode(
            x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, pool, slots, scale=x.scale,
            precision=precision,
        )  # fmt: skip
        return {"o": o, "state_pool": pool}

    def flops(self, p: GDNDecodeParams, x) -> float:
        return 6.0 * p.head_dim_k * p.head_dim_v * p.heads_v * (p.batch - p.pad)

    def bytes(self, p: GDNDecodeParams, x: GDNInputs) -> float:
        state = 4 * p.heads_v * p.head_dim_k * p.head_dim_v
        return float(self._io_bytes(x) + 2 * state * (p.batch - p.pad))


class GDNExtendOp(_GDNOp):
    """Chunked varlen prefill: initial states from the pool (where `has_initial_state`), final states back."""

    name = "gdn_extend"
    smoke = SmokeSpace(
        # seq_len 300: five 64-token chunks, past a 256-token split (state carried and decayed across it)
        space=GDN_SMOKE | {"batch": [1, 5], "seq_len": [1, 3, 64, 150, 300]},
        held=GDN_HELD,
        seed_ids=["gdn_extend/b2-t70-h1x2-d32x16-fp32", "gdn_extend/b2-t70-h1x2-d32x16-initnone-fp32"],
    )
    Params = GDNExtendParams
    id_fields = _id_fields(GDNExtendParams)

    def features(self, p: GDNExtendParams) -> tuple[str, ...]:
        f = [_heads_feature(p), *_dims_features(p)]
        if p.batch > 1:
            f.append("varlen")
        if p.lens == "mixed":
            f.append("mixed-lens")
        if p.init != "all":
            f.append(f"init-{p.init}")
        if p.seq_len >= 8192:
            f.append("long")
        return tuple(f)

    def writes_for(self, p):
        return {"state_pool": OutputSpec(("slot", "head", "k", "v"), floor_units="head_dim_k")}

    def input_bytes(self, p: GDNExtendParams, dtype, seed: int) -> int:
        host, _ = _generators(seed, None)
        B, T = p.batch, sum(_lengths(p.batch, p.seq_len, p.lens, host))
        return self._bytes_for(p, dtype, T, B, raw_gates=False) + 4 * (B + 1) + B  # cu_seqlens, has_initial

    def build_inputs(self, p: GDNExtendParams, dtype, seed, device) -> GDNInputs:
        host, gen = _generators(seed, device)
        B = p.batch
        lens = _lengths(B, p.seq_len, p.lens, host)
        init = _initial(B, p.init, host)
        N, slots, base = _slots(B, 0, host, p.state_slots)
        T = sum(lens)
        q, k, v = self._qkv(p, T, dtype, gen, device)
        a, b, A_log, dt_bias = self._raw_gates(p, T, dtype, gen, device, edges=False)
        g, beta = ref.gating(A_log, a, dt_bias, b)  # the fp32 gates gdn_gating makes, from raw inputs
        cu = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32)
        return GDNInputs(
            q=q, k=k, v=v, g=g.float(), beta=beta.float(),
            state_pool=self._pool(p, N, gen, device, base), pool_base=base,
            state_indices=torch.tensor(slots, dtype=torch.int32, device=device),
            cu_seqlens=cu.to(device),
            has_initial_state=torch.tensor(init, dtype=torch.bool, device=device),
            o=alloc_output((T, p.heads_v, p.head_dim_v), dtype, device),
            scale=p.q_scale,
            lens_host=tuple(lens),
        )  # fmt: skip

    def expected(self, p, x: GDNInputs, precision):
        pool, slots = _pool_region(x)
        o, pool = ref.gdn_extend(
            x.q, x.k, x.v, x.g, x.beta, pool, slots, x.cu_seqlens, x.has_initial_state,
            scale=x.scale, precision=precision,
        )  # fmt: skip
        return {"o": o, "state_pool": pool}

    def flops(self, p: GDNExtendParams, x: GDNInputs) -> float:
        K, V = p.head_dim_k, p.head_dim_v
        total = 0.0
        for n_req in x.lens_host:
            full, rest = divmod(n_req, CHUNK)
            for n, count in ((CHUNK, full), (rest, 1 if rest else 0)):
                total += count * (6.0 * n * K * V + 4.0 * n * n * (K + V) + n**3 / 3.0)
        return total * p.heads_v

    def bytes(self, p: GDNExtendParams, x: GDNInputs) -> float:
        state = 4 * p.heads_v * p.head_dim_k * p.head_dim_v
        reads = sum(bool(i) for i in x.has_initial_state.tolist())
        return float(self._io_bytes(x) + state * (reads + p.batch))


class GDNVerifyOp(_GDNOp):
    """Target verify: `draft` tokens per request, the state after every step kept, the pool untouched."""

    name = "gdn_verify"
    smoke = SmokeSpace(space=GDN_SMOKE | {"batch": [2, 5], "draft": [1, 3, 8], "pad": [0, 1]}, held=GDN_HELD)
    Params = GDNVerifyParams
    id_fields = _id_fields(GDNVerifyParams)
    graph_captured = True  # the replay check (docs/replay.md): batch B from harness/ops/replay_batches.py
    replay_batch = gdn_batch
    outputs = {
        "o": OutputSpec(("token", "head", "dim"), floor_units="head_dim_k"),
        "inter_states": OutputSpec(("request", "step", "head", "k", "v"), floor_units="head_dim_k"),
    }
    held = _GDNOp.held | {
        "state_pool": "the state pool decode and extend write: a backend may hold it in its own layout from "
        "prepare on (SGLang's and FlashInfer's [N, HV, V, K]), and verify only reads it"
    }

    def features(self, p: GDNVerifyParams) -> tuple[str, ...]:
        f = [_heads_feature(p), *_dims_features(p), "tree" if p.tree else "chain"]
        if p.pad:
            f.append("padding")
        return tuple(f)

    def unspecified(self, p, x: GDNInputs):
        if not p.pad:
            return {}
        pad = x.state_indices < 0
        return {
            "o": pad.repeat_interleave(p.draft)[:, None, None],
            "inter_states": pad[:, None, None, None, None],
        }

    def input_bytes(self, p: GDNVerifyParams, dtype, seed: int) -> int:
        B, T = p.batch, p.draft
        states = output_bytes((B, T, p.heads_v, p.head_dim_k, p.head_dim_v), torch.float32)
        return self._bytes_for(p, dtype, B * T, B, raw_gates=True) + states + (4 * B * T if p.tree else 0)

    def build_inputs(self, p: GDNVerifyParams, dtype, seed, device) -> GDNInputs:
        host, gen = _generators(seed, device)
        B, T, HV, K, V = p.batch, p.draft, p.heads_v, p.head_dim_k, p.head_dim_v
        N, slots, base = _slots(B, p.pad, host, p.state_slots)
        q, k, v = self._qkv(p, B * T, dtype, gen, device)
        a, b, A_log, dt_bias = self._raw_gates(p, B * T, dtype, gen, device)
        parents = _tree_parents(B, T, host).to(device) if p.tree else None
        return GDNInputs(
            q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, parents=parents,
            state_pool=self._pool(p, N, gen, device, base), pool_base=base,
            state_indices=torch.tensor(slots, dtype=torch.int32, device=device),
            o=alloc_output((B * T, HV, V), dtype, device),
            inter_states=alloc_output((B, T, HV, K, V), torch.float32, device),
            scale=p.q_scale,
            lens_host=(T,) * B,
        )  # fmt: skip

    def expected(self, p: GDNVerifyParams, x: GDNInputs, precision):
        B, T = p.batch, p.draft

        def per_request(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, T, *t.shape[1:])

        o, states = ref.gdn_verify(
            per_request(x.q), per_request(x.k), per_request(x.v), per_request(x.a), per_request(x.b),
            x.A_log, x.dt_bias, *_pool_region(x), x.parents, scale=x.scale, precision=precision,
        )  # fmt: skip
        return {"o": o.flatten(0, 1), "inter_states": states}

    def flops(self, p: GDNVerifyParams, x) -> float:
        return 6.0 * p.head_dim_k * p.head_dim_v * p.heads_v * p.draft * (p.batch - p.pad)

    def bytes(self, p: GDNVerifyParams, x: GDNInputs) -> float:
        state = 4 * p.heads_v * p.head_dim_k * p.head_dim_v
        return float(self._io_bytes(x) + state * (1 + p.draft) * (p.batch - p.pad))


class GDNCommitOp(Op):
    """Speculative commit: the recurrent state and conv window after each request's last accepted draft
    token, from the verify buffers into the request's pool slots.

    Its own op, not a mode of gdn_verify or causal_conv1d: it writes both pools (the recurrent state and
    the conv window of one slot) from both verify outputs in one launch and reads neither q/k/v nor x,
    as a serving engine does after judging the draft (SGLang's update_mamba_state_after_mtp_verify);
    as a mode it would carry the other op's inputs and be timed with them.

    Contract (inputs: `CommitInputs`): `last_accepted [B]` int32 is the draft index of the last
    accepted token, for a chain its accepted length minus 1, for a tree the node ending the accepted
    path (its ancestors are the rest of the path; verify's buffers already follow the parents, so the
    commit needs no parents); -1 = none accepted. Slot `state_indices[b]` (the same slot in both pools)
    gets `inter_states[b, last]` `[HV, K, V]` fp32 and `inter_conv_windows[b, last]` `[dim, W-1]` (case
    dtype), both bit-exact copies. A request with no accepted token, a padding request (slot -1,
    whatever its `last_accepted`), spare slots, and every other draft step leave no trace: those pool
    elements stay bitwise as they were.
    """

    name = "gdn_commit"
    smoke = SmokeSpace(
        space={"batch": [1, 3, 5], "draft": [1, 3, 8], "heads_v": [2, 3],
               "head_dim_k,head_dim_v": [(16, 16), (32, 16)], "dim": [40, 48, 130], "width": [2, 3, 4],
               "pad": [0, 1], "dtype": ["bf16", "fp16", "fp32"]},
    )  # fmt: skip
    family = "gdn"
    preset_key = "gdn_commit"
    Params = GDNCommitParams
    id_fields = (
        IdField("b", ("batch",), always=True),
        IdField("t", ("draft",), always=True),
        IdField("h", ("heads_v",), always=True),
        IdField("d", ("head_dim_k", "head_dim_v"), always=True),
        IdField("c", ("dim",), always=True),
        IdField("w", ("width",)),
        IdField("pad", ("pad",)),
        IdField("accept", ("accept",)),
    )
    outputs: dict[str, OutputSpec] = {}  # only the pools are written

    def features(self, p: GDNCommitParams) -> tuple[str, ...]:
        f = [f"accept-{p.accept}"]
        if p.pad:
            f.append("padding")
        if p.width != 4:
            f.append(f"width{p.width}")
        return tuple(f)

    def writes_for(self, p):
        return {
            "state_pool": OutputSpec(("slot", "head", "k", "v"), exact=True),
            "conv_states": OutputSpec(("slot", "channel", "tap"), exact=True),
        }

    def input_bytes(self, p: GDNCommitParams, dtype, seed: int) -> int:
        B, T, HV, K, V, D, W = p.batch, p.draft, p.heads_v, p.head_dim_k, p.head_dim_v, p.dim, p.width
        N = _pool_slots(B)
        states = tensor_bytes((B, T, HV, K, V), torch.float32) + tensor_bytes((N, HV, K, V), torch.float32)
        windows = tensor_bytes((B, T, D, W - 1), dtype) + tensor_bytes((N, D, W - 1), dtype)
        return states + windows + 4 * B + 4 * B  # last_accepted, state_indices

    def build_inputs(self, p: GDNCommitParams, dtype, seed, device) -> CommitInputs:
        host, gen = _generators(seed, device)
        B, T, HV, K, V, D, W = p.batch, p.draft, p.heads_v, p.head_dim_k, p.head_dim_v, p.dim, p.width
        N, slots, _ = _slots(B, p.pad, host)
        if p.accept == "mixed":  # 0..T accepted tokens per request (padding requests too: to be ignored)
            last = torch.randint(-1, T, (B,), generator=host, dtype=torch.int32)
        else:
            last = torch.full((B,), -1 if p.accept == "none" else T - 1, dtype=torch.int32)
        return CommitInputs(
            inter_states=_randn((B, T, HV, K, V), torch.float32, gen, device, std=0.5),
            inter_conv_windows=_randn((B, T, D, W - 1), dtype, gen, device),
            last_accepted=last.to(device),
            state_pool=_randn((N, HV, K, V), torch.float32, gen, device, std=0.5),
            conv_states=_randn((N, D, W - 1), dtype, gen, device),
            state_indices=torch.tensor(slots, dtype=torch.int32, device=device),
        )

    def expected(self, p, x: CommitInputs, precision):
        pool, conv = ref.gdn_commit(
            x.inter_states, x.inter_conv_windows, x.last_accepted, x.state_pool, x.conv_states, x.state_indices
        )
        return {"state_pool": pool, "conv_states": conv}

    def perturbations(self, p: GDNCommitParams) -> tuple[Perturbation, ...]:
        """The verify buffers by value; the accepted tokens and the slots rotated among the requests."""
        return (
            negated("intermediate states", ("inter_states",)),
            negated("conv windows", ("inter_conv_windows",)),
            rolled("accepted tokens", ("last_accepted",)),
            rolled("slots", ("state_indices",)),
        )

    def bytes(self, p: GDNCommitParams, x: CommitInputs) -> float:
        state = 4 * p.heads_v * p.head_dim_k * p.head_dim_v + p.dim * (p.width - 1) * x.conv_states.element_size()
        moved = int(((x.state_indices >= 0) & (x.last_accepted >= 0)).sum())
        return float(2 * state * moved + 8 * p.batch)


GDN_OPS = (GDNGatingOp(), CausalConv1dOp(), GDNDecodeOp(), GDNExtendOp(), GDNVerifyOp(), GDNCommitOp())
