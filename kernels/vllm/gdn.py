"""vLLM's GDN kernels (vllm 0.33.0: its vendored FLA, `vllm.third_party.flash_linear_attention.ops`) behind
the canonical GDN contracts, called as vLLM's Qwen3-Next layer (`QwenGDNLinearAttention._forward_core`,
model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py) calls them.

vLLM's state pool is `[slots, HV, V, K]` (K contiguous, `gated_delta_net_state_shape`) and its slot 0 is
the null block: the kernels skip a request whose slot index is `<= 0` (NULL_BLOCK_ID) and never write
slot 0. So `prepare` converts the canonical pool `[N, HV, K, V]` into vLLM's with one null slot in front
(`vllm_pool`: canonical slot s is vLLM's s + 1, padding -1 becomes 0), and the closure's `finalize`
writes the real requests' slots back (untimed). The closure shifts the batch's slot indices on the
device in the call (`vllm_slots`, `verify_columns`: one elementwise op, no host sync, what vLLM's
metadata builder hands the layer), so slots rewritten in place between calls (a replay) are followed.

In a gdn_chain step (`x.state_layout == "vk"`: the implementations declare vLLM's layout) the chain's pool
is already vLLM's `[N, HV, V, K]`, but the null slot has no place in front of it: the closure copies the
pool into its own (null slot first) at the start of the call and `finalize` copies it back whole, so
the step reads the pool as the previous step left it. Those two copies are in the call: chains are
correctness runs (docs/chain.md); a timed gdn op gets the canonical pool and converts it in prepare.

- gdn_decode: `fused_sigmoid_gating_delta_rule_update` (q/k/v `[1, B, *, *]`, `cu_seqlens = 0..B`,
  `ssm_state_indices [B]`, `inplace_final_state`, `use_qk_l2norm_in_kernel`), the layer's decode path;
  packed: `fused_recurrent_gated_delta_rule_packed_decode(mixed_qkv, ..., out [B, 1, HV, V])` (vLLM's
  `_forward_core_decode_non_spec`; CUDA only: FLA's utils query the driver at import).
- gdn_verify (chain): vLLM's spec decode keeps the state after each draft token in its own pool slot:
  `ssm_state_indices [B, T+1]` and `num_accepted_tokens`, the initial state read from column
  `num_accepted - 1`, the state after token t written to column t. Here columns 0..T-1 are scratch slots
  after the pool (they become `inter_states`) and column T is the request's slot, read with
  `num_accepted_tokens = T + 1` (a step after one that accepted all T + 1 tokens), so the request's
  slot is never written and the pool stays as it was. vLLM has no GDN tree verify: trees are a skip.
- gdn_extend: vLLM's prefill path: the requests' states gathered from the pool (`ssm_state[idx]`), those
  without one zeroed, `chunk_gated_delta_rule(..., output_final_state=True, cu_seqlens)`, the final
  states stored back (`ssm_state[idx] = final`), all in the timed call as in the layer. vLLM normalises
  q and k before the kernel (`fused_post_conv_prep`); here the kernel's own `use_qk_l2norm_in_kernel`
  does (the canonical q and k arrive raw). CUDA only.
"""

from __future__ import annotations

import torch

from attnbench.kernels import native_states as states
from attnbench.kernels.vllm import _lib

NULL_SLOTS = 1  # vLLM's NULL_BLOCK_ID = 0: the first slot of its pool is never a request's


def gdn_unsupported(case) -> str | None:
    """Why vLLM's GDN kernels cannot run `case` (None: they can)."""
    p = case.params
    if p.head_dim_k > 256:
        return "vLLM's FLA GDN kernels: head_dim_k <= 256 (one K block)"
    if case.op_name == "gdn_verify" and p.tree:
        return "vLLM's GDN spec decode is a chain (ssm_state_indices per draft position, no parent indices): no trees"
    if case.op_name == "gdn_extend" and case.dtype == "fp32":
        return "vLLM's chunk_gated_delta_rule runs fp16/bf16 activations (fp32 q is not what its layer passes)"
    cpu_only_module = {"gdn_extend": "chunk"}.get(case.op_name)
    if case.op_name == "gdn_decode" and p.packed:
        cpu_only_module = "fused_recurrent"
    if cpu_only_module and not case.on_cuda:
        return f"vLLM's {cpu_only_module} runs on CUDA only (FLA's utils query the CUDA driver at import)"
    return None


def vllm_slots(indices: torch.Tensor) -> torch.Tensor:
    """Canonical slots (negative = padding) -> vLLM's: s + 1, padding 0 (NULL_BLOCK_ID), int32."""
    return torch.where(indices >= 0, indices + NULL_SLOTS, 0).to(torch.int32)


def vllm_pool(x, spare: int = 0) -> tuple[torch.Tensor, bool]:
    """(vLLM's pool `[1 + N + spare, HV, V, K]`, whether `x.state_pool` is a chain's pool in that layout).

    A zero null slot first, then the pool's N slots in vLLM's layout, then `spare` zero scratch slots.
    From the canonical pool `[N, HV, K, V]` the slots are converted now (prepare); a chain's pool
    (`x.state_layout == "vk"`) is copied in by `sync_in` at the start of every call."""
    chained = x.state_layout == "vk"
    native = x.state_pool if chained else x.state_pool.transpose(-1, -2)  # a view: [N, HV, V, K] either way
    pool = native.new_zeros(NULL_SLOTS + native.shape[0] + spare, *native.shape[1:])
    if not chained:
        pool[NULL_SLOTS : NULL_SLOTS + native.shape[0]].copy_(native)  # one copy, no full-size temporary
    return pool, chained


def sync_in(x, pool: torch.Tensor, chained: bool) -> None:
    """In the call, for a chain's pool: its slots as the previous step left them, into vLLM's pool."""
    if chained:
        pool[NULL_SLOTS : NULL_SLOTS + x.state_pool.shape[0]].copy_(x.state_pool)


def _write_back(x, pool: torch.Tensor, chained: bool):
    """`finalize`: vLLM's pool back into `x.state_pool`: a chain's pool whole, the canonical pool at the real
    requests' slots (as the slots are then)."""
    n = x.state_pool.shape[0]

    def finalize(outputs):
        if chained:
            x.state_pool.copy_(pool[NULL_SLOTS : NULL_SLOTS + n])
            return outputs
        idx = x.state_indices.long()
        states.state_canonical_(x.state_pool, pool[NULL_SLOTS : NULL_SLOTS + n], idx[idx >= 0])
        return outputs

    return finalize


def prepare_decode(case, x):
    B, HV, V = x.batch, x.v.shape[1], x.v.shape[2]
    pool, chained = vllm_pool(x)
    if x.mixed_qkv is not None:
        mod = _lib.gdn_module("fused_recurrent")
        out = x.o.view(B, 1, HV, V)

        def run():
            sync_in(x, pool, chained)
            mod.fused_recurrent_gated_delta_rule_packed_decode(
                mixed_qkv=x.mixed_qkv, a=x.a, b=x.b, A_log=x.A_log, dt_bias=x.dt_bias, scale=x.scale,
                initial_state=pool, out=out, ssm_state_indices=vllm_slots(x.state_indices),
                use_qk_l2norm_in_kernel=True,
            )  # fmt: skip
            return {"o": x.o}

        variant = "fused_recurrent_gated_delta_rule_packed_decode"
    else:
        mod = _lib.gdn_module("fused_sigmoid_gating")
        cu = torch.arange(B + 1, dtype=torch.int32, device=x.q.device)

        def run():
            sync_in(x, pool, chained)
            o, _ = mod.fused_sigmoid_gating_delta_rule_update(
                A_log=x.A_log, a=x.a, b=x.b, dt_bias=x.dt_bias, q=x.q[None], k=x.k[None], v=x.v[None],
                scale=x.scale, initial_state=pool, inplace_final_state=True, cu_seqlens=cu,
                ssm_state_indices=vllm_slots(x.state_indices), use_qk_l2norm_in_kernel=True,
            )  # fmt: skip
            return {"o": o.view(B, HV, V)}

        variant = "fused_sigmoid_gating_delta_rule_update"
    run.finalize = _write_back(x, pool, chained)
    where = "the chain's vk pool copied in and out in the call" if chained else "from prepare"
    run.info = {"variant": f"{variant} (pool [1 + N, HV, V, K], null slot 0, {where})"}
    return run


def verify_columns(indices: torch.Tensor, n_slots: int, draft: int) -> torch.Tensor:
    """vLLM's spec `ssm_state_indices [B, draft + 1]` int32 for canonical `indices [B]` over a pool of
    `n_slots` (vLLM's: one null slot, the pool, then B * draft scratch slots): column t < draft is request
    b's scratch slot for the state after token t (`1 + n_slots + b * draft + t`), column draft its own slot
    (s + 1); a padding request's row is all 0 (NULL_BLOCK_ID)."""
    B = indices.shape[0]
    scratch = NULL_SLOTS + n_slots + torch.arange(B * draft, device=indices.device).view(B, draft)
    cols = torch.cat([scratch, (indices.long() + NULL_SLOTS)[:, None]], dim=1)
    return torch.where((indices >= 0)[:, None], cols, 0).to(torch.int32)


def prepare_verify(case, x):
    mod = _lib.gdn_module("fused_sigmoid_gating")
    B, T, HV, V = x.batch, x.draft, x.v.shape[1], x.v.shape[2]
    N = x.state_pool.shape[0]
    pool, chained = vllm_pool(x, spare=B * T)
    accepted = torch.full((B,), T + 1, dtype=torch.int32, device=x.q.device)
    cu = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=x.q.device)

    def run():
        sync_in(x, pool, chained)  # the pool is only read: nothing to copy back
        o, _ = mod.fused_sigmoid_gating_delta_rule_update(
            A_log=x.A_log, a=x.a, b=x.b, dt_bias=x.dt_bias, q=x.q[None], k=x.k[None], v=x.v[None],
            scale=x.scale, initial_state=pool, inplace_final_state=True, cu_seqlens=cu,
            ssm_state_indices=verify_columns(x.state_indices, N, T),
            num_accepted_tokens=accepted, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        return {"o": o.view(B * T, HV, V)}

    def finalize(outputs):
        scratch = pool[NULL_SLOTS + N :].view(B, T, *pool.shape[1:])
        states.state_canonical_(x.inter_states, scratch)
        return {"o": outputs["o"], "inter_states": x.inter_states}

    run.finalize = finalize
    run.info = {
        "variant": "fused_sigmoid_gating_delta_rule_update (spec decode: ssm_state_indices [B, T+1], "
        "num_accepted_tokens T+1, step states in scratch slots)"
    }
    return run


def prepare_extend(case, x):
    mod = _lib.gdn_module("chunk")
    pool, chained = vllm_pool(x)

    def run():
        sync_in(x, pool, chained)
        slots = vllm_slots(x.state_indices).long()
        initial = pool[slots]
        initial[~x.has_initial_state] = 0
        o, final = mod.chunk_gated_delta_rule(
            q=x.q[None], k=x.k[None], v=x.v[None], g=x.g[None], beta=x.beta[None], scale=x.scale,
            initial_state=initial, output_final_state=True, cu_seqlens=x.cu_seqlens,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        pool[slots] = final.to(pool.dtype)
        return {"o": o[0]}

    run.finalize = _write_back(x, pool, chained)
    run.info = {"variant": "gather + chunk_gated_delta_rule + scatter (vLLM's prefill path; pool [1 + N, HV, V, K])"}
    return run
