"""SGLang's kernels as the `sglang` backend: its Triton attention (split-KV decode, extend over a
prefix, merge_state) and its GDN Triton kernels (gating, causal conv1d, decode, chunked extend,
target verify), driven through the installed package (sglang 0.5.10.post1), never copied.

Import-guarded: without sglang (or the small modules its kernel files import) the backend is listed
with the reason and how to install it (tools/install-deployed.sh, docs/deployed.md), and every case
is a skip. Conversions to SGLang's conventions are in conventions.py (token-level tables, window,
split rule, state layout), done in `prepare`. On the CPU the kernels run in Triton's interpreter
(TRITON_INTERPRET=1).
"""

from __future__ import annotations

from attnbench.backend import Backend, register_backend
from attnbench.kernels.sglang import _lib

ATTENTION_OPS = ("decode", "extend", "merge_state")
GDN_OPS = ("gdn_gating", "causal_conv1d", "gdn_decode", "gdn_extend", "gdn_verify")


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@register_backend("sglang")
class SGLangBackend(Backend):
    description = f"SGLang {_lib.PINNED} Triton kernels: split-KV decode, extend, merge_state, GDN"

    def available(self) -> str | None:
        why = _lib.missing()
        if why:
            return why
        import torch

        if not torch.cuda.is_available() and not _interpreting():
            return "no CUDA device (set TRITON_INTERPRET=1 to run SGLang's Triton kernels in the CPU interpreter)"
        return None

    def supports(self, case) -> str | None:
        why = super().supports(case)
        if why:
            return why
        if not case.on_cuda and not _interpreting():
            return f"case on {case.device}: Triton runs on CUDA (or set TRITON_INTERPRET=1 for the CPU)"
        if case.op_name in ATTENTION_OPS:
            from attnbench.kernels.sglang.attention import attention_unsupported

            return attention_unsupported(case)
        from attnbench.kernels.sglang.gdn import gdn_unsupported

        return gdn_unsupported(case)

    def prepare_decode(self, case, x):
        from attnbench.kernels.sglang import attention

        return attention.prepare_decode(case, x)

    def prepare_extend(self, case, x):
        from attnbench.kernels.sglang import attention

        return attention.prepare_extend(case, x)

    def prepare_merge_state(self, case, x):
        from attnbench.kernels.sglang import attention

        return attention.prepare_merge_state(case, x)

    def prepare_gdn_gating(self, case, x):
        from attnbench.kernels.sglang import gdn

        return gdn.prepare_gating(case, x)

    def prepare_causal_conv1d(self, case, x):
        from attnbench.kernels.sglang import gdn

        return gdn.prepare_conv(case, x)

    def prepare_gdn_decode(self, case, x):
        from attnbench.kernels.sglang import gdn

        return gdn.prepare_decode(case, x)

    def prepare_gdn_extend(self, case, x):
        from attnbench.kernels.sglang import gdn

        return gdn.prepare_extend(case, x)

    def prepare_gdn_verify(self, case, x):
        from attnbench.kernels.sglang import gdn

        return gdn.prepare_verify(case, x)
