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
from attnbench.launch_hiding import HostTime, timed_call

C = TypeVar("C")
_BEST: dict[Hashable, object] = {}


def enabled(device: torch.device) -> bool:
    """Autotuning runs on CUDA, outside the interpreter, unless ATTNBENCH_TRITON_AUTOTUNE=0."""
    off = os.environ.get("ATTNBENCH_TRITON_AUTOTUNE", "1") == "0"
    return device.type == "cuda" and not interpreting() and not off


MARGIN = 0.03  # another config must beat the heuristic's choice by this much to replace it
ROUNDS, REPS = 3, 5  # candidates timed round-robin: drift in clocks or power hits them all alike


def _times_us(fn: Callable[[], object], reps: int, host: HostTime, name: int) -> list[float]:
    """`reps` calls between CUDA events, each after a GPU spin that outlasts the call's host side
    (`attnbench.launch_hiding`): the kernels' time, not the launcher's (a candidate that syncs on the
    host gets no spin)."""
    device = torch.device("cuda", torch.cuda.current_device())
    if not host.probed(name):
        host.probe(name, fn, device)
    times = []
    for _ in range(reps):
        e0, e1 = timed_call(fn, device, host, name)
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    return times


def pick(key: Hashable, candidates: Sequence[C], build: Callable[[C], Callable[[], object]]) -> tuple[C, dict]:
    """The fastest candidate (cached under `key`) and a record of what was measured.

    Candidates are timed round-robin (ROUNDS x REPS calls each, medians compared). The heuristic's
    choice (the first) stays unless another is faster by more than MARGIN: near-ties then resolve
    the same way in every run, so a repeated sweep does not flip configs on measurement noise.

    Args:
        key: what the choice depends on (head dims, flags, dtype, page size).
        candidates: configs to try, the heuristic's choice first (it wins ties and failures).
        build: returns a zero-argument launch for a config; it may raise (e.g. out of shared memory),
            which drops that candidate.
    """
    if key in _BEST:
        return _BEST[key], {"autotune": "cached"}
    measured: dict[str, float | str] = {}
    launches: dict[int, Callable[[], object]] = {}
    for i, cfg in enumerate(candidates):
        try:
            fn = build(cfg)
            fn()  # compiles; caches and clocks settle
            torch.cuda.synchronize()
            launches[i] = fn
        except Exception as e:  # a config the device cannot run is not a candidate
            measured[repr(candidates[i])] = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
    times: dict[int, list[float]] = {i: [] for i in launches}
    host = HostTime()
    for _ in range(ROUNDS):
        for i, fn in launches.items():
            times[i] += _times_us(fn, REPS, host, i)
    med = {i: statistics.median(t) for i, t in times.items()}
    for i, us in med.items():
        measured[repr(candidates[i])] = round(us, 2)
    best = 0 if 0 in med else min(med, key=med.get, default=0)
    fastest = min(med, key=med.get, default=best)
    if best in med and med[fastest] < (1 - MARGIN) * med[best]:
        best = fastest
    _BEST[key] = candidates[best]
    return candidates[best], {"autotune_us": measured}
