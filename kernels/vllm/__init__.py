"""vLLM's Triton attention as the `vllm` backend, driven through the installed package (vllm 0.33.0),
never copied: its unified attention for decode, extend and tree verify over the paged cache
(attention.py), and for absorbed-MLA decode the split-KV decode its Triton MLA backend runs (mla.py).
Import-guarded: without vllm the backend is listed with the reason and every case is a skip.

Devices: CUDA; under TRITON_INTERPRET=1 on the CPU, MLA decode too (the import guard binds vLLM to the
real triton there: _lib.py). The unified attention stays CUDA only: it is not run in the interpreter
here (its conversions are tested on the CPU).
"""

from __future__ import annotations

from attnbench.backend import Backend, implements, register_backend
from attnbench.kernels.triton.limits import interpreting
from attnbench.kernels.vllm import _lib, attention, mla

NO_INTERPRETER = "vLLM's unified attention runs on CUDA only here (not in the CPU interpreter)"


def _is_mla_decode(case) -> bool:
    return case.op_name == "decode" and bool(case.params.mla)


def _device(backend, case) -> str | None:
    """CUDA cases; CPU cases under the interpreter for MLA decode (vLLM's split-KV decode kernel)."""
    if case.on_cuda or (interpreting() and _is_mla_decode(case)):
        return None
    if _is_mla_decode(case):
        return "vLLM's Triton MLA decode runs on CUDA (or set TRITON_INTERPRET=1 for the CPU)"
    return NO_INTERPRETER


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
    backend_limits = _device

    def available(self) -> str | None:
        why = _lib.missing()
        if why:
            return why
        import torch

        if not torch.cuda.is_available() and not interpreting():
            return "no CUDA device (set TRITON_INTERPRET=1 to run vLLM's Triton MLA decode in the CPU interpreter)"
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
