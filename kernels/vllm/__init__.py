"""vLLM's Triton attention as the `vllm` backend, driven through the installed package (vllm 0.33.0),
never copied: its unified attention for decode, extend and tree verify over the paged cache
(attention.py), and for absorbed-MLA decode the split-KV decode its Triton MLA backend runs (mla.py).
Import-guarded: without vllm the backend is listed with the reason and every case is a skip.

Devices: CUDA; under TRITON_INTERPRET=1 on the CPU too (the import guard binds vLLM to the real triton
there: _lib.py), fp16 and fp32 cases only: the interpreter gets bf16 wrong (`INTERPRETER_BF16`).
"""

from __future__ import annotations

import torch

from attnbench.backend import Backend, implements, register_backend
from attnbench.kernels.triton.limits import interpreting
from attnbench.kernels.vllm import _lib, attention, gdn, mla

NO_INTERPRETER = "vLLM's Triton kernels run on CUDA only here, or on the CPU under TRITON_INTERPRET=1"


INTERPRETER_TREE = (
    "tree_verify on the CPU: vLLM's load_qq_bias_tile masks with `rel >= 0 and rel < n` on tensors, which Triton's "
    "compiler makes an elementwise and but its interpreter evaluates as Python's `and` (the second mask alone: "
    "keys before the tree read qq_bias at negative offsets); checked on CUDA"
)


def _device(backend, case) -> str | None:
    """CUDA cases; CPU cases under the interpreter, but for bf16 (mla.INTERPRETER_BF16) and tree_verify
    (INTERPRETER_TREE)."""
    if case.on_cuda:
        return None
    if not interpreting():
        return NO_INTERPRETER
    if case.torch_dtype == torch.bfloat16:
        return mla.INTERPRETER_BF16
    if case.op_name == "tree_verify":
        return INTERPRETER_TREE
    return None


def _gdn_device(backend, case) -> str | None:
    """CUDA cases; CPU cases under the interpreter, fp16/fp32 (bf16 rows of these recurrent kernels come out
    as garbage past the first program in the interpreter, as SGLang's copies of them do: docs/deployed.md)."""
    if case.on_cuda:
        return None
    if not interpreting():
        return NO_INTERPRETER
    if case.torch_dtype == torch.bfloat16:
        return "bf16 GDN on the CPU: Triton 3.6's interpreter gets these kernels' bf16 rows wrong; checked on CUDA"
    return None


def _attention_device(backend, case) -> str | None:
    """The attention ops' device limits (`_device`); the GDN ops state theirs in `_gdn_limits`."""
    return None if case.op_name.startswith("gdn_") else _device(backend, case)


def _gdn_limits(backend, case) -> str | None:
    return _gdn_device(backend, case) or gdn.gdn_unsupported(case)


def _limits(backend, case) -> str | None:
    return attention.attention_unsupported(case)


def _decode_limits(backend, case) -> str | None:
    return mla.mla_unsupported(case) if case.params.mla else attention.attention_unsupported(case)


UNIFIED_NOT_GRAPH_SAFE = (
    "the dense block_table is built in prepare from the batch's CSR table (a copy: a page table written in "
    "place never reaches it, and its width is batch A's longest request) and max_seqlen_k is batch A's host "
    "value (vLLM's server keeps a persistent block table it rewrites before each replay)"
)
MLA_NOT_GRAPH_SAFE = (
    "the dense block_table is built in prepare from the batch's CSR table (a copy a page table written in place "
    "never reaches) and num_kv_splits and the split scratch are sized from batch A's longest request (vLLM's "
    "server keeps a persistent block table and sizes the scratch for max_model_len)"
)


def _decode_graph_safe(backend, case) -> str:
    return MLA_NOT_GRAPH_SAFE if case.params.mla else UNIFIED_NOT_GRAPH_SAFE


@register_backend("vllm")
class VllmBackend(Backend):
    description = (
        f"vLLM {_lib.PINNED} Triton attention: unified attention (paged decode, extend, tree verify with qq_bias); "
        "MLA decode by its Triton MLA backend's split-KV decode"
    )
    backend_limits = _attention_device

    def available(self) -> str | None:
        why = _lib.missing()
        if why:
            return why
        import torch

        if not torch.cuda.is_available() and not interpreting():
            return "no CUDA device (set TRITON_INTERPRET=1 to run vLLM's Triton kernels in the CPU interpreter)"
        return None

    # absorbed MLA (Dk 576, Dv 512) goes where vLLM sends it, its Triton MLA backend's decode kernel; the
    # rest to the unified attention
    @implements("decode", limits=_decode_limits, graph_safe=_decode_graph_safe)
    def prepare_decode(self, case, x):
        if case.params.mla:
            return mla.prepare_decode(case, x)
        return attention.prepare_attention(case, x)

    @implements("extend", limits=_limits)
    def prepare_extend(self, case, x):
        return attention.prepare_attention(case, x)

    @implements("tree_verify", limits=_limits)
    def prepare_tree_verify(self, case, x):
        return attention.prepare_attention(case, x)

    # vLLM's GDN kernels (its vendored FLA), as its Qwen3-Next layer calls them: kernels/vllm/gdn.py. Graph-safe:
    # the launchers take their grids from the shapes, the slots are shifted on the device in the call. Layout
    # vk: vLLM's pool is [N, HV, V, K] (in a chain, copied into one with the null slot in front, in the call)
    @implements("gdn_decode", limits=_gdn_limits, state_layout="vk", graph_safe=True)
    def prepare_gdn_decode(self, case, x):
        return gdn.prepare_decode(case, x)

    @implements("gdn_verify", limits=_gdn_limits, state_layout="vk", graph_safe=True)
    def prepare_gdn_verify(self, case, x):
        return gdn.prepare_verify(case, x)

    @implements("gdn_extend", limits=_gdn_limits, state_layout="vk")
    def prepare_gdn_extend(self, case, x):
        return gdn.prepare_extend(case, x)
