"""The one timing function: every backend of a case is timed the same way, interleaved.

CUDA, per-call mode (default): each sample is one call of the prepared closure between two CUDA
events, after an L2 flush (a memset of 2x the device's L2, outside the events) and a GPU wait longer
than the call's host side (`EventSampler`: every launch is queued before the first event fires, so the
events time the GPU's work, not the host's launch gaps).

CUDA, graph mode (short kernels): when the fastest closure of a case has a pilot median under
`graph_below_us`, every closure is captured `calls` times in one CUDA graph, rotating over closures
prepared on distinct copies of the inputs (`Rotation`) so that the rotated working set is at least
`rotate_l2_multiple` x L2; a sample is one graph replay (after a flush) divided by `calls`. If any
closure of the case cannot be captured, or the rotation cannot be sized, every backend of the case
stays in per-call mode, and `note` says why; after a capture that began and failed, on closures prepared
anew from the rotation's factories (`CaptureFailed`: what calls inside a capture made never ran).

Samples are taken round-robin over the backends, in rounds, until the 95% confidence interval of
every median is within `target_ci` (order-statistic interval, no normality assumed) or the time or
count budget runs out (`converged` false). A closure that can no longer tie or swap places with any
other is retired from later rounds (`retired`, `far_apart`): its median has converged, its CI is
disjoint from every other closure's and its median is at least `retire_ratio` x the fastest one's
(e.g. a pure-PyTorch row beside fused kernels); the others go on, interleaved as before. With NVML (attnbench.run.nvml), the GPU's clocks and throttle
reasons are read during and after every round; samples of a throttled round are set aside and
retaken (counted in `n_throttled`, reasons in `throttle`); only when too few clean samples remain
are they used, and `throttled` says so.

CPU: the same loop with a host clock (`clock: host`), labelled as such in results and report.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

import torch

from attnbench.buffers import cuda_available_bytes
from attnbench.errors import describe
from attnbench.graph_capture import capturing
from attnbench.launch_hiding import HostTime, timed_call
from attnbench.run import nvml


@dataclass(frozen=True)
class TimingConfig:
    warmup_s: float = 0.025  # at least this long per closure before per-call samples (graph mode: the settle)
    warmup_calls: int = 3
    min_samples: int = 10
    max_samples: int = 500
    max_s: float = 2.0  # per case, all backends together (sampling stops there, flagged)
    target_ci: float = 0.01  # half-width of the median's 95% CI, relative
    round_size: int = 10
    flush_l2: bool = True
    graph_below_us: float = 300.0  # CUDA-graph mode when the fastest pilot median is below this; 0: never
    graph_calls: int = 10  # calls per graph replay, at least (rounded up to a multiple of the copies)
    graph_warmup_s: float = 0.2  # graph replays before sampling, all backends in turn (clocks and power settle)
    rotate_l2_multiple: float = 5.0  # rotated working set >= this x L2 in graph mode
    max_copies: int = 512  # input copies per backend for rotation, at most
    max_memory_fraction: float = 0.5  # of the free device memory that the copies may take
    retire_ratio: float = 2.0  # a converged closure this x the fastest, CI clear of all others, stops; <= 1: never
    hide_launch: bool = True  # per-call: the GPU waits out each call's host enqueue before the first event


CPU_CONFIG = TimingConfig(
    warmup_s=0.0, warmup_calls=1, min_samples=3, max_samples=50, max_s=0.5, target_ci=0.05, graph_below_us=0
)


@dataclass(frozen=True)
class Rotation:
    """How to get more closures of a case over distinct copies of its inputs (for graph mode).

    `factories[name]()` returns a new prepared closure of backend `name` over a fresh copy of the
    case's inputs; `bytes_per_call` is what one call reads and writes (the op's byte count), which
    sizes the rotation; `bytes_per_copy` is what one such copy allocates at least (the whole inputs it
    clones: a sliding window or a large pool reads far fewer bytes a call than it holds), which the
    memory check counts (None: `bytes_per_call`).
    """

    factories: dict[str, Callable[[], Callable[[], object]]]
    bytes_per_call: float
    bytes_per_copy: float | None = None


@dataclass
class TimingStats:
    """Statistics of one closure's samples (microseconds per call) and how they were taken."""

    median_us: float
    p10_us: float
    p90_us: float
    min_us: float
    mean_us: float
    cv: float  # population standard deviation / mean
    ci95_us: tuple[float, float]  # 95% confidence interval of the median
    n: int
    clock: str  # "cuda-events" | "host"
    l2_flush: bool
    converged: bool  # the CI target was met within budget
    mode: str = "per-call"  # "per-call": one call per sample | "cuda-graph": one replay of `calls_per_sample`
    calls_per_sample: int = 1
    copies: int = 1  # input copies rotated (graph mode)
    working_set_bytes: float | None = None  # bytes touched per rotation cycle (graph mode)
    note: str = ""  # why graph mode was not used, budget notes
    q1_us: float = 0.0
    q3_us: float = 0.0
    max_us: float = 0.0
    stdev_us: float = 0.0
    rcv: float = 0.0  # robust CV: 1.4826 MAD / median (= cv for normal noise; outliers, up to half, do not count)
    n_throttled: int = 0  # samples set aside because the GPU throttled while they ran
    throttled: bool = False  # throttled samples had to be used (too few clean ones)
    throttle: list[str] = field(default_factory=list)  # throttle reasons seen
    retired: bool = False  # sampling stopped before the other closures' (`far_apart`): `n` is what it took
    nvml: dict | None = None  # GPU state before and after sampling (clocks, temperature, power)
    wall_s: float = 0.0  # wall time of the whole timing of the case (all backends: warm-up, pilot, sampling)
    kernel_s: float = 0.0  # time inside this closure's timed windows
    phases: dict[str, float] = field(default_factory=dict)  # `wall_s` by phase (`PHASES`), the case's, seconds
    samples_us: list[float] = field(default_factory=list)  # in the order taken

    def to_dict(self) -> dict:
        return asdict(self)


PHASES = {
    "warm-up": "first calls (lazy init, autotune), then warmup_s of calls per closure",
    "pilot": "a pilot round of each closure (picks the mode and the calls per graph replay)",
    "input copies": "closures prepared on copies of the inputs for the rotation, each called once",
    "graph capture": "capturing the CUDA graphs",
    "settle": "graph replays before sampling (graph_warmup_s: clocks and power settle)",
    "sampling": "the rounds of samples, L2 flushes aside",
    "L2 flushes": "the flush before each sample (its GPU time, times the flushes)",
    "statistics": "NVML reads, samplers' set-up: the rest of the timing's wall",
}  # what each phase of `time_closures` holds; TimingStats.phases sums to its wall_s


@contextlib.contextmanager
def spent(parts: dict[str, float], name: str):
    """Add the seconds the block takes to `parts[name]` (a row's `check_parts`, TimingStats.phases)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        parts[name] = parts.get(name, 0.0) + time.perf_counter() - t0


def median_ci(samples: list[float], z: float = 1.96) -> tuple[float, float]:
    """95% confidence interval of the median from order statistics (binomial approximation)."""
    s = sorted(samples)
    n = len(s)
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half))
    return s[lo], s[hi]


def summarize(samples_s: list[float], clock: str, flush: bool, converged: bool, **extra) -> TimingStats:
    """TimingStats of samples given in seconds per call; `extra` fills the descriptive fields."""
    raw = [x * 1e6 for x in samples_s]
    us = sorted(raw)
    q = statistics.quantiles(us, n=20, method="inclusive") if len(us) > 1 else [us[0]] * 19
    mean = statistics.fmean(us)
    sd = statistics.pstdev(us)
    return TimingStats(
        median_us=statistics.median(us),
        p10_us=q[1],
        p90_us=q[17],
        min_us=us[0],
        mean_us=mean,
        cv=sd / mean if mean > 0 else 0.0,
        ci95_us=median_ci(us),
        n=len(us),
        clock=clock,
        l2_flush=flush,
        converged=converged,
        q1_us=q[4],
        q3_us=q[14],
        max_us=us[-1],
        stdev_us=sd,
        rcv=_robust_cv(us),
        samples_us=[float(f"{x:.6g}") for x in raw],
        **extra,
    )


def _robust_cv(us: list[float]) -> float:
    """1.4826 x median absolute deviation / median: the CV of normal noise, blind to up to half outliers."""
    med = statistics.median(us)
    return 1.4826 * statistics.median(abs(x - med) for x in us) / med if med > 0 else 0.0


def _converged(samples: list[float], target: float, minimum: int) -> bool:
    if len(samples) < minimum:
        return False
    lo, hi = median_ci(samples)
    med = statistics.median(samples)
    return med > 0 and (hi - lo) / 2 <= target * med


# ---- samplers: one round of samples per closure, seconds per call ------------------------------


class Sampler(Protocol):
    """Takes one round: `size` samples of each named closure, round-robin, in seconds per call.

    `during`, when given, is called once while the round's work is still running (GPU samplers call it
    after enqueueing everything and before synchronizing).
    """

    clock: str

    def round(
        self, names: list[str], size: int, during: Callable[[], None] | None = None
    ) -> dict[str, list[float]]: ...


class HostSampler:
    """Host clock around each call (CPU devices)."""

    clock = "host"

    def __init__(self, closures: dict[str, Callable]):
        self.closures = closures

    def round(self, names, size, during=None):
        out = {n: [] for n in names}
        for _ in range(size):
            for n in names:
                t0 = time.perf_counter()
                self.closures[n]()
                out[n].append(time.perf_counter() - t0)
        if during:
            during()
        return out


class EventSampler:
    """CUDA events around each call (or graph replay, divided by `calls[name]`), each after a flush.

    `hide_launch` (per-call mode): between the flush and the first event the GPU spins for longer than
    the closure takes to enqueue its work on the host (`HostTime`), so that every launch of the call is
    queued when the first event fires and the events time the GPU's work only, as a CUDA-graph replay
    runs it. Without it, a closure whose host side (Python, a Triton launcher, a library's wrapper)
    outlasts the flush was timed with its launch gaps: on an H100 (h100-session22 `ci2`) a window decode
    whose kernel takes 15 us under Nsight Compute sampled 17-300 us, median 137 us, 500 samples without
    converging. A closure that waits for the GPU itself (a host sync inside) would wait for the spin
    too: the probe finds it and it gets no spin (its samples hold its gaps, as before)."""

    clock = "cuda-events"

    def __init__(
        self, runs: dict[str, Callable], device: torch.device, flush: Callable | None, calls=None,
        hide_launch: bool = False, sm_max_mhz: float | None = None,
    ):  # fmt: skip
        self.runs, self.device, self.flush = runs, device, flush
        self.calls = calls or {}
        self.host = HostTime() if hide_launch else None
        self.mhz = sm_max_mhz  # the spin in cycles at the SM's top clock: at a lower one it lasts longer

    def round(self, names, size, during=None):
        if self.host:
            for n in names:
                if not self.host.probed(n):
                    self.host.probe(n, self.runs[n], self.device, self.mhz)
        events = {n: [] for n in names}
        for _ in range(size):
            for n in names:
                if self.flush:
                    self.flush()
                events[n].append(timed_call(self.runs[n], self.device, self.host, n, self.mhz))
        if during:
            during()
        torch.cuda.synchronize(self.device)
        return {n: [a.elapsed_time(b) * 1e-3 / self.calls.get(n, 1) for a, b in events[n]] for n in names}


SYNC_NOTE = "waits for the GPU inside the call (a host sync): its samples include its host-side gaps"


class _Flusher:
    """Writes 2x the device's L2; counts its calls (`done`) and times its GPU work once (`gpu_s`)."""

    def __init__(self, device: torch.device):
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        self.buf = torch.empty(max(2 * l2, 1 << 20), dtype=torch.uint8, device=device)
        self.done = 0
        self._gpu_s: float | None = None

    def __call__(self):
        self.buf.zero_()
        self.done += 1

    def gpu_s(self) -> float:
        """The median GPU time of a flush (3 flushes between CUDA events, measured on first use)."""
        if self._gpu_s is None:
            took = []
            for _ in range(3):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                self.buf.zero_()
                e1.record()
                e1.synchronize()
                took.append(e0.elapsed_time(e1) * 1e-3)
            self._gpu_s = statistics.median(took)
        return self._gpu_s


# ---- the adaptive loop ---------------------------------------------------------------------------


@dataclass
class Sampled:
    """What `sample_until_converged` took: clean samples, throttled ones set aside, their reasons, and the
    closures retired early (`far_apart`)."""

    clean: dict[str, list[float]]
    throttled: dict[str, list[float]]
    reasons: list[str]
    retired: list[str] = field(default_factory=list)


def far_apart(name: str, clean: dict[str, list[float]], cfg: TimingConfig) -> bool:
    """Whether closure `name` can stop sampling while the others go on: its median has converged, its 95%
    CI is disjoint from every other closure's, and its median is at least `cfg.retire_ratio` x the
    fastest closure's (<= 1: never; the fastest never retires). More samples would only tighten a median
    that already meets the target: no other closure's CI reaches it, and at twice the fastest it is no
    contender for fastest, nor tied with it (the ranking's threshold, max(3%, 3 x CV), is below 2x for
    any CV under 0.33). Its samples were taken in the same rounds as everyone's up to then."""
    mine = clean[name]
    others = [s for n, s in clean.items() if n != name and s]
    if cfg.retire_ratio <= 1 or not others or not _converged(mine, cfg.target_ci, cfg.min_samples):
        return False
    lo, hi = median_ci(mine)
    med = statistics.median(mine)
    if med < cfg.retire_ratio * min(statistics.median(s) for s in [mine, *others]):
        return False
    for s in others:
        o_lo, o_hi = median_ci(s)
        if o_lo <= hi and lo <= o_hi:
            return False
    return True


def sample_until_converged(
    sampler: Sampler,
    names: list[str],
    cfg: TimingConfig,
    throttle_check: Callable[[], str | None] | None = None,
    now: Callable[[], float] = time.perf_counter,
    start: dict[str, list[float]] | None = None,
) -> Sampled:
    """Rounds of `cfg.round_size` samples per closure until every median's CI meets the target.

    Before each round, closures that are `far_apart` from all others are retired: later rounds sample
    only the rest, still round-robin. Stops at `cfg.max_samples` clean samples of the least-sampled
    closure still sampled, or after `cfg.max_s`.
    `throttle_check` (called during each round, while its work runs, and after it) returns a reason
    when the GPU throttled; that round's samples are set aside.
    `start` seeds the clean samples (a pilot round already taken the same way).
    """
    clean = {n: list((start or {}).get(n, [])) for n in names}
    throttled: dict[str, list[float]] = {n: [] for n in names}
    reasons: list[str] = []
    retired: list[str] = []
    seen: list[str] = []
    during = (lambda: seen.append(throttle_check() or "")) if throttle_check else None
    t0 = now()
    while True:
        if all(_converged(s, cfg.target_ci, cfg.min_samples) for s in clean.values()):
            break
        retired += [n for n in names if n not in retired and far_apart(n, clean, cfg)]
        active = [n for n in names if n not in retired]
        if min(len(clean[n]) for n in active) >= cfg.max_samples or now() - t0 > cfg.max_s:
            break
        seen.clear()
        got = sampler.round(active, cfg.round_size, during)
        why = [w for w in seen if w]
        if throttle_check is not None and (after := throttle_check()):
            why.append(after)
        target = throttled if why else clean
        for n in active:
            target[n] += got[n]
        for w in why:
            if w not in reasons:
                reasons.append(w)
    return Sampled(clean, throttled, reasons, retired)


# ---- CUDA graphs ---------------------------------------------------------------------------------


def rotation_plan(bytes_per_call: float, l2_bytes: int, cfg: TimingConfig) -> tuple[int, int] | str:
    """(copies, calls per graph) so that `copies` x bytes >= rotate_l2_multiple x L2; else why not."""
    if bytes_per_call <= 0:
        return "no byte count to size the input rotation"
    need = cfg.rotate_l2_multiple * l2_bytes
    copies = max(1, math.ceil(need / bytes_per_call))
    if copies > cfg.max_copies:
        need_l2 = f"{cfg.rotate_l2_multiple:g}x L2"
        return f"rotation needs {copies} input copies to reach {need_l2} (max {cfg.max_copies})"
    calls = copies * math.ceil(max(cfg.graph_calls, copies) / copies)
    assert copies * bytes_per_call >= need, "rotated working set below the L2 multiple"
    return copies, calls


def calls_per_replay(pilot_s: float, copies: int, calls: int, cfg: TimingConfig) -> int:
    """Calls per graph replay of a closure whose pilot median is `pilot_s` seconds: the plan's `calls`
    (at least `graph_calls`, over every copy), which amortise the events around a replay; one pass
    over the copies for a closure that takes `graph_below_us` or more on its own, for which that
    overhead is already under a percent (on an H100 the pure-PyTorch rows of `ci`, 27 ms a call beside
    a 10 us leader, were replayed 10 calls a sample: 8.7 of the sweep's 11.1 s of timed kernel time)."""
    return copies if pilot_s * 1e6 >= cfg.graph_below_us else calls


@dataclass
class _Graphs:
    replays: dict[str, Callable[[], None]]
    keep: list  # closures, their inputs and the graphs: alive as long as the replays are used
    copies: int
    calls: dict[str, int]  # calls per replay, per closure (`calls_per_replay`)
    working_set: float


class CaptureFailed(str):
    """Why graph mode was given up after a capture began: the closures called inside it may keep what
    those calls made, which never ran (a library's cache keyed on its inputs, as FLA's and SGLang's
    `tensor_cache` holds chunk indices computed from `cu_seqlens`): used again per call, they read
    memory nothing wrote (h200-session26: an illegal memory access in SGLang's chunked GDN extend)."""


def _capture_graphs(
    closures: dict[str, Callable],
    rotation: Rotation,
    device: torch.device,
    cfg: TimingConfig,
    pilot_s: dict,
    phases: dict[str, float] | None = None,
) -> _Graphs | str:
    """One CUDA graph per closure, `calls_per_replay` calls over rotated input copies; a reason string on
    failure, a `CaptureFailed` one when a capture had begun. `phases` gets the seconds of the "input
    copies" (the rotation's closures, each called once) and of the "graph capture"."""
    phases = {} if phases is None else phases
    plan = rotation_plan(rotation.bytes_per_call, torch.cuda.get_device_properties(device).L2_cache_size, cfg)
    if isinstance(plan, str):
        return plan
    copies, most = plan
    calls = {n: calls_per_replay(pilot_s[n], copies, most, cfg) for n in closures}
    free = cuda_available_bytes(device)
    extra = (copies - 1) * (rotation.bytes_per_copy or rotation.bytes_per_call) * len(closures)
    if extra > cfg.max_memory_fraction * free:
        need, have = extra / 2**30, free / 2**30
        return f"{copies - 1} more input copies per backend need {need:.1f} GiB, {have:.1f} GiB free"
    keep: list = []
    replays: dict[str, Callable[[], None]] = {}
    side = torch.cuda.Stream(device)
    for name, fn in closures.items():
        try:
            with spent(phases, "input copies"):
                fns = [fn] + [rotation.factories[name]() for _ in range(copies - 1)]
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):  # first calls (lazy init, autotune) outside the capture
                    for f in fns:
                        f()
                torch.cuda.current_stream(device).wait_stream(side)
                torch.cuda.synchronize(device)
            with spent(phases, "graph capture"):
                graph = torch.cuda.CUDAGraph()
                with capturing(graph, capture_error_mode="thread_local"):
                    for i in range(calls[name]):
                        fns[i % copies]()
        except Exception as e:  # not capturable, or no memory for the copies
            torch.cuda.synchronize(device)
            return CaptureFailed(f"graph capture failed for {name}: {describe(e, first_line=True)}")
        keep += [fns, graph]
        replays[name] = graph.replay
    return _Graphs(replays, keep, copies, calls, copies * rotation.bytes_per_call)


# ---- the entry point -----------------------------------------------------------------------------


def _warm_up(
    closures: dict[str, Callable], calls: int, seconds: float, sync: Callable[[], None], timed: bool = False
) -> dict[str, float]:
    """Each closure in turn: at least `calls` calls and at least `seconds` of them, each waited for.
    `timed` (a GPU): each call between CUDA events, no L2 flush; returns each closure's median seconds
    per call (else an empty dict)."""
    out: dict[str, float] = {}
    for name, fn in closures.items():
        t0, n, took = time.perf_counter(), 0, []
        while n < calls or time.perf_counter() - t0 < seconds:
            if timed:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                fn()
                e1.record()
                sync()
                took.append(e0.elapsed_time(e1) * 1e-3)
            else:
                fn()
                sync()
            n += 1
        if took:
            out[name] = statistics.median(took)
    return out


def _settle(replays: dict[str, Callable], seconds: float, sync: Callable[[], None]) -> None:
    """Replay every graph in turn for `seconds`: the kernels that were just captured, not the previous
    case's, set the clocks and power draw the samples are taken at."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for replay in replays.values():
            replay()
        sync()


def time_closures(
    closures: dict[str, Callable[[], object]],
    device: torch.device | str,
    config: TimingConfig | None = None,
    rotation: Rotation | None = None,
) -> dict[str, TimingStats]:
    """Median-converged timings of each closure, sampled round-robin (see module docstring)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    cfg = config or (TimingConfig() if cuda else CPU_CONFIG)
    names = list(closures)
    wall0 = time.perf_counter()
    if not cuda:
        phases: dict[str, float] = {}
        with spent(phases, "warm-up"):
            _warm_up(closures, cfg.warmup_calls, cfg.warmup_s, lambda: None)
        with spent(phases, "sampling"):
            got = sample_until_converged(HostSampler(closures), names, cfg)
        return _finish(got, names, cfg, "host", False, wall0, {"mode": "per-call", "phases": phases})

    flush = _Flusher(device) if cfg.flush_l2 else None
    phases = {}
    monitor = nvml.monitor(device)
    before = monitor.snapshot() if monitor else None
    sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
    # The warm-up's first calls (lazy init, autotune out of the pilot), timed: where the fastest closure
    # takes `graph_below_us` or more even with its inputs in L2, the case is timed per call as ever
    # (`warmup_s` of calls per closure, then the pilot, kept as the first samples). Else graph mode is
    # likely, whose samples come after the settle replays: the pilot, which then only picks the mode
    # and the calls per replay, is taken without `warmup_s` of calls first; should the case stay per
    # call after all (the pilot, its L2 flushed, is slower; a capture fails), the warm-up is done then
    # and the pilot taken again after it.
    with spent(phases, "warm-up"):
        first = _warm_up(closures, cfg.warmup_calls, 0.0, sync, timed=True)
        likely_graph = cfg.graph_below_us > 0 and min(first.values()) * 1e6 < cfg.graph_below_us
        if not likely_graph:
            _warm_up(closures, 0, cfg.warmup_s, sync)
    top = (before or {}).get("sm_max_mhz")
    events = EventSampler(closures, device, flush, hide_launch=cfg.hide_launch, sm_max_mhz=top)
    pilot_size = max(3, min(cfg.round_size, cfg.min_samples))
    with spent(phases, "pilot"):
        pilot = events.round(names, pilot_size)
    extra: dict = {"mode": "per-call"}
    sampler: EventSampler = events
    graphs = None
    fresh = False  # closures prepared anew after a failed capture
    medians = {n: statistics.median(s) for n, s in pilot.items()}
    fastest = min(medians.values()) * 1e6
    if cfg.graph_below_us > 0 and fastest < cfg.graph_below_us:
        if rotation:
            graphs = _capture_graphs(closures, rotation, device, cfg, medians, phases=phases)
        else:
            graphs = "no input rotation given"
        if isinstance(graphs, str):
            extra["note"] = f"per-call: {graphs}"
            if isinstance(graphs, CaptureFailed):  # per call on closures no capture has seen, warmed anew
                with spent(phases, "input copies"):
                    closures = {n: rotation.factories[n]() for n in names}
                events = sampler = EventSampler(closures, device, flush, hide_launch=cfg.hide_launch, sm_max_mhz=top)
                fresh = True
            graphs = None
        else:
            with spent(phases, "settle"):
                _settle(graphs.replays, cfg.graph_warmup_s, sync)
            sampler = EventSampler(graphs.replays, device, flush, graphs.calls)
            extra |= {
                "mode": "cuda-graph",
                "calls_per_sample": graphs.calls,
                "copies": graphs.copies,
                "working_set_bytes": graphs.working_set,
            }
            pilot = {}
    if graphs is None and (likely_graph or fresh):  # the warm-up's seconds (and first calls), then the pilot
        with spent(phases, "warm-up"):
            _warm_up(closures, cfg.warmup_calls if fresh else 0, cfg.warmup_s, sync)
        with spent(phases, "pilot"):
            pilot = events.round(names, pilot_size)
    check = (lambda: nvml.throttle_reason(monitor.snapshot())) if monitor else None
    if check and pilot and check():
        pilot = {}  # the pilot ran throttled: do not keep its samples
    flushed = flush.done if flush else 0
    with spent(phases, "sampling"):
        got = sample_until_converged(sampler, names, cfg, check, start=pilot)
    if flush and flush.done > flushed:  # the flushes' GPU time, out of the sampling's wall
        flushes = min(phases["sampling"], (flush.done - flushed) * flush.gpu_s())
        phases["sampling"] -= flushes
        phases["L2 flushes"] = flushes
    extra["nvml"] = {"before": before, "after": monitor.snapshot()} if monitor else None
    extra["phases"] = phases
    host = getattr(sampler, "host", None)  # per-call samples: the closures found to sync on the host
    return _finish(got, names, cfg, "cuda-events", flush is not None, wall0, extra, host.syncs if host else ())


def _finish(
    got: Sampled, names, cfg: TimingConfig, clock: str, flush: bool, wall0: float, extra: dict, syncs=()
):  # fmt: skip
    """The stats of each closure; `syncs`: the closures whose per-call samples hold host gaps (`SYNC_NOTE`)."""
    out = {}
    wall = time.perf_counter() - wall0
    phases = extra.get("phases")
    if phases is not None:  # what no phase holds: NVML reads, set-up, the statistics
        extra = extra | {"phases": phases | {"statistics": max(0.0, wall - sum(phases.values()))}}
    per_call = extra.get("calls_per_sample", 1)  # one count, or one per closure (graph mode)
    for n in names:
        calls = per_call[n] if isinstance(per_call, dict) else per_call
        clean, bad = got.clean[n], got.throttled[n]
        use_bad = len(clean) < cfg.min_samples and bad
        samples = clean + bad if use_bad else clean
        note = extra.get("note", "")
        if n in syncs:
            note = (note + "; " if note else "") + SYNC_NOTE
        if use_bad:
            note = (note + "; " if note else "") + f"{len(bad)} throttled samples used (too few clean ones)"
        out[n] = summarize(
            samples,
            clock,
            flush,
            _converged(samples, cfg.target_ci, cfg.min_samples),
            **(extra | {"note": note, "calls_per_sample": calls}),
            n_throttled=len(bad),
            throttled=bool(use_bad),
            throttle=list(got.reasons),
            retired=n in got.retired,
            wall_s=wall,
            kernel_s=sum(clean + bad) * calls,
        )
    return out


def storage_bytes(obj) -> int:
    """Bytes of the distinct storages behind the tensor fields of a dataclass (an input bundle)."""
    from attnbench.buffers import tensor_fields

    seen: dict[tuple[str, int], int] = {}
    for t in tensor_fields(obj).values():
        s = t.untyped_storage()
        seen[(str(t.device), s.data_ptr())] = s.nbytes()
    return sum(seen.values())
