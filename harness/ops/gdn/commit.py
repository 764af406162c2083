"""`gdn_commit`: the accepted draft tokens' states and conv windows into the pools."""

from __future__ import annotations

import torch

from attnbench.ops.base import (
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
    CommitInputs,
    _generators,
    _pool_slots,
    _randn,
    _slots,
)
from attnbench.ops.gdn.params import (
    GDNCommitParams,
)
from attnbench.references import gdn as ref


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
