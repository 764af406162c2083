"""FlashInfer's GDN kernels behind the canonical GDN contracts: the mixin `FlashInferGDN`.

The `flashinfer` backend class (kernels/flashinfer/backends.py) takes this mixin among its bases;
each prepare method is declared with `gdn_unsupported` as its limits. flashinfer is imported lazily,
in `prepare`.

Kernels (FlashInfer 0.7.2.post1, SM90+):
- gdn_decode: `gdn_decode.gated_delta_rule_decode_pretranspose` (fp32 state, T = 1), state `[B, HV, V, K]`
  (K-last) updated in place, raw gates fused (A_log, a, dt_bias, b), q/k L2-normalised in the kernel.
- gdn_verify: `gdn_decode.gated_delta_rule_mtp` (fp32 pool `[P, HV, V, K]`, `disable_state_update=True`,
  intermediate states `[B, T, HV, V, K]`). It has no tree parents: tree cases are unsupported.
- gdn_extend: `gdn_prefill.chunk_gated_delta_rule` (SM90 CuTe-DSL kernel, D = 128, fp16/bf16), whose
  `g` is the linear-space decay alpha = exp(g) and whose states are `[N, HV, V, K]`.

Conversions, all inside the timed closure (they are part of running FlashInfer on our layout):
our pool is `[N, HV, K, V]` (K-major), FlashInfer's is K-last, so the closure gathers the requests'
slots transposed into a dense `[B, HV, V, K]` buffer (zeros for padding rows and for requests
without an initial state), runs the kernel, and scatters the final states back transposed; verify's
intermediate states come back transposed into `inter_states`. Padding rows (negative index) run from
a zero state and are never scattered back.
"""

from __future__ import annotations

import torch

from attnbench.backend import implements


def gdn_unsupported(case) -> str | None:
    """Why FlashInfer's GDN kernels cannot run `case` (None: they can)."""
    op, p = case.op_name, case.params
    if op not in ("gdn_decode", "gdn_verify", "gdn_extend"):
        return f"flashinfer has no {op} kernel here"
    if not case.on_cuda:
        return "flashinfer GDN kernels run on CUDA (SM90+) only"
    if torch.cuda.is_available() and torch.cuda.get_device_capability(torch.device(case.device))[0] < 9:
        return "flashinfer GDN kernels need SM90+"
    if case.dtype not in ("bf16", "fp16"):
        return "flashinfer GDN kernels take fp16/bf16 q/k/v"
    if op != "gdn_extend" and case.dtype == "fp16":  # FlashInfer 0.7.2 gdn_decode.py asserts dt_bias's dtype
        return "flashinfer GDN decode/MTP kernels take dt_bias in bf16/fp32 and write o in bf16 whatever q's dtype: no fp16"
    if (p.head_dim_k, p.head_dim_v) != (128, 128):
        return "flashinfer GDN kernels here: head dims K = V = 128"
    if op == "gdn_verify" and p.tree:
        return "flashinfer gated_delta_rule_mtp has no tree parents (chain verify only)"
    return None


def _rows_and_slots(indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch rows of real requests and their slots (built once in prepare; indices are batch metadata)."""
    idx = indices.long()
    rows = (idx >= 0).nonzero().flatten()
    return rows, idx[rows]


def _gather_k_last(pool: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, B: int) -> torch.Tensor:
    """`[B, HV, V, K]` fp32: the slots' states transposed (K-last), zeros for the other rows."""
    N, HV, K, V = pool.shape
    out = pool.new_zeros(B, HV, V, K)
    out[rows] = pool[slots].transpose(-1, -2)
    return out


def _limits(backend, case) -> str | None:
    return gdn_unsupported(case)


class FlashInferGDN:
    """Mixin of the flashinfer backend: gdn_decode, gdn_verify, gdn_extend (limits: `gdn_unsupported`)."""

    @implements("gdn_decode", limits=_limits)
    def prepare_gdn_decode(self, case, x):
        from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose

        B, HV, V = x.batch, x.v.shape[1], x.v.shape[2]
        rows, slots = _rows_and_slots(x.state_indices)
        out = torch.empty(B, 1, HV, V, dtype=torch.bfloat16, device=x.q.device)

        def run():
            state = _gather_k_last(x.state_pool, rows, slots, B)
            q, k, v = (t.contiguous()[:, None] for t in (x.q, x.k, x.v))  # packed: views of mixed_qkv
            gated_delta_rule_decode_pretranspose(
                q, k, v, state, x.A_log, x.a[:, None], x.dt_bias, x.b[:, None], scale=x.scale, output=out,
                use_qk_l2norm=True,
            )  # fmt: skip
            x.o.copy_(out[:, 0])
            x.state_pool[slots] = state[rows].transpose(-1, -2)
            return {"o": x.o}

        run.info = {"variant": "gather K-last + gated_delta_rule_decode_pretranspose (fp32 state) + scatter"}
        return run

    @implements("gdn_verify", limits=_limits)
    def prepare_gdn_verify(self, case, x):
        from flashinfer.gdn_decode import gated_delta_rule_mtp

        B, T, HV = x.batch, x.draft, x.v.shape[1]
        K, V = x.q.shape[2], x.v.shape[2]
        rows, slots = _rows_and_slots(x.state_indices)
        dense_idx = torch.arange(B, dtype=torch.int32, device=x.q.device)
        dense_idx[x.state_indices < 0] = -1  # padding: FlashInfer skips the row
        inter = torch.empty(B, T, HV, V, K, dtype=torch.float32, device=x.q.device)
        out = torch.empty(B, T, HV, V, dtype=x.o.dtype, device=x.q.device)

        def run():
            pool = _gather_k_last(x.state_pool, rows, slots, B)
            gated_delta_rule_mtp(
                x.q.view(B, T, *x.q.shape[1:]), x.k.view(B, T, *x.k.shape[1:]), x.v.view(B, T, HV, V), pool,
                dense_idx, x.A_log, x.a.view(B, T, HV), x.dt_bias, x.b.view(B, T, HV), scale=x.scale,
                output=out, intermediate_states_buffer=inter, disable_state_update=True, use_qk_l2norm=True,
            )  # fmt: skip
            x.o.copy_(out.view(B * T, HV, V))
            x.inter_states.copy_(inter.transpose(-1, -2))
            return {"o": x.o, "inter_states": x.inter_states}

        run.info = {"variant": "gather K-last + gated_delta_rule_mtp (chain) + transpose intermediates"}
        return run

    @implements("gdn_extend", limits=_limits)
    def prepare_gdn_extend(self, case, x):
        from flashinfer.gdn_prefill import chunk_gated_delta_rule

        B, HV = x.batch, x.v.shape[1]
        K, V = x.q.shape[2], x.v.shape[2]
        slots = x.state_indices.long()
        init_rows = x.has_initial_state.nonzero().flatten()
        init_slots = slots[init_rows]
        cu = x.cu_seqlens.long()
        final = torch.empty(B, HV, V, K, dtype=torch.float32, device=x.q.device)
        max_len = max(x.lens_host)

        def run():
            h0 = _gather_k_last(x.state_pool, init_rows, init_slots, B)
            alpha = torch.exp(x.g)  # FlashInfer's gate is the linear-space decay
            chunk_gated_delta_rule(
                x.q, x.k, x.v, g=alpha, beta=x.beta, scale=x.scale, initial_state=h0, output_final_state=True,
                cu_seqlens=cu, use_qk_l2norm_in_kernel=True, output=x.o, output_state=final,
                max_seqlen=max_len,
            )  # fmt: skip
            x.state_pool[slots] = final.transpose(-1, -2)
            return {"o": x.o}

        run.info = {"variant": "gather K-last + chunk_gated_delta_rule (alpha = exp(g)) + scatter"}
        return run
