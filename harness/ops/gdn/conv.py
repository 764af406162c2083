"""`causal_conv1d`: prefill, update and speculative verify modes."""

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
    rolled,
    tensor_bytes,
)
from attnbench.ops.gdn.inputs import (
    _LENGTHS,
    ConvInputs,
    _generators,
    _initial,
    _lengths,
    _pool_slots,
    _randn,
    _regrow,
    _slots,
    _tree_parents,
)
from attnbench.ops.gdn.params import (
    ConvParams,
)
from attnbench.references import gdn as ref


class CausalConv1dOp(Op):
    """Depthwise causal conv1d + SiLU over per-request windows; writes the last W-1 raw inputs back.

    Verify mode (speculative decoding) writes no state: it keeps the window after every draft token in
    `intermediate_conv_windows` for `gdn_commit` (module docstring). Update and verify take padding
    requests (`pad`, cache index -1): no slot is touched for them and their output rows are unspecified."""

    name = "causal_conv1d"
    smoke = SmokeSpace(
        # dim 130: channels over more than one 64- or 128-wide tile (per-tile bias and weight offsets)
        space={"batch": [1, 3, 5], "seq_len": [1, 2, 3, 9, 40], "dim": [40, 48, 130],
               "width": [2, 3, 4], "pad": [0, 1], "dtype": ["bf16", "fp16", "fp32"]},
        # update mode fixes four axes (seq_len 1, lens, init, tree): the greedy fill and its random repairs
        # miss completions of (batch, update) and (width, update), which would be listed as forbidden though
        # allowed; one update case per batch and width, one of them padded (a CUDA-graph-padded decode batch)
        seeds=[
            {"batch": b, "mode": "update", "width": w, "dim": c, "pad": pad, "dtype": dt}
            for b, w, c, pad, dt in ((1, 2, 40, 0, "bf16"), (3, 3, 48, 1, "fp16"), (5, 4, 40, 0, "fp32"))
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
        """Padding requests' rows (update and verify modes): their token rows of y, and their windows (verify)."""
        if not p.pad:
            return {}
        pad = x.cache_indices < 0
        free = {"y": pad.repeat_interleave(p.seq_len)[:, None], "intermediate_conv_windows": pad[:, None, None, None]}
        return {name: mask for name, mask in free.items() if name in self.outputs_for(p)}

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
        return 2.0 * p.width * p.dim * (x.x.shape[0] - p.pad)  # padding: update mode, one row per request

    def bytes(self, p: ConvParams, x: ConvInputs) -> float:
        el = x.x.element_size()
        state = p.dim * (p.width - 1) * el
        if p.mode == "verify":
            real = p.batch - p.pad
            total = 2 * x.x.numel() * el + (x.weight.numel() + x.bias.numel()) * el + real * (1 + p.seq_len) * state
            return float(total + x.cache_indices.numel() * 4 + (x.parents.numel() * 4 if p.tree else 0))
        real = [i >= 0 for i in x.cache_indices.tolist()]  # padding (update mode): no state read or written
        reads = sum(r and bool(i) for r, i in zip(real, x.has_initial_state.tolist(), strict=True))
        total = 2 * x.x.numel() * el + (x.weight.numel() + x.bias.numel()) * el
        total += (reads + sum(real)) * state + (x.cache_indices.numel() + x.query_start_loc.numel()) * 4
        return float(total)
