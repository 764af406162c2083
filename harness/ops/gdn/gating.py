"""`gdn_gating`: g and beta from the raw gates."""

from __future__ import annotations

import torch

from attnbench.buffers import alloc_output, output_bytes
from attnbench.ops.base import (
    WEIGHTS,
    IdField,
    Op,
    OutputSpec,
    Perturbation,
    SmokeSpace,
    negated,
    tensor_bytes,
)
from attnbench.ops.gdn.inputs import (
    GatingInputs,
    _gate_params,
    _generators,
    _rand,
    _randn,
)
from attnbench.ops.gdn.params import (
    GatingParams,
)
from attnbench.references import gdn as ref


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
