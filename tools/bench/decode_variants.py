"""Tilings of our Triton GQA decode kernel (`decode.DecodeConfig`) as plugin backends, for fp8 and bf16 caches.

Each variant registers `triton-dec-<variant>`, a decode-only backend that runs the generic decode kernel
with the variant's config under the default split planner (no on-device tuning), so one sweep times
every tiling beside the tuned `triton` and the peers:

    attnbench sweep tools/bench/decode_fp8.yaml --plugin tools/bench/decode_variants.py \
        -b triton -b 'triton-dec-*' -b flashinfer

Labels: h<block_h>-n<block_n>-w<warps>-s<stages>-c<programs per SM the planner aims at>.

`triton-fp8-<dequant>-<tiling>` runs fp8 caches only (others: Unsupported), with
`DecodeConfig.fp8_dequant` set (operand, f16, f16rows, f16bits: how fp8 tiles reach the tensor cores;
see decode.py), so one sweep compares the conversion paths side by side:

    bash tools/bench/gpu_sweep.sh fp8dq 300 tools/bench/decode_fp8.yaml --plugin tools/bench/decode_variants.py \
        -b triton -b 'triton-fp8-*' -b flashinfer

`triton-fused` and `triton-unfused` are the `triton` backend's decode (tuning, planner, MLA kernel and
all) with `DecodeConfig.fused_merge` / `MLAConfig.fused_merge` on and off (the `fused_merge` knob),
so one sweep times the fused merge against the two-launch path whatever the default is:

    bash tools/bench/gpu_sweep.sh fused 300 tools/bench/decode_fused.yaml --plugin tools/bench/decode_variants.py \
        -b triton -b triton-fused -b triton-unfused -b flashinfer -b fa4
"""

from __future__ import annotations

from typing import ClassVar

import attnbench
from attnbench.backend import get_backend, implements
from attnbench.errors import Unsupported
from attnbench.kernels.triton import TritonBackend, attention_head_dims, on_device
from attnbench.kernels.triton.common import kv_fp8_code
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


# fp8 conversion paths x the tilings that won or came close on fp8 (NOTES.md, "fp8 decode tilings")
FP8_VARIANTS = {
    f"{dequant.replace('-', '')}-h{c.block_h}-n{c.block_n}-w{c.num_warps}-s{c.num_stages}-c{c.ctas_per_sm}": DecodeConfig(
        c.block_h, c.block_n, c.num_warps, c.num_stages, c.ctas_per_sm, dequant
    )
    for dequant, tilings in (
        ("operand", [(16, 64, 2, 3, 4)]),  # today's fp8 path at its best tiling (B64+)
        ("f16", [(16, 64, 4, 3, 3)]),
        ("f16-rows", [(16, 64, 4, 3, 3), (16, 64, 2, 3, 4), (16, 128, 4, 3, 2), (16, 64, 4, 4, 3)]),
        ("f16-bits", [(16, 64, 4, 3, 3), (16, 64, 2, 3, 4)]),
    )
    for c in (DecodeConfig(*t) for t in tilings)
}


class DecodeVariant(attnbench.Backend):
    """decode on our generic Triton kernel with the variant's tiling and the default split plan."""

    config: ClassVar[DecodeConfig]
    fp8_only: ClassVar[bool] = False
    backend_limits = on_device

    def available(self) -> str | None:
        return TritonBackend.available(self)

    @implements("decode", limits=attention_head_dims)
    def prepare_decode(self, case, x):
        from attnbench.kernels.triton import decode as d

        _, Hq, Dk = x.q.shape
        if Hq // x.k_cache.shape[2] >= 64:
            raise Unsupported("MLA-sized head groups: tools/bench/mla_variants.py")
        if self.fp8_only and not kv_fp8_code(x.k_cache.dtype):
            raise Unsupported("an fp8 conversion variant: fp8 KV caches only")
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

for _label, _cfg in FP8_VARIANTS.items():
    attnbench.register_backend(f"triton-fp8-{_label}")(
        type(
            f"DecodeFp8Variant_{_label.replace('-', '_')}",
            (DecodeVariant,),
            {"config": _cfg, "fp8_only": True, "description": f"fp8 decode {_cfg}"},
        )
    )


class MergeVariant(attnbench.Backend):
    """decode on the `triton` backend with its `fused_merge` knob set (split requests merged in one launch or two)."""

    fused: ClassVar[int]
    backend_limits = on_device

    def available(self) -> str | None:
        return TritonBackend.available(self)

    @implements("decode", limits=attention_head_dims)
    def prepare_decode(self, case, x):
        return get_backend(f"triton:fused_merge={self.fused}").prepare_decode(case, x)


for _label, _fused in (("fused", 1), ("unfused", 0)):
    attnbench.register_backend(f"triton-{_label}")(
        type(
            f"MergeVariant_{_label}",
            (MergeVariant,),
            {"fused": _fused, "description": f"triton decode, fused_merge={_fused}"},
        )
    )
