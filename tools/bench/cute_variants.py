"""Schedule variants of our CuTe DSL kernels as plugin backends, for `attnbench sweep` (GPU only).

`cute-decode:<variant>` runs paged decode with a frozen `decode.DecodeConfig`; `cute-gdn:<variant>`
runs GDN decode with `bv` value columns a CTA. The defaults are the `cute` backend itself. Timing,
bytes and correctness against float64 come from the sweep (one timer, docs/measurement.md):

    attnbench sweep targets --op decode --plugin tools/bench/cute_variants.py \
        -b cute -b cute-decode:vpl1-u4 -b cute-decode:registers -k b64-l4096-h32x8-d128
    attnbench sweep targets --op gdn_decode --plugin tools/bench/cute_variants.py \
        -b cute -b cute-gdn:bv64 -b cute-gdn:bv128 -k b256-h32x32

A before/after of a kernel change is two sweeps (one per commit) and `attnbench compare`.
"""

from __future__ import annotations

import attnbench
from attnbench.kernels.cute.backend import CuteBackend, CuteDecode, CuteGDN
from attnbench.kernels.cute.decode_plan import DecodeConfig

DECODE = {
    "vpl1-u4": DecodeConfig(vecs_per_lane=1),
    "vpl1-u4-s3-minctas4": DecodeConfig(vecs_per_lane=1, async_stages=3, min_ctas=4),
    "vpl2-u1": DecodeConfig(unroll=1),
    "vpl2-u2-s2": DecodeConfig(async_stages=2),
    "registers": DecodeConfig(async_stages=0, pipeline=False, vecs_per_lane=1),
    "8ctas-minsplit256": DecodeConfig(ctas_per_sm=8, min_split=256),  # the default before session 24
}
GDN_BV = {"bv64": 64, "bv128": 128}


class _Variant(attnbench.Backend):
    backend_limits = CuteBackend.backend_limits
    available = CuteBackend.available


for _label, _config in DECODE.items():
    attnbench.register_backend(f"cute-decode:{_label}")(
        type(f"CuteDecode_{_label.replace('-', '_')}", (CuteDecode, _Variant), {
            "decode_config": _config, "description": f"our CuTe decode with {_config}"})
    )  # fmt: skip
for _label, _bv in GDN_BV.items():
    attnbench.register_backend(f"cute-gdn:{_label}")(
        type(f"CuteGDN_{_label}", (CuteGDN, _Variant), {"gdn_bv": _bv, "description": f"our CuTe GDN decode, BV {_bv}"})
    )
