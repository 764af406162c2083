"""The `cute` backend: attnbench's own CuTe DSL kernels (decode.py, gdn_decode.py) behind one name."""

from __future__ import annotations

from attnbench.backend import Backend, register_backend
from attnbench.kernels.cute import common


class CuteDecode:
    """Mixin: paged decode (kernels/cute/decode.py)."""

    def prepare_decode(self, case, x):
        from attnbench.kernels.cute import decode

        return decode.prepare(case, x)


class CuteGDN:
    """Mixin: GDN decode over the state pool (kernels/cute/gdn_decode.py)."""

    def prepare_gdn_decode(self, case, x):
        from attnbench.kernels.cute import gdn_decode

        return gdn_decode.prepare(case, x)


@register_backend("cute")
class CuteBackend(CuteDecode, CuteGDN, Backend):
    description = "our CuTe DSL kernels (nvidia-cutlass-dsl 4.8.1, SIMT): split-KV paged decode, GDN decode"

    def available(self) -> str | None:
        return common.unavailable()

    def supports(self, case) -> str | None:
        reason = super().supports(case)
        if reason:
            return reason
        if not case.on_cuda:
            return f"our CuTe DSL kernels run on CUDA devices; this case is on {case.device}"
        return self.case_reason(case)

    @staticmethod
    def case_reason(case) -> str | None:
        """Case-level limits (no GPU needed to decide)."""
        if case.op_name == "decode":
            from attnbench.kernels.cute.decode import case_reason

            return case_reason(case)
        from attnbench.kernels.cute.gdn_decode import case_reason

        return case_reason(case)
