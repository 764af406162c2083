"""vLLM's Triton unified attention as the `vllm` backend (decode and extend over the paged cache),
driven through the installed package (vllm 0.33.0), never copied. CUDA only: vLLM's
`triton_utils` replaces triton with placeholders when no GPU driver is active, so the CPU
interpreter cannot run them; the conversions are tested on the CPU. Import-guarded: without vllm the
backend is listed with the reason and every case is a skip. Conventions: attention.py.
"""

from __future__ import annotations

from attnbench.backend import Backend, implements, register_backend
from attnbench.kernels.vllm import _lib, attention

NO_INTERPRETER = "vLLM swaps triton for placeholders when no GPU driver is active: its kernels run on CUDA only"


def _cuda(backend, case) -> str | None:
    return None if case.on_cuda else NO_INTERPRETER


def _limits(backend, case) -> str | None:
    return attention.attention_unsupported(case)


@register_backend("vllm")
class VllmBackend(Backend):
    description = f"vLLM {_lib.PINNED} Triton unified attention: paged decode, extend, tree verify (qq_bias)"
    backend_limits = _cuda

    def available(self) -> str | None:
        why = _lib.missing()
        if why:
            return why
        import torch

        if not torch.cuda.is_available():
            return f"no CUDA device ({NO_INTERPRETER})"
        return None

    @implements(
        "decode",
        limits=_limits,
        graph_safe=(
            "the dense block_table is built in prepare from the batch's CSR table (a copy: a page table written in "
            "place never reaches it, and its width is batch A's longest request) and max_seqlen_k is batch A's host "
            "value (vLLM's server keeps a persistent block table it rewrites before each replay)"
        ),
    )
    def prepare_decode(self, case, x):
        return attention.prepare_attention(case, x)

    @implements("extend", limits=_limits)
    def prepare_extend(self, case, x):
        return attention.prepare_attention(case, x)

    @implements("tree_verify", limits=_limits)
    def prepare_tree_verify(self, case, x):
        return attention.prepare_attention(case, x)
