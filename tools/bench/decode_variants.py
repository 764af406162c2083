"""Tilings of our Triton GQA decode kernel (`decode.DecodeConfig`) as plugin backends, for fp8 and bf16 caches.

Each variant registers `triton-dec-<variant>`, a decode-only backend that runs the generic decode kernel
with the variant's config under the default split planner (no on-device tuning), so one sweep times
every tiling beside the tuned `triton` and the peers:

    attnbench sweep tools/bench/decode_fp8.yaml --plugin tools/bench/decode_variants.py \
        -b triton -b 'triton-dec-*' -b flashinfer

Labels: h<block_h>-n<block_n>-w<warps>-s<stages>-c<programs per SM the planner aims at>.
"""

from __future__ import annotations

from typing import ClassVar

import attnbench
from attnbench.backend import implements
from attnbench.errors import Unsupported
from attnbench.kernels.triton import TritonBackend, attention_head_dims, on_device
from attnbench.kernels.triton.decode import DecodeConfig

VARIANTS = {
    f"h{c.block_h}-n{c.block_n}-w{c.num_warps}-s{c.num_stages}-c{c.ctas_per_sm}": c
    for c in (
        DecodeConfig(16, 64, 4, 3, 3),  # the heuristic's choice for GQA 32/8, d128
        DecodeConfig(16, 32, 4, 4, 4),
        DecodeConfig(16, 64, 4, 4, 3),
        DecodeConfig(16, 64, 4, 5, 2),
        DecodeConfig(16, 128, 4, 3, 2),
        DecodeConfig(16, 128, 8, 3, 2),
        DecodeConfig(16, 128, 8, 2, 2),
        DecodeConfig(16, 256, 8, 2, 1),
        DecodeConfig(16, 64, 2, 3, 4),
        DecodeConfig(16, 128, 4, 2, 3),
    )
}


class DecodeVariant(attnbench.Backend):
    """decode on our generic Triton kernel with the variant's tiling and the default split plan."""

    config: ClassVar[DecodeConfig]
    backend_limits = on_device

    def available(self) -> str | None:
        return TritonBackend.available(self)

    @implements("decode", limits=attention_head_dims)
    def prepare_decode(self, case, x):
        from attnbench.kernels.triton import decode as d

        _, Hq, Dk = x.q.shape
        if Hq // x.k_cache.shape[2] >= 64:
            raise Unsupported("MLA-sized head groups: tools/bench/mla_variants.py")
        plan = d.plan_decode(x, config=self.config)
        run = d.bind_decode(x, plan)
        run.info = {"max_splits": max(plan.splits), "config": vars(self.config)}
        return run


for _label, _cfg in VARIANTS.items():
    attnbench.register_backend(f"triton-dec-{_label}")(
        type(
            f"DecodeVariant_{_label.replace('-', '_')}",
            (DecodeVariant,),
            {"config": _cfg, "description": f"decode {_cfg}"},
        )
    )
