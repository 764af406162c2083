"""Prepare-time autotuning: time a few candidate launch configs on the device, keep the fastest.

Used only where a fixed heuristic is least certain and the kernel is long enough for the choice to
matter (long prefills, MLA decode). It runs in `prepare`, never in the timed call; the winner is
cached per process under a key of head dims and feature flags (not lengths or batch), so a suite
tunes each kernel variant once. `ATTNBENCH_TRITON_AUTOTUNE=0` turns it off (fixed heuristics only).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

import torch

from attnbench.kernels.triton.common import interpreting

C = TypeVar("C")
_BEST: dict[Hashable, object] = {}


def enabled(device: torch.device) -> bool:
    """Autotuning runs on CUDA, outside the interpreter, unless ATTNBENCH_TRITON_AUTOTUNE=0."""
    off = os.environ.get("ATTNBENCH_TRITON_AUTOTUNE", "1") == "0"
    return device.type == "cuda" and not interpreting() and not off


def _median_us(fn: Callable[[], object], reps: int = 10) -> float:
    fn()  # warm: compiled already, caches and clocks settle
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(times)


def pick(
    key: Hashable, candidates: Sequence[C], build: Callable[[C], Callable[[], object]]
) -> tuple[C, dict]:
    """The fastest candidate (cached under `key`) and a record of what was measured.

    Args:
        key: what the choice depends on (head dims, flags, dtype, page size).
        candidates: configs to try, the heuristic's choice first (it wins ties and failures).
        build: returns a zero-argument launch for a config; it may raise (e.g. out of shared memory),
            which drops that candidate.
    """
    if key in _BEST:
        return _BEST[key], {"autotune": "cached"}
    measured: dict[str, float | str] = {}
    best, best_us = candidates[0], float("inf")
    for cfg in candidates:
        try:
            us = _median_us(build(cfg))
        except Exception as e:  # a config the device cannot run is not a candidate
            measured[repr(cfg)] = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
            continue
        measured[repr(cfg)] = round(us, 2)
        if us < best_us:
            best, best_us = cfg, us
    _BEST[key] = best
    return best, {"autotune_us": measured}
