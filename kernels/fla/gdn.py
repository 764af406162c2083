"""flash-linear-attention (fla-core 0.6.0) GDN kernels behind the canonical GDN contracts.

Conventions converted (attnbench.ops.gdn is canonical):
- fla takes `[B, T, H, *]` tensors; varlen is `B = 1` with `cu_seqlens` (int64). Our packed `[T, H, *]`
  tensors become `[1, T, H, *]` views.
- fla's `g` is log-space like ours; its state is `[N, HV, K, V]` like ours. It has no state pool, so
  the closure gathers the requests' slots into a dense `[B, HV, K, V]` initial state (zeros for
  requests without one) and scatters the final states back: two extra passes over the states that
  a pool-indexed kernel does not make, reported as the variant.
- gdn_decode fuses the gating in fla's kernel (`use_gate_in_kernel` with A_log and dt_bias on the raw
  `a`; `use_beta_sigmoid_in_kernel` on the raw `b`); gdn_extend passes our fp32 g and beta.
- q/k are L2-normalised in fla's kernels (`use_qk_l2norm_in_kernel=True`, eps 1e-6), q scaled by
  `scale`.
"""

from __future__ import annotations

import torch


def _rows_and_slots(indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(batch rows of real requests, their slots, whether every row is real); built once in prepare."""
    idx = indices.long()
    rows = (idx >= 0).nonzero().flatten()
    return rows, idx[rows], bool(rows.numel() == idx.numel())


def prepare_decode(case, x):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    B, HV = x.batch, x.v.shape[1]
    rows, slots, dense = _rows_and_slots(x.state_indices)

    def run():
        with torch.no_grad():
            if dense:
                h0 = x.state_pool[slots]
            else:
                h0 = x.state_pool.new_zeros(B, *x.state_pool.shape[1:])
                h0[rows] = x.state_pool[slots]
            o, ht = fused_recurrent_gated_delta_rule(
                x.q[:, None], x.k[:, None], x.v[:, None], g=x.a[:, None], beta=x.b[:, None], scale=x.scale,
                initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                use_gate_in_kernel=True, A_log=x.A_log, dt_bias=x.dt_bias, use_beta_sigmoid_in_kernel=True,
            )  # fmt: skip
            x.o.copy_(o.view(B, HV, -1))
            x.state_pool[slots] = ht[rows] if not dense else ht
        return {"o": x.o}

    run.info = {"variant": "gather + fused_recurrent_gated_delta_rule (gates in kernel) + scatter"}
    return run


def prepare_extend(case, x):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    cu = x.cu_seqlens.long()
    cu_cpu = torch.tensor([0, *torch.tensor(x.lens_host).cumsum(0).tolist()], dtype=torch.long)
    slots = x.state_indices.long()
    init = x.has_initial_state

    def run():
        with torch.no_grad():
            h0 = x.state_pool[slots]
            h0 = torch.where(init[:, None, None, None], h0, torch.zeros_like(h0))
            o, ht = chunk_gated_delta_rule(
                x.q[None], x.k[None], x.v[None], x.g[None], x.beta[None], scale=x.scale, initial_state=h0,
                output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
            )  # fmt: skip
            x.o.copy_(o[0])
            x.state_pool[slots] = ht
        return {"o": x.o}

    run.info = {"variant": "gather + chunk_gated_delta_rule (chunk 64) + scatter"}
    return run
