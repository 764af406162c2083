"""The timing loop on the CPU: adaptive stopping, budgets, throttle handling, rotation sizing, statistics."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

import pytest

from attnbench import launch_hiding
from attnbench.run.timing import (
    CPU_CONFIG,
    HostSampler,
    Sampled,
    TimingConfig,
    _finish,
    median_ci,
    rotation_plan,
    sample_until_converged,
    summarize,
    time_closures,
)


class FakeSampler:
    """Samples drawn from a distribution per name, on a fake clock that advances per sample."""

    clock = "fake"

    def __init__(self, dists: dict, clock: list[float] | None = None, per_sample_s: float = 0.0, seed: int = 0):
        self.dists, self.rng = dists, random.Random(seed)
        self.clock_box, self.per_sample_s = clock if clock is not None else [0.0], per_sample_s
        self.rounds = 0

    def round(self, names, size, during=None):
        self.rounds += 1
        out = {n: [self.dists[n](self.rng) for _ in range(size)] for n in names}
        self.clock_box[0] += self.per_sample_s * size * len(names)
        if during:
            during()
        return out


def _noise(mean: float, rel: float):
    return lambda rng: mean * (1 + rng.gauss(0, rel))


def test_stops_as_soon_as_every_median_is_tight():
    cfg = TimingConfig(min_samples=10, max_samples=5000, max_s=1e9, target_ci=0.01, round_size=10)
    s = FakeSampler({"a": _noise(1e-5, 0.001), "b": _noise(2e-5, 0.001)})
    got = sample_until_converged(s, ["a", "b"], cfg, now=lambda: 0.0)
    assert s.rounds == 1  # 0.1% noise: the first 10 samples already give a CI well within 1%
    assert all(len(v) == 10 for v in got.clean.values())


def test_noisy_closure_samples_until_its_ci_is_within_target():
    cfg = TimingConfig(min_samples=10, max_samples=5000, max_s=1e9, target_ci=0.01, round_size=10)
    s = FakeSampler({"quiet": _noise(1e-5, 0.001), "noisy": _noise(1e-5, 0.10)})
    got = sample_until_converged(s, ["quiet", "noisy"], cfg, now=lambda: 0.0)
    n = len(got.clean["noisy"])
    assert 100 < n < 5000  # 10% noise needs a few hundred samples for a +-1% median CI
    lo, hi = median_ci(got.clean["noisy"])
    med = sorted(got.clean["noisy"])[n // 2]
    assert (hi - lo) / 2 <= 0.01 * med
    assert len(got.clean["quiet"]) == n  # interleaved: every closure gets every round


def test_count_budget_bounds_sampling():
    cfg = TimingConfig(min_samples=10, max_samples=60, max_s=1e9, target_ci=0.0001, round_size=10)
    got = sample_until_converged(FakeSampler({"a": _noise(1e-5, 0.2)}), ["a"], cfg, now=lambda: 0.0)
    assert len(got.clean["a"]) == 60


def test_time_budget_bounds_sampling():
    clock = [0.0]
    cfg = TimingConfig(min_samples=10, max_samples=10**6, max_s=0.5, target_ci=0.0001, round_size=10)
    s = FakeSampler({"a": _noise(1e-5, 0.2)}, clock=clock, per_sample_s=0.01)  # 0.1 s of fake time per round
    got = sample_until_converged(s, ["a"], cfg, now=lambda: clock[0])
    assert s.rounds == 6  # rounds start while at most 0.5 s have passed
    assert len(got.clean["a"]) == 60


def test_throttled_rounds_are_set_aside_and_retaken():
    cfg = TimingConfig(min_samples=10, max_samples=40, max_s=1e9, target_ci=0.0001, round_size=10)
    flags = iter(["sw power cap", None, "SM clock 900 MHz < 75% of max 1980 MHz", None] + [None] * 100)
    s = FakeSampler({"a": _noise(1e-5, 0.05)})
    got = sample_until_converged(s, ["a"], cfg, throttle_check=lambda: next(flags), now=lambda: 0.0)
    assert len(got.clean["a"]) == 40 and len(got.throttled["a"]) == 20
    assert got.reasons == ["sw power cap", "SM clock 900 MHz < 75% of max 1980 MHz"]


def test_throttled_samples_are_used_only_when_too_few_clean_ones_remain():
    cfg = TimingConfig(min_samples=10)
    clean, bad = [1e-5] * 20, [2e-5] * 10
    ok = _finish(Sampled({"a": clean}, {"a": bad}, ["sw power cap"]), ["a"], cfg, "cuda-events", True, 0.0, {})
    assert ok["a"].n == 20 and ok["a"].n_throttled == 10 and not ok["a"].throttled
    assert ok["a"].throttle == ["sw power cap"] and ok["a"].median_us == pytest.approx(10.0)
    few = _finish(Sampled({"a": clean[:5]}, {"a": bad}, ["hw slowdown"]), ["a"], cfg, "cuda-events", True, 0.0, {})
    assert few["a"].n == 15 and few["a"].throttled and "throttled samples used" in few["a"].note


def test_summary_statistics():
    samples = [i * 1e-6 for i in range(1, 101)]  # 1..100 us
    st = summarize(samples, "host", False, True)
    assert st.median_us == pytest.approx(50.5)
    assert st.min_us == pytest.approx(1) and st.max_us == pytest.approx(100)
    assert st.p10_us == pytest.approx(10.9) and st.p90_us == pytest.approx(90.1)
    assert st.q1_us == pytest.approx(25.75) and st.q3_us == pytest.approx(75.25)
    assert st.ci95_us[0] < st.median_us < st.ci95_us[1]
    assert st.cv == pytest.approx(st.stdev_us / st.mean_us)
    assert st.n == 100 and st.samples_us[:3] == [1.0, 2.0, 3.0]
    assert st.rcv == pytest.approx(1.4826 * 25 / 50.5)


def test_robust_cv_ignores_outliers():
    rng = random.Random(0)
    samples = [1e-5 * (1 + rng.gauss(0, 0.01)) for _ in range(100)] + [1e-4] * 20  # 17% of samples 10x slower
    st = summarize(samples, "host", False, True)
    assert st.cv > 1.0 and st.rcv < 0.02


def test_median_ci_covers_the_true_median_about_95_percent_of_the_time():
    rng = random.Random(1)
    hits = 0
    for _ in range(400):
        xs = [rng.expovariate(1.0) for _ in range(60)]
        lo, hi = median_ci(xs)
        hits += lo <= 0.6931 <= hi
    assert 0.90 <= hits / 400 <= 0.995


@pytest.mark.parametrize(
    "bytes_per_call, l2, expected",
    [
        (4 << 20, 50 << 20, (63, 63)),  # 4 MiB per call on a 50 MiB L2: 63 copies reach 5x L2
        (300 << 20, 50 << 20, (1, 10)),  # already past 5x L2: no rotation, graph_calls calls
        (30 << 20, 50 << 20, (9, 18)),  # calls: a multiple of the copies, at least graph_calls
    ],
)
def test_rotation_plan_reaches_five_times_l2(bytes_per_call, l2, expected):
    plan = rotation_plan(bytes_per_call, l2, TimingConfig())
    assert plan == expected
    copies, calls = plan
    assert copies * bytes_per_call >= 5 * l2 and calls % copies == 0


def test_rotation_plan_refuses_what_it_cannot_size():
    assert "copies" in rotation_plan(1 << 10, 50 << 20, TimingConfig(max_copies=128))
    assert "byte count" in rotation_plan(0, 50 << 20, TimingConfig())


def test_graph_copies_are_counted_at_the_size_they_clone(monkeypatch):
    """A sliding window reads ~16 MB a call from a 537 MB cache, and each rotated copy clones the whole
    cache: the memory check counts `bytes_per_copy` (h100-session22 `ci2`: counted per call, nine backends'
    copies filled an H100 and vLLM's capture ran out of memory). Memory PyTorch's allocator holds unused
    counts as available (after such a case the device reads nearly full)."""
    import torch

    from attnbench.run import timing

    gib = 2**30
    props = type("P", (), {"L2_cache_size": 50 * 2**20})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (8 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    made = []
    factories = {n: (lambda: made.append(1)) for n in ("a", "b")}
    closures = {n: (lambda: None) for n in ("a", "b")}
    pilot = {n: 20e-6 for n in closures}
    window = timing.Rotation(factories, bytes_per_call=16 * 2**20, bytes_per_copy=0.5 * gib)
    said = timing._capture_graphs(closures, window, "cuda", TimingConfig(), pilot)
    assert isinstance(said, str) and "more input copies per backend need 15.0 GiB, 8.0 GiB free" in said
    assert made == []  # refused before a copy was made
    # the same 15 GiB fit once 40 GiB of the allocator's cached blocks count
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 50 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 10 * gib)
    assert timing.cuda_available_bytes("cuda") == 48 * gib


def test_host_timing_measures_what_the_closure_takes():
    closures = {"2ms": lambda: time.sleep(0.002), "4ms": lambda: time.sleep(0.004)}
    stats = time_closures(closures, "cpu", CPU_CONFIG)
    assert stats["2ms"].clock == "host" and stats["2ms"].mode == "per-call" and not stats["2ms"].l2_flush
    assert 1900 < stats["2ms"].median_us < 4000
    assert stats["4ms"].median_us > stats["2ms"].median_us * 1.5
    assert stats["2ms"].n >= CPU_CONFIG.min_samples and stats["2ms"].nvml is None
    assert stats["2ms"].kernel_s == pytest.approx(sum(stats["2ms"].samples_us) * 1e-6, rel=1e-3)
    assert stats["2ms"].wall_s >= stats["2ms"].kernel_s + stats["4ms"].kernel_s


def test_host_sampler_interleaves_round_robin():
    order = []
    s = HostSampler({"a": lambda: order.append("a"), "b": lambda: order.append("b")})
    s.round(["a", "b"], 3)
    assert order == ["a", "b"] * 3


def test_a_slow_backend_in_graph_mode_replays_one_pass_over_the_copies():
    """Graph mode batches `calls` calls per replay to amortise the events around it; a closure that takes
    `graph_below_us` or more by itself gets one pass over the copies instead (its events cost under a
    percent), and every faster closure keeps the plan's calls."""
    from attnbench.run.timing import TimingConfig, calls_per_replay, rotation_plan

    cfg = TimingConfig()
    copies, calls = rotation_plan(2**20, 50 * 2**20, cfg)
    assert (copies, calls) == (250, 250)
    copies, calls = rotation_plan(2**30, 50 * 2**20, cfg)
    assert (copies, calls) == (1, 10)
    assert calls_per_replay(10e-6, copies, calls, cfg) == 10
    assert calls_per_replay(299e-6, copies, calls, cfg) == 10
    assert calls_per_replay(300e-6, copies, calls, cfg) == 1
    assert calls_per_replay(27e-3, 4, 12, cfg) == 4


class RecordingSampler(FakeSampler):
    """A FakeSampler that records which closures each round sampled."""

    def __init__(self, dists, **kw):
        super().__init__(dists, **kw)
        self.sampled: list[list[str]] = []

    def round(self, names, size, during=None):
        self.sampled.append(list(names))
        return super().round(names, size, during)


def test_a_converged_closure_far_from_all_others_stops_while_close_ones_go_on_interleaved():
    cfg = TimingConfig(min_samples=10, max_samples=5000, max_s=1e9, target_ci=0.01, round_size=10)
    dists = {"fast": _noise(1e-5, 0.05), "close": _noise(1.02e-5, 0.05), "slow": _noise(1e-3, 0.001)}
    s = RecordingSampler(dists)
    got = sample_until_converged(s, list(dists), cfg, now=lambda: 0.0)
    assert got.retired == ["slow"]
    assert len(got.clean["slow"]) == 10  # converged in its first round, 100x the fastest: retired
    assert len(got.clean["fast"]) == len(got.clean["close"]) > 100  # the two that can tie: every round
    assert all(r == ["fast", "close"] for r in s.sampled[1:]) and s.sampled[0] == list(dists)
    stats = _finish(got, list(dists), cfg, "cuda-events", True, 0.0, {})
    assert stats["slow"].retired and stats["slow"].converged and stats["slow"].n == 10
    assert not stats["fast"].retired and not stats["close"].retired


@pytest.mark.parametrize(
    "dists, why",
    [
        ({"fast": _noise(1e-5, 0.05), "slow": _noise(1e-3, 0.2)}, "slow has not converged"),
        ({"fast": _noise(1e-5, 0.05), "slow": _noise(1.5e-5, 0.001)}, "slow is under 2x the fastest"),
        (
            {"fast": _noise(1e-5, 0.05), "slow": _noise(1e-3, 0.001), "slow2": _noise(1e-3, 0.001)},
            "the two slow ones' CIs overlap: they can still tie",
        ),
    ],
)
def test_closures_that_could_still_tie_or_move_keep_every_round(dists, why):
    cfg = TimingConfig(min_samples=10, max_samples=5000, max_s=1e9, target_ci=0.01, round_size=10)
    got = sample_until_converged(FakeSampler(dists), list(dists), cfg, now=lambda: 0.0)
    slow = got.clean["slow"]
    assert "slow" not in got.retired, why
    assert len(slow) == len(got.clean["fast"]) > 10, why


def test_retirement_can_be_turned_off():
    cfg = TimingConfig(min_samples=10, max_samples=5000, max_s=1e9, target_ci=0.01, round_size=10, retire_ratio=0)
    dists = {"fast": _noise(1e-5, 0.05), "slow": _noise(1e-3, 0.001)}
    got = sample_until_converged(FakeSampler(dists), list(dists), cfg, now=lambda: 0.0)
    assert not got.retired and len(got.clean["slow"]) == len(got.clean["fast"]) > 10


def test_count_budget_binds_the_closures_still_sampled():
    clock = [0.0]
    cfg = TimingConfig(min_samples=10, max_samples=60, max_s=100.0, target_ci=0.0001, round_size=10)
    dists = {"fast": _noise(1e-5, 0.2), "slow": _noise(1e-3, 0.0)}  # slow: identical samples, CI of zero width
    s = FakeSampler(dists, clock=clock, per_sample_s=0.01)
    got = sample_until_converged(s, list(dists), cfg, now=lambda: clock[0])
    assert got.retired == ["slow"] and len(got.clean["slow"]) == 10
    assert len(got.clean["fast"]) == 60 and clock[0] < 1.0  # stopped at the count, not at the 100 s budget


def _cuda_sequence(
    monkeypatch, pilot_us: float, capture_fails: bool = False, first_us: float | None = None, syncs=frozenset()
):
    """The steps `time_closures` takes on a CUDA device, with the device's parts stood in for: the
    warm-ups (calls, seconds), the pilot and sampling rounds, the capture and the settle, in order.
    `first_us`: what the warm-up's first calls take (L2 warm; default: the pilot's time)."""
    import torch

    from attnbench.run import timing

    steps: list = []
    first_us = pilot_us if first_us is None else first_us

    class Events:
        def __init__(self, runs, device, flush, calls=None, hide_launch=False, sm_max_mhz=None):
            self.graph = calls is not None
            self.host = SimpleNamespace(syncs=set(syncs)) if hide_launch else None  # `syncs`: found by the probe

        def round(self, names, size, during=None):
            steps.append(("graph round" if self.graph else "round", size))
            return {n: [pilot_us * 1e-6 * (1 + 0.001 * i) for i in range(size)] for n in names}

    def capture(closures, rotation, device, cfg, medians, phases=None):
        steps.append(("capture",))
        if capture_fails:
            return "graph capture failed for b: RuntimeError: a host sync"
        return timing._Graphs({n: (lambda: None) for n in closures}, [], 4, {n: 12 for n in closures}, 1e9)

    def warm_up(closures, calls, s, sync, timed=False):
        steps.append(("warm-up", calls, s))
        return {n: first_us * 1e-6 for n in closures} if timed else {}

    class Flusher:
        def __init__(self, device):
            self.done = 0

        def __call__(self):
            self.done += 1

        def gpu_s(self):
            return 0.0

    monkeypatch.setattr(timing, "_Flusher", Flusher)
    monkeypatch.setattr(timing.nvml, "monitor", lambda device: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(timing, "EventSampler", Events)
    monkeypatch.setattr(timing, "_capture_graphs", capture)
    monkeypatch.setattr(timing, "_settle", lambda replays, s, sync: steps.append(("settle", s)))
    monkeypatch.setattr(timing, "_warm_up", warm_up)
    rotation = timing.Rotation({"a": lambda: None, "b": lambda: None}, 1e6)
    stats = time_closures({"a": lambda: None, "b": lambda: None}, "cuda", TimingConfig(), rotation)
    return steps, stats


def test_graph_mode_warms_up_with_its_settle_replays_only(monkeypatch):
    """Graph mode's samples come after the settle replays, and its pilot only picks the mode and the calls
    per replay: the `warmup_s` of calls per closure that came before that pilot is not taken."""
    steps, stats = _cuda_sequence(monkeypatch, pilot_us=20.0)
    cfg = TimingConfig()
    assert steps[:4] == [
        ("warm-up", cfg.warmup_calls, 0.0),
        ("round", 10),
        ("capture",),
        ("settle", cfg.graph_warmup_s),
    ]
    assert all(s[0] == "graph round" for s in steps[4:]) and stats["a"].mode == "cuda-graph"
    assert stats["a"].n == sum(size for kind, size in steps[4:])  # no pilot sample among them
    phases = stats["a"].phases  # #32: the timing's wall by phase, the same on every closure of the case
    assert set(phases) == {"warm-up", "pilot", "settle", "sampling", "statistics"} and phases == stats["b"].phases
    assert sum(phases.values()) == pytest.approx(stats["a"].wall_s)


def test_long_kernels_are_timed_per_call_as_before(monkeypatch):
    """The first calls take `graph_below_us` or more with a warm L2: `warmup_s` of calls per closure, then
    the pilot, kept as the first samples (the sequence of every per-call case before)."""
    cfg = TimingConfig()
    steps, stats = _cuda_sequence(monkeypatch, pilot_us=500.0)
    assert steps[:3] == [("warm-up", cfg.warmup_calls, 0.0), ("warm-up", 0, cfg.warmup_s), ("round", 10)]
    assert ("capture",) not in steps and stats["a"].mode == "per-call"
    assert stats["a"].n == sum(s[1] for s in steps[2:])  # the pilot's samples kept


def test_a_closure_that_syncs_on_the_host_says_so_in_its_note(monkeypatch):
    """Per-call samples of a closure the probe found waiting for the GPU hold its host gaps: its row says so."""
    _, stats = _cuda_sequence(monkeypatch, pilot_us=500.0, syncs={"b"})
    from attnbench.run.timing import SYNC_NOTE

    assert SYNC_NOTE in stats["b"].note and SYNC_NOTE not in stats["a"].note
    _, stats = _cuda_sequence(monkeypatch, pilot_us=20.0, syncs={"b"})  # graph mode: no host gaps sampled
    assert stats["b"].mode == "cuda-graph" and SYNC_NOTE not in stats["b"].note


@pytest.mark.parametrize("capture_fails", [False, True], ids=["pilot-over-threshold", "capture-failed"])
def test_a_likely_graph_case_that_stays_per_call_retakes_its_pilot_after_the_warm_up(monkeypatch, capture_fails):
    cfg = TimingConfig()
    steps, stats = _cuda_sequence(
        monkeypatch, pilot_us=20.0 if capture_fails else 500.0, capture_fails=capture_fails, first_us=20.0
    )
    warm = steps.index(("warm-up", 0, cfg.warmup_s))
    assert steps[:2] == [("warm-up", cfg.warmup_calls, 0.0), ("round", 10)] and warm >= 2
    assert ("settle", cfg.graph_warmup_s) not in steps and stats["a"].mode == "per-call"
    assert steps[warm + 1] == ("round", 10)
    assert stats["a"].n == sum(s[1] for s in steps[warm + 1 :])  # every sample after the warm-up


def test_per_call_samples_wait_out_the_host_side_of_a_call(monkeypatch):
    """Per-call mode: a probe call while the GPU spins for PROBE_US tells whether the closure queues its
    work without waiting for the GPU; if so, every sample spins after the flush for 1.5 x its slowest recent
    host time + 20 us, then the first event, the call, the second event. A closure that waits for the GPU
    (here: returns after the probe's spin) gets no spin, which it would only wait out; nor do graph replays."""
    import torch

    from attnbench.run import timing
    from helpers import logging_events

    log: list = []
    monkeypatch.setattr(torch.cuda, "Event", logging_events(log, 0.01))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(("spin", cycles)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setitem(launch_hiding._CYCLES_PER_US, "cuda", 2000.0)  # 2 GHz

    now = [0.0]  # the host clock: only the calls move it, so a busy machine cannot change what is measured
    monkeypatch.setattr(launch_hiding, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    def host_for(seconds, name):
        def call():  # Python before its (here: no) launches are all queued
            log.append(name)
            now[0] += seconds

        return call

    quick, syncing = host_for(0.0005, "quick"), host_for(1.2 * launch_hiding.PROBE_US * 1e-6, "syncing")
    sampler = timing.EventSampler({"q": quick, "s": syncing}, "cuda", lambda: log.append("flush"), hide_launch=True)
    sampler.round(["q", "s"], 2)
    probe = ("spin", launch_hiding.PROBE_US * 2000)
    assert log[:4] == [probe, "quick", probe, "syncing"]  # one probe call each, before the samples
    q_spin = log[5]
    assert log[4:9] == ["flush", q_spin, "event", "quick", "event"] and q_spin[0] == "spin"
    assert q_spin[1] / 2000 == pytest.approx(1.5 * 500 + 20)  # 1.5 x its host time + 20 us
    assert log[9:13] == ["flush", "event", "syncing", "event"]  # no spin: it would wait for it
    assert sampler.host.syncs == {"s"}
    log.clear()
    timing.EventSampler({"q": quick}, "cuda", lambda: log.append("flush")).round(["q"], 1)
    assert log == ["flush", "event", "quick", "event"]


def test_the_spin_is_calibrated_once_per_device(monkeypatch):
    import torch

    from helpers import logging_events

    sleeps: list = []
    monkeypatch.setattr(torch.cuda, "Event", logging_events([], 0.5))  # 1e6 cycles took 0.5 ms: 2000 a microsecond
    monkeypatch.setattr(torch.cuda, "_sleep", sleeps.append)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(launch_hiding, "_CYCLES_PER_US", {})
    launch_hiding.spin("cuda:1", 10.0)
    launch_hiding.spin("cuda:1", 30.0)
    assert sleeps == [1_000_000, 1_000_000, 20_000, 60_000]


def test_the_spin_counts_cycles_at_the_top_clock_where_nvml_gives_it(monkeypatch):
    import torch

    sleeps: list = []
    monkeypatch.setattr(torch.cuda, "_sleep", sleeps.append)
    monkeypatch.setattr(launch_hiding, "_CYCLES_PER_US", {})
    launch_hiding.spin("cuda:0", 10.0, mhz=1980)
    assert sleeps == [19_800] and launch_hiding._CYCLES_PER_US == {}  # no calibration
