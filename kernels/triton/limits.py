"""What the triton backends can run: CUDA cases (or any case under the CPU interpreter), head dims up
to the launch configs' sizes. Imported by the package (which re-exports these names) and by its
kernel modules, so that none of them imports the package itself."""

from __future__ import annotations

import os

MAX_DK, MAX_DV = 576, 512  # the largest head dims the launch configs are sized for (absorbed MLA)

# the backend's extend knobs (`-b "triton:extend_tma=1"`) and their allowed values: declared as Knobs by the
# package, checked again by extend_plan (its compile probe calls plan_extend with knobs directly)
EXTEND_KNOBS = {
    "extend_tma": (0, 1),
    "extend_persistent": (0, 1),
    "extend_block_n": (16, 32, 64, 128),
    "extend_stages": (1, 2, 3, 4),
}

# gdn_decode's streamed kernel (gdn_decode_stream.py): value columns per program (`gdn_stream`) and per step
# of its walk (`gdn_stream_bv`); declared as Knobs by the package, checked again by the launcher
GDN_STREAM_COLS = (16, 32, 64, 128)
GDN_STREAM_TILES = (8, 16, 32)
# gdn_decode's K-last kernel (gdn_decode_vk.py): value rows per program (`gdn_vk`)
GDN_VK_TILES = (8, 16, 32, 64)
# gdn_extend's head groups (`gdn_groups`: gdn_chunk.plan pipelines the state pass of one group behind the next)
GDN_HEAD_GROUPS = (1, 2, 4, 8, 16)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def on_device(backend, case) -> str | None:
    """Every op of the triton backends: a CUDA case, or any case under the CPU interpreter."""
    if not case.on_cuda and not interpreting():
        return f"case on {case.device}: Triton runs on CUDA (or set TRITON_INTERPRET=1 for the CPU)"
    return None


def attention_head_dims(backend, case) -> str | None:
    """decode, extend and tree_verify: the launch configs are sized for head dims up to MAX_DK/MAX_DV."""
    p = case.params
    if p.head_dim > MAX_DK or p.dv > MAX_DV:
        return f"head dims {p.head_dim}/{p.dv}: tiles are sized for at most {MAX_DK}/{MAX_DV}"
    return None
