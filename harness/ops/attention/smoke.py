"""The smoke coverage of `decode` and `extend` (harness/ops/coverage.py): their parameter spaces and the cases
smoke must keep."""

from __future__ import annotations

from attnbench.ops.base import (
    SmokeSpace,
)

# ---- smoke coverage (harness/ops/coverage.py) ------------------------------------------------------
ATTENTION_SMOKE = {
    # (12, 4): a group of 3 with several kv heads, so a kernel that pads the group to a power of two
    # and strides by the padded size reads the wrong heads (one kv head would hide it)
    "heads_q,heads_kv": [(4, 4), (8, 2), (8, 1), (16, 1), (12, 4)],
    "head_dim,head_dim_v": [(64, None), (13, None), (96, 64), (576, 512)],
    "page_size": [1, 16, 64],
    "window": [-1, 6, 90],
    "soft_cap": [0.0, 5.0],
    "sm_scale": [None, 0.09],
    "dtype": ["bf16", "fp16", "fp32"],
}
_REPLAYED = "explicit per-request lengths come from replayed traces (tests/harness/test_trace.py), not from pairs"
_TREES = (
    "per-request draft trees go with explicit lengths (replayed traces: suites/traces/spec.jsonl's mixed batch; "
    "tests/kernels/test_mixed_tree_batch.py)"
)
LARGE_POOLS = "production-size pools past 2^31 elements (int32 offsets) are suites/large.yaml's, on a GPU"
# Batches of variable-length requests reach 5: with 3 or fewer, every request is the first, the second
# (whose offset is request 0's length) or the last (whose offset is total minus its own length), so a
# kernel that derives offsets from request 0 or from the end lands on the right rows by accident.
_DECODE_SMOKE = SmokeSpace(
    # draft decode (draft_topk > 1): (topk, own draft tokens) tied, since a step without candidates is refused;
    # kv_len - step leaves a partial last prefix page at every page size > 1 (the per-candidate copies)
    # kv_len 1024: a multiple of every power-of-two split size (a last split computed as L % split vanishes)
    space=ATTENTION_SMOKE | {"batch": [2, 5], "kv_len": [1, 45, 300, 1024, 4000],
                             "draft_topk,draft_step": [(1, 1), (4, 1), (2, 3)]},
    held={"kv_lens": (None, _REPLAYED), "pool_pages": (None, LARGE_POOLS)},
    seeds=[
        *(
            {"batch": 2, "kv_len": 45, "heads_q,heads_kv": (4, 2), "head_dim,head_dim_v": (dim, None), "page_size": 16}
            for dim in (13, 64, 80, 96, 128, 256)
        ),
        # Long dense sums in 16-bit: thousands of visible keys (no window), diffuse scores (normal), a
        # 16-bit cache and output. Low-precision accumulation shows only where all of these meet, which
        # pairwise coverage does not promise (it may pair the long length with a window or fp8 only).
        *(
            {"batch": 5, "kv_len": 4000, "lens": "mixed", "heads_q,heads_kv": (8, 2), "page_size": 16, "dtype": dt}
            for dt in ("bf16", "fp16")
        ),
        # Sinks over a long dense row: a split-KV kernel must add the sink once, to the merged state, output
        # included; the sink's share of the mass is visible in fp32 over 1024 keys. Every request holds
        # exactly 1024 keys, a multiple of every power-of-two split size.
        {"batch": 2, "kv_len": 1024, "heads_q,heads_kv": (8, 2), "page_size": 16, "sinks": True, "dtype": "fp32"},
    ],
    # case ids that CI expectations (suites/expectations/findings.yaml) name
    seed_ids=[
        *(
            f"decode/b3-l{n}-mixed-h{h}-d128-p{p}-bf16"
            for n in (37, 80)
            for h in ("4x4", "8x1", "8x2")
            for p in (1, 16, 64)
        ),
        "decode/b3-l70-skewed-h8x2-d64-p16-cap5-bf16",
        "decode/b3-l70-skewed-h8x2-d64-p16-swa7-cap5-sink-bf16",
    ],
)  # fmt: skip
_EXTEND_SMOKE = SmokeSpace(
    # q_len 130: a causal query tile of 64 or 128 rows filled, and one more partial one
    space=ATTENTION_SMOKE | {"batch": [2, 5], "q_len": [1, 7, 24, 130], "prefix_len": [0, 21, 120]},
    held={
        "q_lens": (None, _REPLAYED),
        "prefix_lens": (None, _REPLAYED),
        "pool_pages": (None, LARGE_POOLS),
        "trees": (None, _TREES),
    },
    seed_ids=["extend/b2-q8-pre30-h8x2-d64-p1-cap5-bf16", "extend/b2-q8-pre30-h8x2-d64-p1-swa5-cap5-sink-bf16"],
)
