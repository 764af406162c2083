"""Variants of our Triton MLA decode kernel (`decode_mla.MLAConfig`, split counts) as plugin backends.

Each variant registers `triton-mla-<variant>`, a decode-only backend that runs the MLA kernel with the
variant's tiling (and, where named, a fixed number of KV splits per request) on the cases the kernel
takes; `triton-mla-generic` runs the generic decode kernel (decode.py) with its own planner, for the
comparison. Timing, correctness against float64 and the error size come from the sweep:

    attnbench sweep targets -k h128x1 --plugin tools/bench/mla_variants.py \
        -b triton -b 'triton-mla-*' -b flashinfer-fa3

On the CPU (TRITON_INTERPRET=1) the same command runs them on smoke's MLA cases (`sweep smoke`).
"""

from __future__ import annotations

from typing import ClassVar

import attnbench
from attnbench.backend import implements
from attnbench.errors import Unsupported
from attnbench.kernels.triton import TritonBackend, attention_head_dims, on_device
from attnbench.kernels.triton.decode_mla import MLAConfig

VARIANTS: dict[str, tuple[MLAConfig | None, int | None]] = {
    "generic": (None, None),
    "n64-tma": (MLAConfig(64, 64, 8, 2, True), None),
    "n64-tma-s1": (MLAConfig(64, 64, 8, 2, True), 1),
    "n64-tma-s2": (MLAConfig(64, 64, 8, 2, True), 2),
    "n64-tma-s4": (MLAConfig(64, 64, 8, 2, True), 4),
    "n32-tma-3st": (MLAConfig(64, 32, 8, 3, True), None),
    "n64-ptr": (MLAConfig(64, 64, 8, 2, False), None),
    "n32-ptr-3st": (MLAConfig(64, 32, 8, 3, False), None),
    "h32-n64-tma-4w": (MLAConfig(32, 64, 4, 2, True), None),
    "n64-tma-ws": (MLAConfig(64, 64, 8, 2, True, True), None),
}


class MLAVariant(attnbench.Backend):
    """decode on our Triton MLA kernel with the variant's tiling and split count."""

    config: ClassVar[MLAConfig | None]
    splits: ClassVar[int | None]
    backend_limits = on_device

    def available(self) -> str | None:
        return TritonBackend.available(self)

    @implements("decode", limits=attention_head_dims)
    def prepare_decode(self, case, x):
        from attnbench.kernels.triton import decode as d
        from attnbench.kernels.triton import decode_mla as m

        if self.config is None:  # the generic kernel and planner
            plan = d.plan_decode(x)
            run = d.bind_decode(x, plan)
            run.info = {"max_splits": max(plan.splits), "config": vars(plan.config)}
            return run
        reason = m.mla_unsupported(x, self.config)
        if reason:
            raise Unsupported(reason)
        plan = m.plan_mla_decode(x, config=self.config, splits=self.splits)
        run = m.bind_mla_decode(x, plan)
        run.info = {"max_splits": max(plan.splits), "config": vars(self.config)}
        return run


for _label, (_cfg, _splits) in VARIANTS.items():
    attnbench.register_backend(f"triton-mla-{_label}")(
        type(
            f"MLAVariant_{_label.replace('-', '_')}",
            (MLAVariant,),
            {"config": _cfg, "splits": _splits, "description": f"MLA decode {_cfg} splits={_splits}"},
        )
    )
