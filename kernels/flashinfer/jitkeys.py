"""Names of FlashInfer JIT modules, as the backends report them for `prebuild`."""

from __future__ import annotations

from typing import NamedTuple

import torch


class JitKey(NamedTuple):
    """One FlashInfer JIT module; `prebuild.specs` turns it into the spec the wrapper builds.

    kind: prefill (the fa2 "primary" or the fa3 batch-prefill module, also behind tensor-core
    decode) | prefill-independent (fa2's paged module for K/V caches of different strides, Dk != Dv)
    | decode (CUDA-core) | mla | sink | cascade (merge_state) | packbits (custom-mask packing).
    `dtype` is q's and o's; `kv_dtype` the KV cache's where it differs (fp8 caches), else None.
    """

    kind: str
    backend: str = ""  # "fa2" | "fa3" (prefill, mla, sink)
    dtype: torch.dtype | None = None
    head_dim_qk: int = 0
    head_dim_vo: int = 0
    sliding_window: bool = False
    soft_cap: bool = False
    kv_dtype: torch.dtype | None = None
