"""The `cute` backend: attnbench's own CuTe DSL kernels (decode.py, gdn_decode.py) behind one name."""

from __future__ import annotations

from attnbench.backend import Backend, implements, register_backend
from attnbench.kernels.cute import common


def on_cuda(backend, case) -> str | None:
    if not case.on_cuda:
        return f"our CuTe DSL kernels run on CUDA devices; this case is on {case.device}"
    return None


def decode_limits(backend, case) -> str | None:
    from attnbench.kernels.cute.decode_plan import case_reason

    return case_reason(case)


def gdn_decode_limits(backend, case) -> str | None:
    from attnbench.kernels.cute.gdn_decode import case_reason

    return case_reason(case)


class CuteDecode:
    """Mixin: paged decode (kernels/cute/decode.py). `decode_config`: a frozen `decode.DecodeConfig`
    (None: its DEFAULT), set by variant backends (plugins)."""

    decode_config = None

    @implements(
        "decode",
        limits=decode_limits,
        graph_safe=(
            "the split schedule (work items, merge table, grid) is planned in prepare from the batch's host-side "
            "lengths (decode_plan.plan_splits): a graph replays batch A's key ranges"
        ),
    )
    def prepare_decode(self, case, x):
        from attnbench.kernels.cute import decode

        return decode.prepare(case, x, self.decode_config)


class CuteGDN:
    """Mixin: GDN decode over the state pool (kernels/cute/gdn_decode.py). `gdn_bv`: value columns a
    CTA (None: gdn_decode.BV), set by variant backends."""

    gdn_bv = None

    # graph-safe: its grid comes from the shapes and it reads the slots (negative: padding) on the device
    @implements("gdn_decode", limits=gdn_decode_limits, state_layout="kv", graph_safe=True)
    def prepare_gdn_decode(self, case, x):
        from attnbench.kernels.cute import gdn_decode

        return gdn_decode.prepare(case, x, self.gdn_bv or gdn_decode.BV)


@register_backend("cute")
class CuteBackend(CuteDecode, CuteGDN, Backend):
    description = "our CuTe DSL kernels (nvidia-cutlass-dsl 4.8.1, SIMT): split-KV paged decode, GDN decode"
    backend_limits = on_cuda

    def available(self) -> str | None:
        return common.unavailable()
