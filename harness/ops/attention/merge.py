"""`merge_state`: merge two partial attention states (output, LSE) over disjoint key sets."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from pydantic import Field

from attnbench.buffers import alloc_output, output_bytes
from attnbench.ops.attention.inputs import _generators
from attnbench.ops.base import (
    IdField,
    Op,
    OutputSpec,
    Params,
    Perturbation,
    SmokeSpace,
    magnitude_key,
    negated,
    tensor_bytes,
)
from attnbench.ops.distributions import Distribution, Sampler, lse_like
from attnbench.references import attention as ref


class MergeStateParams(Params):
    tokens: int = Field(256, ge=1)
    heads: int = Field(8, ge=1)
    head_dim: int = Field(128, ge=1)
    empty: bool = Field(False, description="some states empty (lse -inf) on one or both sides")
    distribution: Distribution = Field("normal", description="values and LSEs: see harness/ops/distributions.py")


@dataclass
class MergeStateInputs:
    v_a: torch.Tensor  # [T, H, D] case dtype
    s_a: torch.Tensor  # [T, H] fp32, natural-log LSE (-inf = empty)
    v_b: torch.Tensor
    s_b: torch.Tensor
    o: torch.Tensor  # [T, H, D] output
    lse: torch.Tensor  # [T, H] fp32 output


def _shift_lses(p, x: MergeStateInputs) -> None:
    x.s_a.add_(1.0)
    x.s_b.sub_(1.0)


class MergeStateOp(Op):
    """Merge two partial (output, LSE) states over disjoint key sets (split-KV / cascade)."""

    name = "merge_state"
    smoke = SmokeSpace(
        space={"tokens": [17, 33], "heads": [2, 4], "head_dim": [32, 64], "dtype": ["bf16", "fp16", "fp32"]},
        seeds=[
            {"tokens": 33, "heads": 4, "head_dim": 64, "dtype": "fp32"},
            {"tokens": 33, "heads": 4, "head_dim": 64, "dtype": "bf16"},
            {"tokens": 17, "heads": 2, "head_dim": 32, "distribution": "peaked", "dtype": "bf16"},
        ],
    )
    family = "attention"
    Params = MergeStateParams
    id_fields = (
        IdField("t", ("tokens",), always=True),
        IdField("h", ("heads",), always=True),
        IdField("d", ("head_dim",), always=True),
        IdField("empty", ("empty",)),
        IdField("", ("distribution",)),
    )
    outputs = {"o": OutputSpec(("token", "head", "dim"), magnitude=True), "lse": OutputSpec(("token", "head"))}

    def features(self, p: MergeStateParams) -> tuple[str, ...]:
        return (("empty-states",) if p.empty else ()) + (
            (f"dist-{p.distribution}",) if p.distribution != "normal" else ()
        )

    def build_inputs(self, p: MergeStateParams, dtype, seed, device) -> MergeStateInputs:
        _, gen = _generators(seed, device)
        T, H, D = p.tokens, p.heads, p.head_dim
        draw = Sampler(p.distribution, gen, device, dtype)
        v_a, v_b = draw.draw("v", (T, H, D)).to(dtype), draw.draw("v", (T, H, D)).to(dtype)
        s_a, s_b = lse_like(p.distribution, (T, H), gen, device)
        if p.empty:  # a quarter of rows: a empty; an eighth: b empty; one in sixteen: both
            t = torch.arange(T, device=device)
            s_a[t % 4 == 1] = -math.inf
            s_b[t % 8 == 2] = -math.inf
            s_a[t % 16 == 3] = s_b[t % 16 == 3] = -math.inf
        return MergeStateInputs(
            v_a, s_a, v_b, s_b, alloc_output((T, H, D), dtype, device), alloc_output((T, H), torch.float32, device)
        )

    def input_bytes(self, p: MergeStateParams, dtype, seed: int) -> int:
        T, H, D = p.tokens, p.heads, p.head_dim
        values = 2 * tensor_bytes((T, H, D), dtype) + 2 * tensor_bytes((T, H), torch.float32)
        return values + output_bytes((T, H, D), dtype) + output_bytes((T, H), torch.float32)

    def expected(self, p, x: MergeStateInputs, precision):
        o, lse, *mag = ref.merge_state(x.v_a, x.s_a, x.v_b, x.s_b, precision, magnitude=precision == torch.float64)
        return {"o": o, "lse": lse} | {magnitude_key("o"): m for m in mag}

    def subset(self, p, x: MergeStateInputs, order: list[int]):
        rows = torch.tensor(order, device=x.v_a.device)
        fresh = dict(o=alloc_output((len(order), *x.o.shape[1:]), x.o.dtype, x.o.device),
                     lse=alloc_output((len(order), *x.lse.shape[1:]), x.lse.dtype, x.lse.device))  # fmt: skip
        return MergeStateInputs(x.v_a[rows], x.s_a[rows], x.v_b[rows], x.s_b[rows], **fresh), rows

    def perturbations(self, p: MergeStateParams) -> tuple[Perturbation, ...]:
        """Values negated; LSEs shifted apart (a by +1, b by -1: the weights move, -inf stays -inf)."""
        return (negated("values", ("v_a", "v_b")), Perturbation("lses", ("s_a", "s_b"), _shift_lses))

    def row_requests(self, p, x: MergeStateInputs):
        return torch.arange(x.v_a.shape[0])  # every token is its own pair of partial states

    def flops(self, p: MergeStateParams, x) -> float:
        return 4.0 * p.tokens * p.heads * p.head_dim

    def bytes(self, p: MergeStateParams, x: MergeStateInputs) -> float:
        el = x.v_a.element_size()
        return float(3 * x.v_a.numel() * el + 3 * x.s_a.numel() * 4)
