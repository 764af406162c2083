"""SGLang's GDN Triton kernels (sglang 0.5.10.post1, `sglang.srt.layers.attention.fla` and
`.mamba.causal_conv1d_triton`) behind the canonical GDN contracts, called as SGLang's
`TritonGDNKernel` calls them.

States live in SGLang's layout from `prepare` on (conventions.state_v_major: the pool `[N, HV, V, K]`,
verify's intermediate states `[B, T, HV, V, K]`); the timed closure is the library call alone, and
its `finalize` writes the states back into the canonical `[.., K, V]` tensors after the call,
untimed (harness/backend.py). A pool handed already in that layout (a gdn_chain step,
`x.state_layout == "vk"`; the implementations declare `state_layout="vk"`) is used as it is.

- gdn_gating: `fused_gdn_gating` (softplus threshold 20); returns new `[1, T, HV]` fp32 g and beta.
- causal_conv1d: `causal_conv1d_fn` on the `[dim, T]` transposed view of x (prefill; the state pool
  `[N, dim, W-1]` as it is, which the kernel reads by strides) and `causal_conv1d_update` (update).
- gdn_decode: `fused_sigmoid_gating_delta_rule_update` (q/k/v as `[1, B, *, *]` with
  `cu_seqlens = 0..B`, SGLang's unpacked decode) or, for `packed`, SGLang's fast path
  `fused_recurrent_gated_delta_rule_packed_decode` on mixed_qkv.
- gdn_extend: `chunk_gated_delta_rule` over the pool (`initial_state_indices`; final states written
  in place). It always reads the slot: requests without an initial state get a cleared slot in
  prepare, as SGLang's allocator clears a new request's slot.
- gdn_verify: `fused_sigmoid_gating_delta_rule_update` with `disable_state_update`, intermediate states
  `[B, T, HV, V, K]` (`intermediate_state_indices = 0..B-1`, `cache_steps = T`) and, for trees,
  `retrieve_parent_token = parents`.
"""

from __future__ import annotations

import torch

from attnbench.kernels import native_states as states
from attnbench.kernels.sglang import _lib
from attnbench.kernels.sglang import conventions as conv


def gdn_unsupported(case) -> str | None:
    """Why SGLang's GDN kernels cannot run `case` (None: they can)."""
    p = case.params
    if case.op_name in ("gdn_decode", "gdn_extend", "gdn_verify") and p.head_dim_k > 256:
        return "SGLang's GDN kernels: head_dim_k <= 256 (one K block; chunk kernels tile K by 64 up to 256)"
    if case.op_name == "gdn_extend" and case.dtype == "fp32":
        return "SGLang's chunk_gated_delta_rule asserts q is not float32"
    return None


def prepare_gating(case, x):
    mod = _lib.module("fused_gdn_gating")

    def run():
        g, beta = mod.fused_gdn_gating(x.A_log, x.a, x.b, x.dt_bias)
        return {"g": g[0], "beta": beta[0]}

    run.info = {"variant": "fused_gdn_gating"}
    return run


def prepare_conv(case, x):
    mod = _lib.module("causal_conv1d_triton")
    lens = list(x.lens_host)

    if x.update:

        def run():
            y = mod.causal_conv1d_update(
                x.x, x.conv_states, x.weight, x.bias, activation="silu", conv_state_indices=x.cache_indices
            )
            return {"y": y}

        run.info = {"variant": "causal_conv1d_update"}
        return run

    if x.verify:
        return _prepare_conv_verify(mod, x)

    def run():
        y = mod.causal_conv1d_fn(
            x.x.t(), x.weight, x.bias, x.conv_states, x.query_start_loc, lens, cache_indices=x.cache_indices,
            has_initial_state=x.has_initial_state, activation="silu",
        )  # fmt: skip
        return {"y": y.t()}

    run.info = {"variant": "causal_conv1d_fn (x as the [dim, T] view)"}
    return run


def _prepare_conv_verify(mod, x):
    """As SGLang's GDN backend runs target verify: x as `[B, dim, draft]` (a view), the pool read by
    `conv_state_indices`, the window after each draft token into `intermediate_conv_window
    [B, draft, dim, W-1]` (the canonical buffer as it is) at `intermediate_state_indices = 0..B-1`; a
    tree as `retrieve_next_token`/`retrieve_next_sibling` (conventions.eagle_links); the kernel writes the
    parents it rebuilds from them into `retrieve_parent_token` (a buffer from prepare; SGLang's GDN
    verify reads it next). Like SGLang's, the call also writes the pool: each slot gets the last W-1
    inputs in packed order, which SGLang's server overwrites at commit from the intermediate windows
    (docs/findings.md); the canonical verify leaves the pool alone, so those rows fail on it."""
    B = x.cache_indices.shape[0]
    T = x.x.shape[0] // B
    inter_idx = torch.arange(B, dtype=torch.int32, device=x.x.device)
    tree = x.parents is not None
    parent_out = torch.empty_like(x.parents) if tree else None  # the kernel writes the parents it rebuilt

    def run():
        links = conv.eagle_links(x.parents) if tree else (None, None)  # SGLang's tree kernel writes these
        y = mod.causal_conv1d_update(
            x.x.view(B, T, -1).transpose(1, 2), x.conv_states, x.weight, x.bias, activation="silu",
            conv_state_indices=x.cache_indices, intermediate_conv_window=x.intermediate_conv_windows,
            intermediate_state_indices=inter_idx, retrieve_next_token=links[0], retrieve_next_sibling=links[1],
            retrieve_parent_token=parent_out,
        )  # fmt: skip
        return {"y": y.transpose(1, 2).reshape(B * T, -1), "intermediate_conv_windows": x.intermediate_conv_windows}

    run.info = {
        "variant": "causal_conv1d_update (target verify"
        + (", tree: next-token/sibling links built per call from parents)" if tree else ")")
    }
    return run


def prepare_decode(case, x):
    B, HV, V = x.batch, x.v.shape[1], x.v.shape[2]
    pool, back = states.native_pool_written_back(x)
    if x.mixed_qkv is not None:
        mod = _lib.module("fused_recurrent")
        out = x.o.view(B, 1, HV, V)

        def run():
            mod.fused_recurrent_gated_delta_rule_packed_decode(
                x.mixed_qkv, x.a, x.b, x.A_log, x.dt_bias, x.scale, pool, out, x.state_indices,
                use_qk_l2norm_in_kernel=True,
            )  # fmt: skip
            return {"o": x.o}

        variant = "fused_recurrent_gated_delta_rule_packed_decode"
    else:
        mod = _lib.module("fused_sigmoid_gating_recurrent")
        cu = torch.arange(B + 1, dtype=torch.int32, device=x.q.device)

        def run():
            o = mod.fused_sigmoid_gating_delta_rule_update(
                x.A_log, x.a, x.dt_bias, 1.0, 20.0, x.q[None], x.k[None], x.v[None], x.b, pool, x.state_indices,
                scale=x.scale, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
            )  # fmt: skip
            return {"o": o.view(B, HV, V)}

        variant = "fused_sigmoid_gating_delta_rule_update"
    run.finalize = back
    run.info = {"variant": f"{variant} (pool [N, HV, V, K] from prepare)"}
    return run


def prepare_extend(case, x):
    mod = _lib.module("chunk")
    pool, back = states.native_pool_written_back(x, spare=1)

    def run():
        states.zero_fresh_states_(pool, x.state_indices, x.has_initial_state)  # as the server's scheduler does
        o, _, _ = mod.chunk_gated_delta_rule(
            x.q[None], x.k[None], x.v[None], x.g[None], x.beta[None], scale=x.scale, initial_state=pool,
            initial_state_indices=x.state_indices, cu_seqlens=x.cu_seqlens, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        return {"o": o[0]}

    run.finalize = back
    run.info = {"variant": "fresh slots cleared + chunk_gated_delta_rule (pool [N, HV, V, K] from prepare)"}
    return run


def prepare_verify(case, x):
    mod = _lib.module("fused_sigmoid_gating_recurrent")
    B, T, HV = x.batch, x.draft, x.v.shape[1]
    K, V = x.q.shape[2], x.v.shape[2]
    pool, _ = states.native_pool(x)
    inter = torch.empty(B, T, HV, V, K, dtype=torch.float32, device=x.q.device)
    inter_idx = torch.arange(B, dtype=torch.int32, device=x.q.device)
    cu = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=x.q.device)
    parents = x.parents

    def run():
        o = mod.fused_sigmoid_gating_delta_rule_update(
            x.A_log, x.a, x.dt_bias, 1.0, 20.0, x.q[None], x.k[None], x.v[None], x.b, pool, x.state_indices,
            scale=x.scale, use_qk_l2norm_in_kernel=True, cu_seqlens=cu, disable_state_update=True,
            intermediate_states_buffer=inter, intermediate_state_indices=inter_idx, cache_steps=T,
            retrieve_parent_token=parents,
        )  # fmt: skip
        return {"o": o.view(B * T, HV, V), "inter_states": inter}

    def finalize(outputs):
        states.state_canonical_(x.inter_states, inter)
        return {"o": outputs["o"], "inter_states": x.inter_states}

    run.finalize = finalize
    run.info = {
        "variant": "fused_sigmoid_gating_delta_rule_update (target verify" + (", tree)" if parents is not None else ")")
    }
    return run
