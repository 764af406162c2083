"""Merging two partial attention states in plain PyTorch (float32 math, output in the case dtype)."""

from __future__ import annotations

import torch


def merge_state(x) -> dict[str, torch.Tensor]:
    """`x.v_a, x.v_b [T, H, D]`, `x.s_a, x.s_b [T, H]` natural-log LSE -> writes `x.o`, `x.lse`."""
    m = torch.maximum(x.s_a, x.s_b)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # both empty: keep exp() finite
    wa, wb = torch.exp(x.s_a - m), torch.exp(x.s_b - m)
    total = wa + wb
    inv = torch.where(total > 0, 1.0 / total, torch.zeros_like(total))
    o = x.v_a.float() * (wa * inv)[..., None] + x.v_b.float() * (wb * inv)[..., None]
    x.o.copy_(o)
    x.lse.copy_(torch.where(total > 0, m + torch.log(total), torch.full_like(total, float("-inf"))))
    return {"o": x.o, "lse": x.lse}
