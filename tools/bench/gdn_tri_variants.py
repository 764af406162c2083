"""Variants of our Triton GDN T kernel (`gdn_chunk.TriConfig`) as plugin backends, for `attnbench sweep`.

Each variant registers `triton-gdn-tri:<variant>`, a gdn_extend-only backend whose knob reaches the
kernel as a frozen config through `prepare` (bf16/fp16 inputs; float32 always takes `TRI_IEEE`). The
default configuration is the `triton` backend itself. Timing, correctness against float64 and the
error size all come from the sweep (one timer, docs/measurement.md):

    attnbench sweep gdn --op gdn_extend --plugin tools/bench/gdn_tri_variants.py \
        -b triton -b triton-gdn-tri:ieee -b triton-gdn-tri:tf32x3-8w -k t32768

On the CPU (TRITON_INTERPRET=1) the same command runs them on the smoke cases (`sweep smoke`).
"""

from __future__ import annotations

from typing import ClassVar

import attnbench
from attnbench.backend import implements
from attnbench.kernels.triton import TritonBackend, on_device
from attnbench.kernels.triton.gdn_backend import extend_head_dims, prepare_gdn_extend
from attnbench.kernels.triton.gdn_chunk import TriConfig

X3, IEEE = "tf32x3", "ieee"
VARIANTS = {
    "ieee": TriConfig(neumann=IEEE, newton=IEEE, merge=IEEE),
    "ieee-8w": TriConfig(num_warps=8, neumann=IEEE, newton=IEEE, merge=IEEE),
    "tf32x3-8w": TriConfig(num_warps=8),
    "tf32x3-2w": TriConfig(num_warps=2),
    "neumann-tf32": TriConfig(neumann="tf32"),
    "blocks": TriConfig(kk="blocks"),  # the default before one k k^T dot (h100-session15)
    "subst": TriConfig(diag="subst"),
    "blocks-subst": TriConfig(kk="blocks", diag="subst"),
    "subst-8w": TriConfig(num_warps=8, diag="subst"),
    "wu": TriConfig(wu=True),  # W and U from T's blocks in the T kernel (no T round trip, no W/U kernel)
    "wu-8w": TriConfig(num_warps=8, wu=True),
    "wu-subst": TriConfig(diag="subst", wu=True),
    # the default before session 28, without its 128-register cap (sm_90 ptxas: 168 registers, 3 programs an
    # SM instead of 4; 0.5-7.4% slower on every gdn_extend row of the `gdn` suite, h200-session28/extend2)
    "uncapped": TriConfig(),
}


class TriVariant(attnbench.Backend):
    """gdn_extend on our Triton kernels with the T kernel's knobs `tri`."""

    tri: ClassVar[TriConfig]
    fuse_out: ClassVar[str] = ""
    backend_limits = on_device

    def available(self) -> str | None:
        return TritonBackend.available(self)

    @implements("gdn_extend", limits=extend_head_dims)
    def prepare_gdn_extend(self, case, x):
        return prepare_gdn_extend(case, x, self.tri, self.fuse_out)


# the output fused into the state recurrence (gdn_chunk._chunk_state_out_kernel): its q^ k^T block from the
# T kernel ("tri") or computed in the recurrence's loop ("loop"; "wu": W and U there too)
FUSED = {
    "fused": (TriConfig(), "tri"),
    "blocks-fused": (TriConfig(kk="blocks"), "tri"),
    "subst-fused": (TriConfig(diag="subst"), "tri"),
    "fused-loop": (TriConfig(), "loop"),
    "subst-fused-loop": (TriConfig(diag="subst"), "loop"),
    "fused-wu": (TriConfig(), "wu"),
    "subst-fused-wu": (TriConfig(diag="subst"), "wu"),
    "wu-fused-loop": (TriConfig(wu=True), "loop"),
}

for _label, (_tri, _mode) in {**{k: (v, "") for k, v in VARIANTS.items()}, **FUSED}.items():
    _what = f"T kernel {_tri}" + (f", output fused ({_mode})" if _mode else "")
    attnbench.register_backend(f"triton-gdn-tri:{_label}")(
        type(
            f"TriVariant_{_label.replace('-', '_')}",
            (TriVariant,),
            {"tri": _tri, "fuse_out": _mode, "description": _what},
        )
    )
