"""`gdn_chain`: one GDN state pool, several ops, each run by a chosen backend (docs/chain.md).

A server runs extend, decode, verify and commit on one `ssm_states` pool with different kernels
(SGLang's hybrid backend: FlashInfer extend, CuTe DSL decode, Triton verify), each addressing the same
memory in its own layout. The per-op cases hand every backend the canonical pool and convert it back
after the call, so a layout disagreement between two kernels never shows. A chain case names its steps
(`OP@BACKEND > OP@BACKEND ...`, in order), the pool's layout (`kv` `[N, HV, K, V]` or `vk` `[N, HV, V, K]`) and how the
pool reaches a step whose backend declares another layout (`handoff`): `convert` (the chain converts it
and back, explicitly, and records it) or `raw` (the memory as it is, as a server that shares the pool
without converting does). The runner is the `chain` backend (kernels/chain.py); this contract says what
every step must leave behind, computed by the float64 references in sequence.

Contract (inputs: `ChainInputs`): `batch` requests with shuffled slots in a pool of ~12% spare slots
(spare slots stay bitwise untouched), `pad` of them padding (slot -1) in decode, verify and commit
(extend packs the real ones). Per step, its own tokens (q, k, v raw; raw gates for decode and verify,
extend's fp32 g and beta made from raw gates) and one layer's gate weights (A_log, dt_bias) shared by
every step:

- gdn_extend: `seq_len` tokens for the longest request (mixed lengths), some requests fresh (no initial
  state: their slot is cleared first), final states into the pool.
- gdn_decode: one token per request, the pool updated.
- gdn_verify: `draft` tokens per request (a chain), the state after every token, the pool untouched.
- gdn_commit (directly after a verify): per request the state after its last accepted token (random,
  -1 = none) from that verify's `inter_states` (the verify backend's, as it wrote them) into its slot,
  and a conv window (random, the chain has no conv step) into the conv pool.

Outputs, checked after every step i (1-based): `o@i` (decode, extend, verify), `inter_states@i`
(verify), and `state_pool@i`, the canonical pool after the step; the final pools are the written inputs
`state_pool` and `conv_states`. Each step's expectation starts from the previous step's float64 result
(the twin from its own), so an error is charged to the step that made it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field, field_validator, model_validator

from attnbench.buffers import alloc_output, output_bytes
from attnbench.ops.base import WEIGHTS, IdField, Op, OutputSpec, Params, SmokeSpace, tensor_bytes
from attnbench.ops.gdn.inputs import _gate_params, _generators, _initial, _lengths, _rand, _randn, _slots
from attnbench.ops.gdn.params import GDNCommitParams, GDNDecodeParams, GDNExtendParams, GDNVerifyParams
from attnbench.references import gdn as ref

CHAIN_OPS = ("gdn_extend", "gdn_decode", "gdn_verify", "gdn_commit")
_SHORT = {op: op.removeprefix("gdn_") for op in CHAIN_OPS}
_BACKEND = re.compile(r"[A-Za-z0-9_]+(-[A-Za-z0-9_]+)*")
CONV_WIDTH = 4


def parse_step(step: str) -> tuple[str, str]:
    """`"gdn_decode@sglang-cute"` (or `"decode@sglang-cute"`) -> ("gdn_decode", "sglang-cute")."""
    op, at, backend = step.partition("@")
    op = op if op.startswith("gdn_") else f"gdn_{op}"
    if not at or op not in CHAIN_OPS or not _BACKEND.fullmatch(backend):
        raise ValueError(
            f"step {step!r}: write OP@BACKEND, OP one of {', '.join(CHAIN_OPS)}, BACKEND a registered name "
            "(letters, digits, '_' and '-'; no knob variants)"
        )
    return op, backend


class ChainParams(Params):
    steps: str = Field(
        "gdn_extend@torch > gdn_decode@torch > gdn_verify@torch > gdn_commit@torch",
        description="the ops in order, each OP@BACKEND, separated by '>' (OP: gdn_extend, gdn_decode, gdn_verify, "
        "gdn_commit, or without the gdn_ prefix)",
    )
    layout: Literal["kv", "vk"] = Field("kv", description="the pool's layout: kv [N, HV, K, V] or vk [N, HV, V, K]")
    handoff: Literal["convert", "raw"] = Field(
        "convert",
        description="a step whose backend declares another layout gets the pool converted (and back), or the "
        "memory as it is (raw: what a server sharing the pool without converting does)",
    )
    batch: int = Field(4, ge=1)
    heads_qk: int = Field(2, ge=1)
    heads_v: int = Field(4, ge=1)
    head_dim_k: int = Field(32, ge=1)
    head_dim_v: int = Field(32, ge=1)
    seq_len: int = Field(40, ge=1, description="extend: tokens of the longest request (mixed lengths)")
    draft: int = Field(3, ge=1, description="verify: draft tokens per request")
    pad: int = Field(0, ge=0, description="padding requests (slot -1) in decode, verify and commit")

    @field_validator("steps")
    @classmethod
    def _full_names(cls, steps: str) -> str:
        """One spelling per chain: `decode@x>verify@y` and `gdn_decode@x > gdn_verify@y` are one case."""
        return " > ".join("@".join(parse_step(s.strip())) for s in steps.split(">"))

    @model_validator(mode="after")
    def _valid(self):
        parsed = self.parsed
        for i, (op, _) in enumerate(parsed):
            if op == "gdn_commit" and (i == 0 or parsed[i - 1][0] != "gdn_verify"):
                raise ValueError(f"step {i + 1} ({op}@{parsed[i][1]}): a commit directly follows a verify")
        if self.heads_v % self.heads_qk:
            raise ValueError(f"heads_v ({self.heads_v}) must be a multiple of heads_qk ({self.heads_qk})")
        if self.pad >= self.batch:
            raise ValueError(f"pad ({self.pad}) must leave at least one real request of batch {self.batch}")
        return self

    @property
    def parsed(self) -> list[tuple[str, str]]:
        return [parse_step(s.strip()) for s in self.steps.split(">")]

    @property
    def conv_dim(self) -> int:
        return 2 * self.heads_qk * self.head_dim_k + self.heads_v * self.head_dim_v


@dataclass
class ChainInputs:
    """The pools and every step's inputs. `steps[i]` is a dict of step i+1's fields (GDNInputs' or
    CommitInputs' names, pool aside) plus `pool_after`, the buffer its `state_pool@{i+1}` lands in.
    `x.o@2` style names (`getattr(x, "o@2")`) reach a step's output buffers."""

    state_pool: torch.Tensor  # [N, HV, K, V] fp32, written (the pool before the chain, after it)
    conv_states: torch.Tensor  # [N, dim, W-1] case dtype, written by commit
    A_log: torch.Tensor  # [HV] fp32, the layer's
    dt_bias: torch.Tensor  # [HV] case dtype
    steps: tuple[dict[str, Any], ...]

    def __getattr__(self, name: str):
        field, at, i = name.partition("@")
        if not at or name.startswith("__") or not i.isdigit():
            raise AttributeError(name)
        step = self.__dict__["steps"][int(i) - 1]
        return step["pool_after" if field == "state_pool" else field]


def _plan(p: ChainParams, seed: int) -> dict[str, Any]:
    """Every host-side draw (slots, extend lengths and fresh requests, accepted tokens), from the seed."""
    host, _ = _generators(seed, None)
    N, slots, _ = _slots(p.batch, p.pad, host)
    real = sum(s >= 0 for s in slots)
    per_step = []
    for op, _ in p.parsed:
        if op == "gdn_extend":
            per_step.append({"lens": _lengths(real, p.seq_len, "mixed", host), "init": _initial(real, "mixed", host)})
        elif op == "gdn_commit":
            per_step.append({"last": torch.randint(-1, p.draft, (p.batch,), generator=host, dtype=torch.int32)})
        else:
            per_step.append({})
    return {"N": N, "slots": slots, "steps": per_step}


def _tokens(op: str, p: ChainParams, plan: dict, step: dict) -> int:
    return {"gdn_extend": sum(step.get("lens", ())), "gdn_decode": p.batch, "gdn_verify": p.batch * p.draft}.get(op, 0)


class GDNChainOp(Op):
    """A sequence of GDN ops over one state pool, each by the backend the case names (module docstring)."""

    name = "gdn_chain"
    family = "gdn"
    Params = ChainParams
    id_fields = (
        IdField("b", ("batch",), always=True),
        IdField("h", ("heads_qk", "heads_v"), always=True),
        IdField("d", ("head_dim_k", "head_dim_v"), always=True),
        IdField("t", ("seq_len",)),
        IdField("draft", ("draft",)),
        IdField("pad", ("pad",)),
        IdField("", ("layout",), always=True),
        IdField("", ("handoff",), always=True),
    )
    outputs: dict[str, OutputSpec] = {}  # per case: `outputs_for`
    held = {"A_log": WEIGHTS, "dt_bias": WEIGHTS}
    smoke = SmokeSpace(
        # chains of torch steps (smoke runs on a CPU): every op after a pool-writing one, a decode after a commit
        # (steps as ChainParams spells them: the pairs are compared with the cases' values)
        space={"steps": ["gdn_extend@torch > gdn_decode@torch > gdn_verify@torch > gdn_commit@torch > gdn_decode@torch",
                         "gdn_decode@torch > gdn_extend@torch > gdn_verify@torch > gdn_decode@torch"],
               "heads_qk,heads_v": [(2, 2), (1, 4)], "head_dim_k,head_dim_v": [(16, 16), (32, 16)],
               "batch": [3, 5], "seq_len": [9, 70], "draft": [1, 3], "pad": [0, 1], "dtype": ["bf16", "fp32"]},
        held={"handoff": ("convert", "raw hands a step memory in a layout its backend does not declare: a designed "
                                     "failure of torch's steps on a vk pool (tests/kernels/test_gdn_chain.py)")},
    )  # fmt: skip

    # ---- ids: the scalar fields, then one token per step (`decode@sglang.cute`: '-' would split the id)
    def id_tokens(self, p: ChainParams) -> list[str]:
        steps = [f"{_SHORT[op]}@{backend.replace('-', '.')}" for op, backend in p.parsed]
        return [*super().id_tokens(p), *steps]

    def parse_id_tokens(self, tokens: list[str]) -> dict[str, Any]:
        steps = " > ".join(t.replace(".", "-") for t in tokens if "@" in t)
        out = super().parse_id_tokens([t for t in tokens if "@" not in t])
        return out | ({"steps": steps} if steps else {})

    def features(self, p: ChainParams) -> tuple[str, ...]:
        f = [f"pool-{p.layout}", f"handoff-{p.handoff}", f"{len(p.parsed)}-steps"]
        if len({b for _, b in p.parsed}) > 1:
            f.append("mixed-backends")
        if p.pad:
            f.append("padding")
        return tuple(f)

    def outputs_for(self, p: ChainParams) -> dict[str, OutputSpec]:
        out = {}
        for i, (op, _) in enumerate(p.parsed, 1):
            if op in ("gdn_decode", "gdn_extend", "gdn_verify"):
                rows = "request" if op == "gdn_decode" else "row"
                out[f"o@{i}"] = OutputSpec((rows, "head", "dim"), floor_units="head_dim_k")
            if op == "gdn_verify":
                out[f"inter_states@{i}"] = OutputSpec(("request", "step", "head", "k", "v"), floor_units="head_dim_k")
            out[f"state_pool@{i}"] = OutputSpec(("slot", "head", "k", "v"), floor_units="head_dim_k")
        return out

    def writes_for(self, p: ChainParams) -> dict[str, OutputSpec]:
        w = {"state_pool": OutputSpec(("slot", "head", "k", "v"), floor_units="head_dim_k")}
        if any(op == "gdn_commit" for op, _ in p.parsed):
            w["conv_states"] = OutputSpec(("slot", "channel", "tap"), exact=True)
        return w

    def unspecified(self, p: ChainParams, x: ChainInputs):
        if not p.pad:
            return {}
        out = {}
        for i, (op, _) in enumerate(p.parsed, 1):
            pad = x.steps[i - 1]["state_indices"] < 0
            if op == "gdn_decode":
                out[f"o@{i}"] = pad[:, None, None]
            elif op == "gdn_verify":
                out[f"o@{i}"] = pad.repeat_interleave(p.draft)[:, None, None]
                out[f"inter_states@{i}"] = pad[:, None, None, None, None]
        return out

    def perturbations(self, p: ChainParams):
        """None: every step's inputs are each op's, whose own cases perturb them (the chain checks the
        hand-offs of the pool); the pool is written, the gate weights held."""
        return ()

    def step_params(self, p: ChainParams, seed: int = 0) -> list[tuple[str, str, Params]]:
        """(op, backend, the op's parameters) of every step: the case each step's backend is asked about
        (its declared limits) and prepared with."""
        shape = {"heads_qk": p.heads_qk, "heads_v": p.heads_v, "head_dim_k": p.head_dim_k, "head_dim_v": p.head_dim_v}
        real = p.batch - p.pad
        made = {
            "gdn_extend": lambda: GDNExtendParams(batch=real, seq_len=p.seq_len, lens="mixed", init="mixed", **shape),
            "gdn_decode": lambda: GDNDecodeParams(batch=p.batch, pad=p.pad, **shape),
            "gdn_verify": lambda: GDNVerifyParams(batch=p.batch, draft=p.draft, pad=p.pad, **shape),
            "gdn_commit": lambda: GDNCommitParams(
                batch=p.batch, draft=p.draft, heads_v=p.heads_v, head_dim_k=p.head_dim_k, head_dim_v=p.head_dim_v,
                dim=p.conv_dim, width=CONV_WIDTH, pad=p.pad,
            ),
        }  # fmt: skip
        return [(op, backend, made[op]()) for op, backend in p.parsed]

    # ---- inputs ----------------------------------------------------------------------------------
    def input_bytes(self, p: ChainParams, dtype, seed: int) -> int:
        plan = _plan(p, seed)
        B, H, HV, K, V, N = p.batch, p.heads_qk, p.heads_v, p.head_dim_k, p.head_dim_v, plan["N"]
        el = dtype.itemsize
        total = tensor_bytes((N, HV, K, V), torch.float32) + tensor_bytes((N, p.conv_dim, CONV_WIDTH - 1), dtype)
        total += tensor_bytes((HV,), torch.float32) + tensor_bytes((HV,), dtype)
        for (op, _), step in zip(p.parsed, plan["steps"]):
            total += output_bytes((N, HV, K, V), torch.float32)  # pool_after
            if op == "gdn_commit":
                total += tensor_bytes((B, p.draft, p.conv_dim, CONV_WIDTH - 1), dtype) + 8 * B
                continue
            T = _tokens(op, p, plan, step)
            nb = len(step["lens"]) if op == "gdn_extend" else B
            total += (2 * T * H * K + T * HV * V) * el + output_bytes((T, HV, V), dtype) + 4 * nb
            if op == "gdn_extend":
                total += 2 * T * HV * 4 + 4 * (nb + 1) + nb  # g, beta; cu_seqlens; has_initial_state
            else:
                total += 2 * T * HV * el  # raw gates
            if op == "gdn_verify":
                total += output_bytes((B, p.draft, HV, K, V), torch.float32)
        return total

    def build_inputs(self, p: ChainParams, dtype, seed, device) -> ChainInputs:
        plan = _plan(p, seed)
        _, gen = _generators(seed, device)
        B, H, HV, K, V, N = p.batch, p.heads_qk, p.heads_v, p.head_dim_k, p.head_dim_v, plan["N"]
        slots = torch.tensor(plan["slots"], dtype=torch.int32, device=device)
        real = slots[slots >= 0].clone()
        A_log, dt_bias = _gate_params(HV, dtype, gen, device)
        pool = _randn((N, HV, K, V), torch.float32, gen, device, std=0.5)
        conv = _randn((N, p.conv_dim, CONV_WIDTH - 1), dtype, gen, device)

        def raw_gates(T: int, edges: bool):
            a = _randn((T, HV), torch.float32, gen, device)
            if edges:  # softplus's linear branch and beyond float32 exp overflow (ops/gdn/delta.py `_raw_gates`)
                a.view(-1)[5::16] = _rand((a.view(-1)[5::16].numel(),), 20.0, 120.0, gen, device)
            return a.to(dtype), _randn((T, HV), dtype, gen, device, std=1.5)

        steps = []
        for (op, _), drawn in zip(p.parsed, plan["steps"]):
            d: dict[str, Any] = {"pool_after": alloc_output((N, HV, K, V), torch.float32, device)}
            if op == "gdn_commit":
                d |= {
                    "inter_conv_windows": _randn((B, p.draft, p.conv_dim, CONV_WIDTH - 1), dtype, gen, device),
                    "last_accepted": drawn["last"].to(device),
                    "state_indices": slots.clone(),
                }
                steps.append(d)
                continue
            T = _tokens(op, p, plan, drawn)
            d |= {
                "q": _randn((T, H, K), dtype, gen, device),
                "k": _randn((T, H, K), dtype, gen, device),
                "v": _randn((T, HV, V), dtype, gen, device),
                "o": alloc_output((T, HV, V), dtype, device),
                "scale": K**-0.5,
            }
            a, b = raw_gates(T, edges=op != "gdn_extend")
            if op == "gdn_extend":
                g, beta = ref.gating(A_log, a, dt_bias, b)
                lens = drawn["lens"]
                d |= {
                    "g": g.float(), "beta": beta.float(), "state_indices": real.clone(),
                    "cu_seqlens": torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32).to(device),
                    "has_initial_state": torch.tensor(drawn["init"], dtype=torch.bool, device=device),
                    "lens_host": tuple(lens),
                }  # fmt: skip
            else:
                d |= {"a": a, "b": b, "state_indices": slots.clone()}
                d["lens_host"] = (1,) * B if op == "gdn_decode" else (p.draft,) * B
            if op == "gdn_verify":
                d["inter_states"] = alloc_output((B, p.draft, HV, K, V), torch.float32, device)
            steps.append(d)
        return ChainInputs(state_pool=pool, conv_states=conv, A_log=A_log, dt_bias=dt_bias, steps=tuple(steps))

    # ---- expectations: the references in sequence ----------------------------------------------------
    def expected(self, p: ChainParams, x: ChainInputs, precision):
        pool, conv, states = x.state_pool, x.conv_states, None
        out: dict[str, torch.Tensor] = {}
        B, T = p.batch, p.draft
        for i, ((op, _), d) in enumerate(zip(p.parsed, x.steps), 1):
            if op == "gdn_extend":
                out[f"o@{i}"], pool = ref.gdn_extend(
                    d["q"], d["k"], d["v"], d["g"], d["beta"], pool, d["state_indices"], d["cu_seqlens"],
                    d["has_initial_state"], scale=d["scale"], precision=precision,
                )  # fmt: skip
            elif op == "gdn_decode":
                out[f"o@{i}"], pool = ref.gdn_decode(
                    d["q"], d["k"], d["v"], d["a"], d["b"], x.A_log, x.dt_bias, pool, d["state_indices"],
                    scale=d["scale"], precision=precision,
                )  # fmt: skip
            elif op == "gdn_verify":

                def per_request(t: torch.Tensor) -> torch.Tensor:
                    return t.view(B, T, *t.shape[1:])

                o, states = ref.gdn_verify(
                    *(per_request(d[n]) for n in ("q", "k", "v", "a", "b")), x.A_log, x.dt_bias, pool,
                    d["state_indices"], None, scale=d["scale"], precision=precision,
                )  # fmt: skip
                out[f"o@{i}"], out[f"inter_states@{i}"] = o.flatten(0, 1), states
            else:
                pool, conv = ref.gdn_commit(
                    states, d["inter_conv_windows"], d["last_accepted"], pool, conv, d["state_indices"]
                )
            out[f"state_pool@{i}"] = pool
        out["state_pool"] = pool
        if "conv_states" in self.writes_for(p):
            out["conv_states"] = conv
        return out
