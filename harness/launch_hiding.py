"""Hide a call's host side from CUDA-event timings: the GPU spins before the first event.

A closure's host side (Python, a Triton launcher, a library's wrapper) can outlast its kernels; timed as
`e0.record(); fn(); e1.record()`, the events then hold the host's launch gaps, not the GPU's work. If the
GPU spins (`torch.cuda._sleep`) for longer than the host takes to enqueue the call, every launch is queued
when `e0` fires and the events time the kernels alone, as a CUDA-graph replay runs them. Used by the
harness's per-call timing (`attnbench.run.timing.EventSampler`) and by backends that time candidate
configs at prepare (`attnbench.kernels.triton.tune`): on an H200 (h200-session23) the tuner timed a B64
L1024 decode at 146 us a call where its kernels take 69-78 us, and could not tell its configs apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

PROBE_US = 2000.0  # the probe's GPU wait: a call that returns later waited for the GPU (or is slower on the host)


class HostTime:
    """How long each closure takes to enqueue its work on the host, and whether a GPU wait can hide it.

    `probe`: one call while the GPU spins for `PROBE_US`. A call that returns before the spin ends queued
    its work without waiting for the GPU: its spin from then on is 1.5 x its slowest of the last 8 calls
    + 20 us (at most 1.5 x `PROBE_US` + 20: the measured times cannot run away). One that returns after
    it waited for the GPU (a host sync), or needs more host time than that: no spin."""

    def __init__(self):
        self.seen: dict[str, list[float]] = {}
        self.syncs: set[str] = set()

    def probed(self, name: str) -> bool:
        return name in self.seen or name in self.syncs

    def probe(self, name: str, fn: Callable, device, mhz: float | None = None) -> None:
        torch.cuda.synchronize(device)
        spin(device, PROBE_US, mhz)
        t0 = time.perf_counter()
        fn()
        took = time.perf_counter() - t0
        torch.cuda.synchronize(device)
        if took * 1e6 >= 0.95 * PROBE_US:
            self.syncs.add(name)
        else:
            self.seen[name] = [took]

    def saw(self, name: str, seconds: float) -> None:
        self.seen[name] = [*self.seen.get(name, []), min(seconds, PROBE_US * 1e-6)][-8:]

    def cover_us(self, name: str) -> float:
        """The GPU wait before the first event (0: none)."""
        if name in self.syncs or name not in self.seen:
            return 0.0
        return 1.5 * max(self.seen[name]) * 1e6 + 20.0


def timed_call(fn: Callable, device, host: HostTime | None = None, name=None, mhz: float | None = None):
    """One call of `fn` between two CUDA events `(e0, e1)`, recorded (not waited for). With `host` (whose
    `probe` of `name` has run), the GPU first spins for `host.cover_us(name)`, and the call's host time
    is added to what `host` saw of it."""
    cover = host.cover_us(name) if host else 0.0
    if cover:
        spin(device, cover, mhz)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    t0 = time.perf_counter()
    fn()
    if cover:
        host.saw(name, time.perf_counter() - t0)
    e1.record()
    return e0, e1


_CYCLES_PER_US: dict[str, float] = {}


def spin(device: torch.device, us: float, mhz: float | None = None) -> None:
    """Keep the current stream of `device` busy for at least about `us` microseconds (`torch.cuda._sleep`
    counts SM cycles: `mhz` cycles a microsecond, the SM's top clock from NVML, so a lower clock only makes
    it longer; without NVML, calibrated once a process per device at the clock of that moment)."""
    if mhz:
        torch.cuda._sleep(max(1, int(us * mhz)))
        return
    key = str(device)
    if key not in _CYCLES_PER_US:
        cycles = 1_000_000
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)  # the first launch of the spin kernel, outside the calibration
        e0.record()
        torch.cuda._sleep(cycles)
        e1.record()
        torch.cuda.synchronize(device)
        _CYCLES_PER_US[key] = cycles / max(e0.elapsed_time(e1) * 1e3, 1.0)
    torch.cuda._sleep(max(1, int(us * _CYCLES_PER_US[key])))
