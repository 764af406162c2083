"""Names of FlashInfer JIT modules, as the backends report them for `prebuild`."""

from __future__ import annotations

from typing import NamedTuple

import torch


class JitKey(NamedTuple):
    """One FlashInfer JIT module: `kind` in prefill | prefill-independent | decode | mla | cascade | sink."""

    kind: str
    backend: str = ""  # "fa2" | "fa3" (prefill, mla)
    dtype: torch.dtype | None = None
    head_dim_qk: int = 0
    head_dim_vo: int = 0
    sliding_window: bool = False
    soft_cap: bool = False
