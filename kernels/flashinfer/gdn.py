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

States live in FlashInfer's layout from `prepare` on (kernels/native_states.py): the pool is converted
once to K-last `[N, HV, V, K]` and the kernels address it by `state_indices` (decode: `initial_state`
+ `initial_state_indices`, fp32 legacy path, -1 skipped with o written as zeros; verify: the MTP pool;
extend: `state_indices` with `output_state` the same pool, the slots of requests without an initial
state cleared in the call, as a server clears a new request's slot). The timed closure is the FlashInfer call alone (plus, for packed decode,
the split of mixed_qkv into contiguous q/k/v FlashInfer needs); the closure's `finalize` writes the
touched slots (and verify's `[B, T, HV, V, K]` intermediate states) back into the canonical
`[.., K, V]` tensors after the call, untimed. A pool handed already in that layout (a gdn_chain step,
`x.state_layout == "vk"`: the implementations declare `state_layout="vk"`) is used as it is. Extend's timed call also computes the linear-space gate
alpha = exp(g) and clears the fresh requests' slots: a server rewrites g and the batch's flags every
step (on an H100, exp(g) taken once in prepare was a stale output).
"""

from __future__ import annotations

import torch

from attnbench.backend import implements
from attnbench.kernels import native_states as states


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


def _linear_gate(g: torch.Tensor) -> torch.Tensor:
    """FlashInfer's extend gate: the linear-space decay alpha = exp(g) of our log-space g (in the call:
    a server's g changes every step)."""
    return torch.exp(g)


def _limits(backend, case) -> str | None:
    return gdn_unsupported(case)


class FlashInferGDN:
    """Mixin of the flashinfer backend: gdn_decode, gdn_verify, gdn_extend (limits: `gdn_unsupported`)."""

    # graph-safe (decode and MTP verify): FlashInfer's wrappers choose the kernel, tile_v and vec_size from the
    # shapes alone and its CuTe kernels load the slots (-1: skipped) on the device; the adapter's split of
    # mixed_qkv allocates (from the graph's pool under capture) and reads nothing on the host
    @implements("gdn_decode", limits=_limits, state_layout="vk", graph_safe=True)
    def prepare_gdn_decode(self, case, x):
        from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose

        B, HV, V = x.batch, x.v.shape[1], x.v.shape[2]
        pool, finalize = states.native_pool_written_back(x)
        out = x.o.view(B, 1, HV, V)  # bf16: the kernel writes o in bf16 (fp16 cases are not run)
        packed = x.mixed_qkv is not None

        def run():
            if packed:  # FlashInfer takes contiguous q/k/v, not views into mixed_qkv: split them
                q, k, v = (t.contiguous()[:, None] for t in (x.q, x.k, x.v))
            else:
                q, k, v = x.q[:, None], x.k[:, None], x.v[:, None]
            gated_delta_rule_decode_pretranspose(
                q, k, v, None, x.A_log, x.a[:, None], x.dt_bias, x.b[:, None], scale=x.scale, output=out,
                use_qk_l2norm=True, initial_state=pool, initial_state_indices=x.state_indices,
            )  # fmt: skip
            return {"o": x.o}

        run.finalize = finalize
        split = "split mixed_qkv + " if packed else ""
        run.info = {"variant": f"{split}gated_delta_rule_decode_pretranspose (fp32 K-last pool from prepare)"}
        return run

    @implements("gdn_verify", limits=_limits, state_layout="vk", graph_safe=True)
    def prepare_gdn_verify(self, case, x):
        from flashinfer.gdn_decode import gated_delta_rule_mtp

        B, T, HV = x.batch, x.draft, x.v.shape[1]
        K, V = x.q.shape[2], x.v.shape[2]
        pool, _ = states.native_pool(x)
        inter = torch.empty(B, T, HV, V, K, dtype=torch.float32, device=x.q.device)
        out = x.o.view(B, T, HV, V)

        def run():
            gated_delta_rule_mtp(
                x.q.view(B, T, *x.q.shape[1:]), x.k.view(B, T, *x.k.shape[1:]), x.v.view(B, T, HV, V), pool,
                x.state_indices, x.A_log, x.a.view(B, T, HV), x.dt_bias, x.b.view(B, T, HV), scale=x.scale,
                output=out, intermediate_states_buffer=inter, disable_state_update=True, use_qk_l2norm=True,
            )  # fmt: skip
            return {"o": x.o, "inter_states": inter}

        def finalize(outputs):
            states.state_canonical_(x.inter_states, inter)
            return {"o": outputs["o"], "inter_states": x.inter_states}

        run.finalize = finalize
        run.info = {"variant": "gated_delta_rule_mtp (chain; fp32 K-last pool and intermediates from prepare)"}
        return run

    @implements("gdn_extend", limits=_limits, state_layout="vk")
    def prepare_gdn_extend(self, case, x):
        from flashinfer.gdn_prefill import chunk_gated_delta_rule

        from attnbench.kernels.flashinfer import gdn_compile_cache

        gdn_compile_cache.install()  # its CuTe DSL kernels from disk in a later process (gdn_compile_cache.py)
        pool, finalize = states.native_pool_written_back(x, spare=1)
        cu = x.cu_seqlens.long()
        max_len = max(x.lens_host)

        def run():
            states.zero_fresh_states_(pool, x.state_indices, x.has_initial_state)
            alpha = _linear_gate(x.g)
            chunk_gated_delta_rule(
                x.q, x.k, x.v, g=alpha, beta=x.beta, scale=x.scale, initial_state=pool, output_final_state=True,
                cu_seqlens=cu, use_qk_l2norm_in_kernel=True, output=x.o, output_state=pool,
                state_indices=x.state_indices, max_seqlen=max_len,
            )  # fmt: skip
            return {"o": x.o}

        def finalize_and_say(outputs):
            # after a checked call (never timed): the first call compiled or loaded FlashInfer's kernels
            run.info["compile_cache"] = gdn_compile_cache.state()
            return finalize(outputs)

        run.finalize = finalize_and_say
        run.info = {
            "variant": "exp(g), fresh slots cleared + chunk_gated_delta_rule (fp32 K-last pool from prepare, state_indices)",
            "compile_cache": gdn_compile_cache.state(),
        }
        return run
