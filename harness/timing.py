"""The one timing function: every backend of a case is timed the same way, interleaved.

CUDA: each sample is one call of the prepared closure between two CUDA events, after an L2 flush
(a memset of 2x the device's L2, outside the events). Samples are taken round-robin over the
backends of a case, in rounds, until the 95% confidence interval of every median is within
`target_ci` (order-statistic interval, no normality assumed) or the time/count budget runs out.
CPU: the same loop with a host clock (`clock: host`), labelled as such in results and report.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class TimingConfig:
    warmup_s: float = 0.025  # at least this long, and at least `warmup_calls`, before sampling
    warmup_calls: int = 3
    min_samples: int = 10
    max_samples: int = 500
    max_s: float = 2.0  # per case, all backends together (sampling stops there, flagged)
    target_ci: float = 0.01  # half-width of the median's 95% CI, relative
    round_size: int = 10
    flush_l2: bool = True


CPU_CONFIG = TimingConfig(warmup_s=0.0, warmup_calls=1, min_samples=3, max_samples=50, max_s=0.5, target_ci=0.05)


@dataclass
class TimingStats:
    median_us: float
    p10_us: float
    p90_us: float
    min_us: float
    mean_us: float
    cv: float
    ci95_us: tuple[float, float]
    n: int
    clock: str  # "cuda-events" | "host"
    l2_flush: bool
    converged: bool  # the CI target was met within budget

    def to_dict(self) -> dict:
        return asdict(self)


def median_ci(samples: list[float], z: float = 1.96) -> tuple[float, float]:
    """95% confidence interval of the median from order statistics (binomial approximation)."""
    s = sorted(samples)
    n = len(s)
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half))
    return s[lo], s[hi]


def summarize(samples_s: list[float], clock: str, flush: bool, converged: bool) -> TimingStats:
    us = sorted(x * 1e6 for x in samples_s)
    q = statistics.quantiles(us, n=10, method="inclusive") if len(us) > 1 else [us[0]] * 9
    mean = statistics.fmean(us)
    cv = statistics.pstdev(us) / mean if mean > 0 else 0.0
    return TimingStats(
        median_us=statistics.median(us),
        p10_us=q[0],
        p90_us=q[-1],
        min_us=us[0],
        mean_us=mean,
        cv=cv,
        ci95_us=median_ci(us),
        n=len(us),
        clock=clock,
        l2_flush=flush,
        converged=converged,
    )


def _converged(samples: list[float], target: float, minimum: int) -> bool:
    if len(samples) < minimum:
        return False
    lo, hi = median_ci(samples)
    med = statistics.median(samples)
    return med > 0 and (hi - lo) / 2 <= target * med


class _Flusher:
    def __init__(self, device: torch.device):
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        self.buf = torch.empty(max(2 * l2, 1 << 20), dtype=torch.uint8, device=device)

    def __call__(self):
        self.buf.zero_()


def time_closures(
    closures: dict[str, Callable[[], object]], device: torch.device | str, config: TimingConfig | None = None
) -> dict[str, TimingStats]:
    """Median-converged timings of each closure, sampled round-robin (see module docstring)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    cfg = config or (TimingConfig() if cuda else CPU_CONFIG)
    flush = _Flusher(device) if cuda and cfg.flush_l2 else None
    names = list(closures)
    # warm-up: at least warmup_calls calls and warmup_s per closure
    for name in names:
        fn, t0, calls = closures[name], time.perf_counter(), 0
        while calls < cfg.warmup_calls or time.perf_counter() - t0 < cfg.warmup_s:
            fn()
            calls += 1
            if cuda:
                torch.cuda.synchronize(device)
    samples: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    while True:
        if cuda:
            events = {n: [] for n in names}
            for _ in range(cfg.round_size):
                for n in names:
                    if flush:
                        flush()
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    closures[n]()
                    e1.record()
                    events[n].append((e0, e1))
            torch.cuda.synchronize(device)
            for n in names:
                samples[n] += [a.elapsed_time(b) * 1e-3 for a, b in events[n]]
        else:
            for _ in range(cfg.round_size):
                for n in names:
                    t0 = time.perf_counter()
                    closures[n]()
                    samples[n].append(time.perf_counter() - t0)
        done = all(_converged(s, cfg.target_ci, cfg.min_samples) for s in samples.values())
        count = min(len(s) for s in samples.values())
        if done or count >= cfg.max_samples or time.perf_counter() - start > cfg.max_s:
            break
    clock = "cuda-events" if cuda else "host"
    return {
        n: summarize(s, clock, flush is not None, _converged(s, cfg.target_ci, cfg.min_samples))
        for n, s in samples.items()
    }
