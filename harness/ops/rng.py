"""Device-independent random data: a case id gives the same bits on any device.

Every value is drawn on the CPU from generators seeded by the case seed alone, and the finished
inputs are moved to the case device (`to_device`), so a failure seen on a GPU replays bit for bit on
a laptop. Large draws stay fast: `randn` splits a tensor into chunks of `CHUNK` elements, each from
its own generator seeded from (one draw of the case's stream, chunk index), and fills the chunks on a
thread pool; `randn_many` fills the chunks of many tensors on one pool. The result depends on neither
the thread count nor the device.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from attnbench.buffers import map_fields

CHUNK = 1 << 22  # elements per independently seeded chunk
_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 63) - 1


def _chunk_seed(base: int, k: int) -> int:
    z = (base + (k + 1) * _GOLDEN) & ((1 << 64) - 1)  # splitmix64 finaliser: well-spread chunk seeds
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (z ^ (z >> 31)) & _MASK


def randn(shape, gen: torch.Generator, std: float = 1.0) -> torch.Tensor:
    """N(0, std^2) float32 on the CPU, `shape`, taking one draw from the CPU generator `gen`."""
    (out,) = randn_many([shape], gen, std)
    return out


def randn_many(shapes, gen: torch.Generator, std: float = 1.0) -> list[torch.Tensor]:
    """`[randn(s, gen, std) for s in shapes]`, the same bits, with the chunks of every tensor filled on
    one thread pool: a paged cache drawn request by request is hundreds of one-chunk tensors, which
    one at a time would fill on one core."""
    bases = [int(torch.randint(0, 1 << 62, (), generator=gen)) for _ in shapes]  # in order, as randn takes them
    outs = [torch.empty(math.prod(s), dtype=torch.float32) for s in shapes]
    jobs = [(out, base, k) for out, base in zip(outs, bases) for k in range(max(1, -(-out.numel() // CHUNK)))]

    def fill(job) -> None:
        out, base, k = job
        lo, hi = k * CHUNK, min(out.numel(), (k + 1) * CHUNK)
        g = torch.Generator().manual_seed(_chunk_seed(base, k))
        torch.randn(hi - lo, generator=g, out=out[lo:hi])

    if len(jobs) == 1:
        fill(jobs[0])
    elif jobs:
        with ThreadPoolExecutor(min(len(jobs), os.cpu_count() or 1)) as pool:
            list(pool.map(fill, jobs))
    if std != 1.0:
        for out in outs:
            out.mul_(std)
    return [out.view(s) for out, s in zip(outs, shapes)]


def rand(shape, gen: torch.Generator, lo: float = 0.0, hi: float = 1.0) -> torch.Tensor:
    """U(lo, hi) float32 on the CPU (small tensors: gates, scales)."""
    return torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo


def to_device(inputs: Any, device: torch.device | str) -> Any:
    """The dataclass `inputs` with every tensor moved to `device`, views of one storage kept as views.

    Each distinct storage (canary padding of outputs included) is copied once; tensors are rebuilt on
    the copy with their own offsets, shapes and strides.
    """
    device = torch.device(device)
    moved: dict[int, torch.UntypedStorage] = {}

    def move(t: torch.Tensor) -> torch.Tensor:
        if t.device == device:
            return t
        s = t.untyped_storage()
        if s.data_ptr() not in moved:
            raw = torch.empty(0, dtype=torch.uint8).set_(s)
            moved[s.data_ptr()] = raw.to(device).untyped_storage()
        return torch.empty(0, dtype=t.dtype, device=device).set_(
            moved[s.data_ptr()], t.storage_offset(), t.shape, t.stride()
        )

    return map_fields(inputs, move)  # no reference cycle keeps the moved storages alive (`map_tensors`)
