"""Attention-family op contracts: `decode`, `extend`, `merge_state`.

Canonical semantics (docs/conventions.md): paged KV `[P, page_size, Hkv, D]` with CSR page tables, natural
log LSE `[T, Hq]` fp32, GQA head h -> kv head h // (Hq / Hkv), bottom-right causal, window_left W
(W + 1 keys including the query's own), soft cap before masking, sinks as per-head logits in the
denominator only, absorbed MLA (Dk = 576 = 512 latent + 64 rope, Dv = 512, Hkv = 1, V = the latent).

One module per concern: params.py (parameters, case-id fields), inputs.py (`AttentionInputs` and how a
case draws them), op.py (the `decode` and `extend` contracts), smoke.py (their smoke spaces), merge.py
(`merge_state`, whole). The ops are registered in harness/ops/__init__.py.
"""

from attnbench.ops.attention.inputs import FP8, AttentionInputs, dequantize, quantize
from attnbench.ops.attention.merge import MergeStateInputs, MergeStateOp, MergeStateParams
from attnbench.ops.attention.op import DecodeOp, ExtendOp
from attnbench.ops.attention.params import MLA_DK, MLA_DV, MLA_SCALE, AttentionParams, DecodeParams, ExtendParams

__all__ = [
    "FP8",
    "MLA_DK",
    "MLA_DV",
    "MLA_SCALE",
    "AttentionInputs",
    "AttentionParams",
    "DecodeOp",
    "DecodeParams",
    "ExtendOp",
    "ExtendParams",
    "MergeStateInputs",
    "MergeStateOp",
    "MergeStateParams",
    "dequantize",
    "quantize",
]
