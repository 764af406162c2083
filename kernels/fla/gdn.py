"""flash-linear-attention (fla-core 0.6.0) GDN kernels behind the canonical GDN contracts.

Conventions converted (attnbench.ops.gdn is canonical):
- fla takes `[B, T, H, *]` tensors; varlen is `B = 1` with `cu_seqlens` (int64). Our packed `[T, H, *]`
  tensors become `[1, T, H, *]` views.
- fla's `g` is log-space like ours; its state is `[N, HV, K, V]` like ours, but it has no state pool:
  it reads a dense initial state per request and returns the final states as a new tensor. The timed
  closure gathers the requests' slots into that dense `[B, HV, K, V]` initial state (zeros for padding
  rows and for requests without one) and calls fla: what a server holding a pool pays to use fla, and
  the pool is read as it is on every call (a server rewrites it, and the slots, between steps; a
  gather once in prepare was a stale output on the H100). The closure's `finalize` scatters the final
  states of the last call into the slots the requests name then, untimed (harness/backend.py).
- gdn_decode fuses the gating in fla's kernel (`use_gate_in_kernel` with A_log and dt_bias on the raw
  `a`; `use_beta_sigmoid_in_kernel` on the raw `b`); gdn_extend passes our fp32 g and beta.
- q/k are L2-normalised in fla's kernels (`use_qk_l2norm_in_kernel=True`, eps 1e-6), q scaled by
  `scale`.
"""

from __future__ import annotations

import torch


def _dense_initial_state(x, has_initial_state: torch.Tensor | None = None) -> torch.Tensor:
    """The dense `[B, HV, K, V]` initial states: the pool slots of the real requests (slot >= 0, and
    where `has_initial_state` holds), zeros elsewhere. Called inside the timed closure, without a
    host sync."""
    idx = x.state_indices.long()
    use = idx >= 0
    if has_initial_state is not None:
        use = use & has_initial_state.to(idx.device)
    h0 = x.state_pool.index_select(0, idx.clamp(min=0))
    return torch.where(use.view(-1, 1, 1, 1), h0, torch.zeros((), dtype=h0.dtype, device=h0.device))


def _scatter_final(x, last: dict):
    """`finalize`: the last call's final states into the slots of the real requests (as they are now)."""

    def finalize(outputs):
        rows = (x.state_indices >= 0).nonzero().flatten()
        x.state_pool[x.state_indices[rows].long()] = last["ht"][rows]
        return outputs

    return finalize


def prepare_decode(case, x):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    B, HV, V = x.batch, x.v.shape[1], x.v.shape[2]
    last = {}

    def run():
        with torch.no_grad():
            h0 = _dense_initial_state(x)
            o, last["ht"] = fused_recurrent_gated_delta_rule(
                x.q[:, None], x.k[:, None], x.v[:, None], g=x.a[:, None], beta=x.b[:, None], scale=x.scale,
                initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                use_gate_in_kernel=True, A_log=x.A_log, dt_bias=x.dt_bias, use_beta_sigmoid_in_kernel=True,
            )  # fmt: skip
        return {"o": o.view(B, HV, V)}

    run.finalize = _scatter_final(x, last)
    run.info = {
        "variant": "fused_recurrent_gated_delta_rule (gates in kernel; dense states gathered from the pool in the call)"
    }
    return run


def prepare_extend(case, x):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    cu = x.cu_seqlens.long()
    cu_cpu = torch.tensor([0, *torch.tensor(x.lens_host).cumsum(0).tolist()], dtype=torch.long)
    last = {}

    def run():
        with torch.no_grad():
            h0 = _dense_initial_state(x, x.has_initial_state)
            o, last["ht"] = chunk_gated_delta_rule(
                x.q[None], x.k[None], x.v[None], x.g[None], x.beta[None], scale=x.scale, initial_state=h0,
                output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
            )  # fmt: skip
        return {"o": o[0]}

    run.finalize = _scatter_final(x, last)
    run.info = {"variant": "chunk_gated_delta_rule (chunk 64; dense states gathered from the pool in the call)"}
    return run
