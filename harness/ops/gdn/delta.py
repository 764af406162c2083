"""The delta-rule ops `gdn_decode`, `gdn_extend` and `gdn_verify`, their shared contract and smoke space."""

from __future__ import annotations

import torch

from attnbench.buffers import alloc_output, output_bytes
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
from attnbench.ops.gdn.inputs import (
    _LENGTHS,
    GDNInputs,
    _gate_params,
    _generators,
    _initial,
    _lengths,
    _pool_slots,
    _rand,
    _randn,
    _regrow,
    _slots,
    _tree_parents,
)
from attnbench.ops.gdn.params import (
    GDNDecodeParams,
    GDNExtendParams,
    GDNParams,
    GDNVerifyParams,
)
from attnbench.ops.replay_batches import gdn_batch
from attnbench.references import gdn as ref

CHUNK = 64  # the chunk size the gdn_extend cost model counts


def _heads_feature(p: GDNParams) -> str:
    return "gva" if p.heads_v > p.heads_qk else "hv=h"


def _dims_features(p: GDNParams) -> list[str]:
    f = []
    if p.head_dim_k != p.head_dim_v:
        f.append("k!=v")
    if p.head_dim_k not in (64, 128, 256) or p.head_dim_v not in (64, 128, 256):
        f.append("odd-dim")
    return f


def _move_gates(p, x) -> None:
    """Log decays halved (still < 0), beta -> 1 - beta (still in (0, 1))."""
    x.g.mul_(0.5)
    x.beta.copy_(1.0 - x.beta)


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
