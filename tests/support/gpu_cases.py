"""Cases for the GPU backend tests: the smoke suite plus a few GPU-sized ones, under a JIT budget.

FlashInfer compiles one module per (kernel, dtype, head dims, window, soft cap) on first use
(10-90 s each) and FA4 one kernel per static configuration, so a test session that touched every
head dim of the smoke suite on every variant would spend most of its time in nvcc. The default
budget (`ATTNBENCH_JIT_BUDGET=d64`) keeps the cases whose kernels use head dim 64 (plus MLA and
merge_state, which have one shape each); the GPU-sized cases below are chosen inside it and cover
page sizes 1/16/64, GQA/MHA/MQA, partial pages, length mixes, window + sinks, prefix-free prefill and
the ragged+paged cascade. `ATTNBENCH_JIT_BUDGET=all` runs every smoke case. Cases outside the budget
are test skips that say so (the kernels' own skips carry the backend's reason).
"""

from __future__ import annotations

import os

from attnbench.case import Case
from attnbench.plan.suite import load

MLA = "d576x512-p64-mla-scale0.1352337788608801"

GPU_CASES = (
    "decode/b32-l4096-mixed-h64x8-d64-p16-bf16",
    "decode/b8-l2049-skewed-h16x2-d64-p1-bf16",
    "decode/b8-l1000-mixed-h8x8-d64-p64-bf16",
    "decode/b8-l1000-mixed-h16x1-d64-p16-bf16",
    "decode/b4-l1024-h8x8-d64-p128-bf16",  # whole pages of 128: FA4's TMA page loads
    "decode/b16-l4096-mixed-h64x8-d64-p16-swa127-sink-bf16",
    "extend/b4-q512-pre1024-mixed-h64x8-d64-p16-bf16",
    "extend/b1-q2048-pre0-h64x8-d64-p16-kvattend-bf16",
    "extend/b2-q256-pre1024-h64x8-d64-p16-kvattend-bf16",
    "extend/b2-q512-pre512-h64x8-d64-p16-swa127-sink-bf16",
    f"decode/b32-l4096-h128x1-{MLA}-bf16",
    f"extend/b1-q512-pre2048-h128x1-{MLA}-bf16",
    "merge_state/t4096-h32-d128-empty-bf16",
)


# FA4 compiles one kernel per static configuration (GQA group, mask, window, soft cap, sink, paging,
# ...), 10-40 s each: under the default budget it runs these (about nine configurations; the last
# two are skips that cost nothing).
FA4_CASES = (
    "decode/b32-l4096-mixed-h64x8-d64-p16-bf16",
    "decode/b8-l2049-skewed-h16x2-d64-p1-bf16",
    "decode/b4-l1024-h8x8-d64-p128-bf16",
    "decode/b16-l4096-mixed-h64x8-d64-p16-swa127-sink-bf16",
    "decode/b3-l70-skewed-h8x2-d64-p16-swa7-cap5-sink-bf16",
    "extend/b4-q512-pre1024-mixed-h64x8-d64-p16-bf16",
    "extend/b1-q2048-pre0-h64x8-d64-p16-kvattend-bf16",
    "extend/b2-q512-pre512-h64x8-d64-p16-swa127-sink-bf16",
    "extend/b3-q9-pre21-mixed-h8x2-d64-p16-bidirectional-bf16",
    "extend/b3-q9-pre21-mixed-h8x2-d64-p16-custom-bf16",
    "extend/b2-q256-pre1024-h64x8-d64-p16-kvattend-bf16",
)


def budget() -> str:
    return os.environ.get("ATTNBENCH_JIT_BUDGET", "d64")


def cases(device: str = "cuda") -> list[Case]:
    """Smoke cases (with their suite settings) and the GPU-sized ones, by id, without duplicates."""
    out = {c.id: c for c in load("smoke", device).cases}
    for cid in GPU_CASES:
        out.setdefault(Case.from_id(cid, device).id, Case.from_id(cid, device))
    return list(out.values())


def fa4_in_budget(case: Case) -> bool:
    return budget() == "all" or case.id in FA4_CASES


def in_budget(case: Case) -> bool:
    """Whether `case`'s kernels fall inside the JIT budget (by head dims; MLA/merge always do)."""
    if budget() == "all" or case.op_name == "merge_state":
        return True
    p = case.params
    return bool(getattr(p, "mla", False)) or (p.head_dim, p.head_dim_v or p.head_dim) == (64, 64)
