"""SGLang's kernels as the `sglang` backend: its Triton attention (split-KV decode, extend over a
prefix, merge_state) and its GDN Triton kernels (gating, causal conv1d, decode, chunked extend,
target verify), driven through the installed package (sglang 0.5.10.post1), never copied; and
`sglang-cute`, SGLang's CuTe DSL GDN decode (cute.py); `sgl-kernel`, its CUDA EAGLE tree kernels
(sgl_kernel.py); `sglang-unified`, the extend of its deterministic inference (one-stage kernel over a
unified token table); `sglang-prefill`, its `context_attention_fwd` (extend without a prefix).

Import-guarded: without sglang (or the small modules its kernel files import) the backend is listed
with the reason and how to install it (tools/install-deployed.sh, docs/deployed.md), and every case
is a skip. Conversions to SGLang's conventions are in conventions.py (token-level tables, window,
split rule, state layout), done in `prepare`. On the CPU the kernels run in Triton's interpreter
(TRITON_INTERPRET=1).
"""

from __future__ import annotations

from attnbench.backend import Backend, implements, register_backend
from attnbench.kernels.sglang import _lib, cute, gdn, sgl_kernel
from attnbench.kernels.sglang import attention as attn
from attnbench.kernels.triton import interpreting, on_device


def _attention(backend, case) -> str | None:
    return attn.attention_unsupported(case)


def _gdn(backend, case) -> str | None:
    return gdn.gdn_unsupported(case)


# Whether each closure may be captured in a CUDA graph once and replayed on another batch written into its
# inputs in place (the replay check, docs/replay.md): why not, or True with what makes it safe.
# SGLang's decode kernel reads kv_indptr/kv_indices/num_kv_splits from the device (its server captures it
# with a fixed max_kv_splits) and the server refills those tables before every replay
# (init_forward_metadata_replay_cuda_graph): the adapter keeps them in static buffers its closure's
# `before_replay` refills (attention.prepare_decode).


class _SGLangTriton(Backend):
    """What SGLang's Triton backends share: the import guard and the device (CUDA, or the interpreter)."""

    backend_limits = on_device

    def available(self) -> str | None:
        why = _lib.missing()
        if why:
            return why
        import torch

        if not torch.cuda.is_available() and not interpreting():
            return "no CUDA device (set TRITON_INTERPRET=1 to run SGLang's Triton kernels in the CPU interpreter)"
        return None


@register_backend("sglang")
class SGLangBackend(_SGLangTriton):
    description = f"SGLang {_lib.PINNED} Triton kernels: split-KV decode, extend, merge_state, GDN"

    @implements("decode", limits=_attention, graph_safe=True)  # tables refreshed before each replay
    def prepare_decode(self, case, x):
        return attn.prepare_decode(case, x)

    @implements("extend", limits=_attention)
    def prepare_extend(self, case, x):
        return attn.prepare_extend(case, x)

    # target verify as SGLang's server runs it (EAGLE): the draft tree is a custom-mask extend over the prefix
    @implements("tree_verify", limits=_attention)
    def prepare_tree_verify(self, case, x):
        return attn.prepare_extend(case, x)

    @implements("merge_state")
    def prepare_merge_state(self, case, x):
        return attn.prepare_merge_state(case, x)

    @implements("gdn_gating")
    def prepare_gdn_gating(self, case, x):
        return gdn.prepare_gating(case, x)

    @implements("causal_conv1d")
    def prepare_causal_conv1d(self, case, x):
        return gdn.prepare_conv(case, x)

    # graph-safe (decode and verify): fused_sigmoid_gating_delta_rule_update and the packed decode take their grid
    # and constexprs from the shapes and load slots (-1 skipped), cu_seqlens, intermediate indices and tree
    # parents in the kernel; the adapter's cu_seqlens and intermediate indices depend on the shapes alone
    @implements("gdn_decode", limits=_gdn, state_layout="vk", graph_safe=True)
    def prepare_gdn_decode(self, case, x):
        return gdn.prepare_decode(case, x)

    @implements("gdn_extend", limits=_gdn, state_layout="vk")
    def prepare_gdn_extend(self, case, x):
        return gdn.prepare_extend(case, x)

    @implements("gdn_verify", limits=_gdn, state_layout="vk", graph_safe=True)
    def prepare_gdn_verify(self, case, x):
        return gdn.prepare_verify(case, x)


@register_backend("sglang-unified")
class SGLangUnifiedBackend(_SGLangTriton):
    description = (
        f"SGLang {_lib.PINNED} deterministic extend (enable_deterministic_inference): "
        "build_unified_kv_indices + extend_attention_fwd_unified"
    )
    deterministic = True  # SGLang's batch-invariant path: calls on the same inputs must agree bit for bit

    @implements("extend", limits=lambda backend, case: attn.unified_unsupported(case))
    def prepare_extend(self, case, x):
        return attn.prepare_extend_unified(case, x)


@register_backend("sglang-prefill")
class SGLangPrefillBackend(_SGLangTriton):
    description = f"SGLang {_lib.PINNED} prefill_attention.context_attention_fwd: extend without a prefix"

    @implements("extend", limits=lambda backend, case: attn.prefill_unsupported(case))
    def prepare_extend(self, case, x):
        return attn.prepare_prefill(case, x)


@register_backend("sglang-cute")
class SGLangCuteBackend(Backend):
    description = f"SGLang {_lib.PINNED} CuTe DSL GDN decode (cutedsl_fused_sigmoid_gating_delta_rule_update)"

    def available(self) -> str | None:
        why = _lib.missing_cute()
        if why:
            return why
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device (SGLang's CuTe DSL GDN decode needs SM90+)"
        return None

    # its kernel reads h0[pool, hv, k, v] (kernels/sglang/cute.py): the canonical layout, SGLang's Triton kernels'
    # transpose (docs/chain.md: a chain that hands it their pool as it is shows which holds)
    # graph-safe: the compiled kernel is keyed by shapes (batch, heads, dims, pool size), its cu_seqlens is cached
    # per batch size and the slots are read on the device (SGLang's server captures it)
    @implements(
        "gdn_decode", limits=lambda backend, case: cute.cute_unsupported(case), state_layout="kv", graph_safe=True
    )
    def prepare_gdn_decode(self, case, x):
        return cute.prepare_decode(case, x)


def _cuda(backend, case) -> str | None:
    return None if case.on_cuda else "sgl-kernel's kernels run on CUDA only"


@register_backend("sgl-kernel")
class SglKernelBackend(Backend):
    description = "sgl-kernel CUDA EAGLE kernels: build_tree_kernel_efficient, verify_tree_greedy"
    backend_limits = _cuda

    def available(self) -> str | None:
        return sgl_kernel.missing()

    @implements("eagle_build_tree")
    def prepare_eagle_build_tree(self, case, x):
        return sgl_kernel.prepare_build_tree(case, x)

    @implements("verify_greedy")
    def prepare_verify_greedy(self, case, x):
        return sgl_kernel.prepare_verify_greedy(case, x)
