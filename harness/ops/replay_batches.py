"""The other batch of a CUDA-graph bucket, per op: what the replay check writes into a captured closure.

A server captures decode and verify once per padded batch size and replays the graph on every later
batch of that size, with the new metadata written into the captured tensors in place: other sequence
lengths, page tables, slots, padding rows. The replay check (docs/replay.md) needs, for a case's
inputs `x` (batch A), a batch B that fits the same tensors exactly: every tensor the same shape, dtype
and device. Each graph-captured op's `replay_batch` (harness/ops/base.py) is one function here:

- `decode_batch` (decode, MLA decode): request b takes request b+1's length (so every request's
  length changes), then one page's worth of keys moves from the longest request that can spare it
  to the longest one, which then fills its last page (`other_lengths`). The batch and the total of
  pages stay, so the page table, the pool and every other tensor keep their shapes, while the
  longest request grows past batch A's longest (a kernel that kept A's maximum length, split count
  or grid misses keys). Other data, pages and page order: another seed. Decode has no padding rows
  (every request attends at least one key).
- `gdn_batch` (gdn_decode, gdn_verify): another seed (other slots, data, gates, padding rows), and at
  least one padding request (slot -1) where the batch has two requests or more.

Model weights (`Op.held` as WEIGHTS: sinks, fp8 scales, gate parameters) stay `x`'s: a graph replays
one layer's weights. So do the inputs the case writes (state pools) and those it holds in a backend's
layout (verify's pool): B reads them as A's calls left them (`Op.replay_kept` names them all; every
other field of B depends on the case alone, so the replay check draws B once per case).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from attnbench.buffers import tensor_fields

SEED_STEP = 1_000_003  # batch B's seed: the case's plus this (another draw of every table and value)


def other_lengths(lens: list[int], page_size: int, least: int = 1) -> list[int]:
    """Batch B's per-request lengths for batch A's `lens`: rotated by one request; then `page_size` keys
    moved from the longest request that keeps at least `least` to the longest one; then the longest
    filled to the end of its last page. The sum of the pages (`ceil(L / page_size)`) is A's; the longest
    is longer than A's longest unless no request can spare a page and A's longest fills its pages."""
    out = lens[1:] + lens[:1]
    to = max(range(len(out)), key=lambda i: out[i])
    spare = [i for i in range(len(out)) if i != to and out[i] - page_size >= least]
    if spare:
        donor = max(spare, key=lambda i: out[i])
        out[donor] -= page_size
        out[to] += page_size
    out[to] = -(-out[to] // page_size) * page_size
    return out


def keep_from(b: Any, x: Any, names) -> Any:
    """`b` with the fields `names` (those present) replaced by clones of `x`'s (one tensor named twice,
    as MLA's k_scale and v_scale, one clone)."""
    fields = tensor_fields(x)
    clones: dict[int, torch.Tensor] = {}
    changes = {n: clones.setdefault(id(fields[n]), fields[n].clone()) for n in names if n in fields}
    return dataclasses.replace(b, **changes)


def same_shapes(a: Any, b: Any) -> str | None:
    """None when every tensor field of `b` has the shape, dtype and device of `a`'s (and the same
    fields are tensors), else which one differs."""
    ta, tb = tensor_fields(a), tensor_fields(b)
    if set(ta) != set(tb):
        return f"tensor fields differ: {sorted(set(ta) ^ set(tb))}"
    for n, t in ta.items():
        u = tb[n]
        if (t.shape, t.dtype, t.device) != (u.shape, u.dtype, u.device):
            return f"{n}: {tuple(u.shape)} {u.dtype} against {tuple(t.shape)} {t.dtype}"
        if t.untyped_storage().nbytes() != u.untyped_storage().nbytes():
            return f"{n}: its storage is {u.untyped_storage().nbytes()} bytes against {t.untyped_storage().nbytes()}"
    return None


def decode_batch(op, p, x, dtype: torch.dtype, seed: int):
    """decode's batch B (module docstring): explicit `kv_lens` from `other_lengths`, the same pool."""
    if p.draft_topk > 1:
        return "a draft decode's candidate rows share prefix pages: its tables have no other batch of the same shapes"
    lens = other_lengths(list(x.seq_lens_host), p.page_size)
    data = p.model_dump() | {"kv_lens": tuple(lens), "kv_len": max(lens), "batch": len(lens), "lens": "equal"}
    pb = type(p).model_validate(data)
    b = keep_from(op.make_inputs(pb, dtype, seed + SEED_STEP, x.q.device), x, op.replay_kept(p))
    return (pb, b) if (why := same_shapes(x, b)) is None else f"batch B does not fit batch A's tensors: {why}"


def gdn_batch(op, p, x, dtype: torch.dtype, seed: int):
    """gdn_decode's and gdn_verify's batch B (module docstring): another seed, a padding request."""
    pad = max(p.pad, 1) if p.batch > 1 else p.pad
    pb = type(p).model_validate(p.model_dump() | {"pad": pad})
    b = keep_from(op.make_inputs(pb, dtype, seed + SEED_STEP, x.q.device), x, op.replay_kept(p))
    return (pb, b) if (why := same_shapes(x, b)) is None else f"batch B does not fit batch A's tensors: {why}"
