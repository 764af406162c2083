"""Timing on a real GPU: CUDA-graph mode and its fallback, NVML, peaks, and the regression gate end to end.

    python -m pytest -m gpu tests/harness/test_timing_gpu.py -v -s      # < 5 minutes on one H100/H200

The end-to-end test runs a slice of the decode suite three times through the sweep service with a
plugin backend ("paced": the torch kernel, optionally followed by torch.cuda._sleep for 10% of its
own time): run 1 and run 2 must compare clean, run 3 (10% slower) must fail the gate. The compare
reports are printed (-s) and left under the pytest tmp dir.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnbench
from attnbench.backend import _INSTANCES, _REGISTRY, Backend
from attnbench.case import Case
from attnbench.launch_hiding import PROBE_US
from attnbench.run.runner import RunOptions, run_case
from attnbench.run.timing import SYNC_NOTE, Rotation, TimingConfig, time_closures

pytestmark = pytest.mark.gpu
DEVICE = "cuda"


def _l2() -> int:
    return torch.cuda.get_device_properties(DEVICE).L2_cache_size


def _copies_of(n_bytes: int):
    """A factory of closures `out = 2 * x + 1` over fresh tensors of n_bytes (bf16), and their inputs."""
    made = []

    def make():
        x = torch.randn(n_bytes // 2, device=DEVICE, dtype=torch.bfloat16)
        out = torch.empty_like(x)
        made.append((x, out))
        return lambda: torch.add(x * 2, 1, out=out)

    return make, made


def test_short_kernels_are_timed_in_cuda_graphs_over_rotated_inputs():
    n_bytes = 2 << 20  # 2 MiB read + 2 MiB written: a few microseconds
    make_a, made_a = _copies_of(n_bytes)
    make_b, made_b = _copies_of(n_bytes)
    closures = {"a": make_a(), "b": make_b()}
    stats = time_closures(
        closures,
        DEVICE,
        TimingConfig(max_s=1.0),
        Rotation({"a": make_a, "b": make_b}, bytes_per_call=2 * n_bytes),
    )
    for name, st in stats.items():
        print(name, st.mode, st.calls_per_sample, st.copies, f"{st.median_us:.2f} us", st.note)
        assert st.mode == "cuda-graph", st.note
        assert st.copies * 2 * n_bytes >= 5 * _l2() and st.working_set_bytes >= 5 * _l2()
        assert st.calls_per_sample % st.copies == 0 and st.n >= 10
        assert 0.5 < st.median_us < 1000
    assert len(made_a) == stats["a"].copies  # one closure per copy, the first one included
    for x, out in made_a:  # every rotated copy really ran
        torch.testing.assert_close(out, x * 2 + 1)


def test_graph_mode_falls_back_for_every_backend_when_one_cannot_be_captured():
    make, _ = _copies_of(2 << 20)
    flag = torch.zeros(1, device=DEVICE)

    def syncing():  # .item() synchronizes: illegal while capturing
        return float(flag.add_(1).item())

    stats = time_closures(
        {"ok": make(), "sync": syncing},
        DEVICE,
        TimingConfig(max_s=0.5),
        Rotation({"ok": make, "sync": lambda: syncing}, bytes_per_call=4 << 20),
    )
    for st in stats.values():
        assert st.mode == "per-call" and "graph capture failed for sync" in st.note, st.note
    torch.cuda.synchronize()  # the context is healthy after the failed capture
    assert torch.randn(4, device=DEVICE).isfinite().all()  # and its random generator (harness/graph_capture.py)


def test_a_failed_capture_leaves_no_never_run_cache_behind():
    """A closure whose library caches a result keyed on its inputs (as FLA's and SGLang's `tensor_cache`
    caches chunk indices from `cu_seqlens`), then syncs on the host: the capture fails after the cache
    took a tensor the capture only recorded. Per call, the timer must not reuse that closure (its cached
    lengths were never computed: SGLang's chunked GDN extend read garbage indices there, h200-session26)."""
    cache: list = []  # one entry: (inputs, result), as tensor_cache keyed on identity

    def lens_of(cu):
        if cache and cache[0][0] is cu:
            return cache[0][1]
        got = cu[1:] - cu[:-1]
        cache[:] = [(cu, got)]
        return got

    def make():
        cu = torch.tensor([0, 3, 8, 15], device=DEVICE, dtype=torch.int32)

        def run():
            total = int(lens_of(cu).sum().item())  # a host sync: illegal while capturing
            assert total == 15, f"cached lengths sum to {total}: a tensor the failed capture never wrote"

        return run

    stats = time_closures({"cached": make()}, DEVICE, TimingConfig(max_s=0.5, graph_below_us=10_000),
                          Rotation({"cached": make}, bytes_per_call=4 << 20))  # fmt: skip
    st = stats["cached"]
    assert st.mode == "per-call" and "graph capture failed for cached" in st.note, st.note


def test_long_kernels_stay_per_call_with_a_cold_l2():
    a = torch.randn(4096, 4096, device=DEVICE, dtype=torch.bfloat16)
    st = time_closures({"mm": lambda: a @ a}, DEVICE)["mm"]
    assert st.mode == "per-call" and st.l2_flush and st.clock == "cuda-events" and st.converged
    assert st.ci95_us[0] <= st.median_us <= st.ci95_us[1] and (st.ci95_us[1] - st.ci95_us[0]) / 2 <= 0.01 * st.median_us


def test_per_call_samples_leave_out_the_host_side_of_a_call():
    """A closure that spends 1 ms in Python before launching a ~20 us kernel is timed at the kernel's time
    in per-call mode (the GPU spin covers the host side: `EventSampler`), and close to its graph replay."""
    import time

    a = torch.randn(1024, 1024, device=DEVICE, dtype=torch.bfloat16)

    def slow_host():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 1e-3:
            pass
        return a @ a

    per_call = TimingConfig(graph_below_us=0)
    st = time_closures({"slow": slow_host, "fast": lambda: a @ a}, DEVICE, per_call)
    assert st["slow"].mode == "per-call" and st["slow"].median_us < 200, st["slow"]
    assert abs(st["slow"].median_us - st["fast"].median_us) <= 0.1 * st["fast"].median_us + 2, st
    off = time_closures({"slow": slow_host}, DEVICE, TimingConfig(graph_below_us=0, hide_launch=False))["slow"]
    assert off.median_us > 900, off  # the host's 1 ms, without the spin
    # a closure that waits for the GPU (.item()) gets no spin to wait out (it would add PROBE_US to every
    # sample), says so, and is timed quickly. Its samples hold its host gaps: they need not converge
    # (H200, 2026-11-28: 36-182 us, median 54).
    synced = time_closures({"item": lambda: (a @ a).sum().item()}, DEVICE, per_call)["item"]
    assert synced.median_us < PROBE_US / 2 and synced.wall_s < 5, synced
    assert SYNC_NOTE in synced.note and SYNC_NOTE not in st["slow"].note, synced.note


def test_nvml_reads_clocks_and_timing_records_them():
    from attnbench.run import nvml

    mon = nvml.monitor(DEVICE)
    assert mon is not None, "NVML could not be loaded (neither pynvml nor libnvidia-ml.so.1)"
    snap = mon.snapshot()
    print(snap, "driver", nvml.driver_version())
    assert snap["sm_mhz"] and snap["sm_max_mhz"] and snap["temp_c"] is not None and snap["reasons"] is not None
    a = torch.randn(2048, 2048, device=DEVICE)
    st = time_closures({"mm": lambda: a @ a}, DEVICE, TimingConfig(max_s=0.5))["mm"]
    assert st.nvml["before"]["sm_mhz"] and st.nvml["after"]["sm_mhz"]
    print("throttled samples:", st.n_throttled, st.throttle)


def test_peaks_are_measured_plausibly_and_cached(tmp_path, monkeypatch):
    from attnbench.run import peaks

    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path))
    p = peaks.get_peaks(DEVICE)
    m, spec = p["measured"], p["spec"]
    print(p)
    assert m["copy_tbps"] > 0.1 and m["bf16_tflops"] > 10 and m["fp16_tflops"] > 10 and m["fp32_tflops"] > 1
    if spec:
        assert 0.4 < m["copy_tbps"] / spec["hbm_tbps"] < 1.1
        assert 0.3 < m["bf16_tflops"] / spec["bf16_tflops"] < 1.1
    assert peaks.get_peaks(DEVICE, measure_fn=lambda d: pytest.fail("measured twice")) == p


# ---- through the runner: a capturable decode backend --------------------------------------------


class Graphable(Backend):
    """Decode for equal lengths without window/cap/sinks in device-only torch ops (capturable in a graph)."""

    def supports(self, case):
        p = case.params
        if case.op_name != "decode" or p.lens != "equal" or p.window >= 0 or p.soft_cap or p.sinks or p.mla:
            return "graphable: plain equal-length decode only"
        return None

    def prepare_decode(self, case, x):
        B, L = len(x.seq_lens_host), x.seq_lens_host[0]
        pages = x.kv_page_indices.view(B, math.ceil(L / x.page_size)).long()
        Hq, Hkv, D = x.q.shape[1], x.k_cache.shape[2], x.q.shape[2]

        def run():
            k = x.k_cache[pages].flatten(1, 2)[:, :L].float()  # [B, L, Hkv, D]
            v = x.v_cache[pages].flatten(1, 2)[:, :L].float()
            s = torch.einsum("bhgd,blhd->bhgl", x.q.float().view(B, Hkv, Hq // Hkv, D), k) * x.sm_scale
            lse = torch.logsumexp(s, -1)
            o = torch.einsum("bhgl,blhd->bhgd", torch.exp(s - lse[..., None]), v)
            x.o.copy_(o.reshape(B, Hq, -1))
            x.lse.copy_(lse.reshape(B, Hq))
            return {"o": x.o, "lse": x.lse}

        return run


@pytest.fixture
def registered():
    names = []

    def reg(name, cls):
        attnbench.register_backend(name)(cls)
        names.append(name)
        return _REGISTRY[name]()

    yield reg
    for n in names:
        _REGISTRY.pop(n, None)
        _INSTANCES.pop(n, None)


def test_runner_times_a_capturable_backend_in_graphs(registered):
    b = registered("graphable", Graphable)
    case = Case.from_id("decode/b4-l1024-h8x8-d128-p16-bf16", DEVICE)
    cfg = TimingConfig(graph_below_us=10_000, max_s=1.0)  # force graph mode whatever the kernel takes
    row = run_case(case, [b], RunOptions(timing=True, timing_config=cfg))[0]
    assert row.status == "pass", row.reason
    t = row.timing
    print(t["mode"], t["copies"], t["calls_per_sample"], t["median_us"], t["note"])
    assert t["mode"] == "cuda-graph" and t["working_set_bytes"] >= 5 * _l2()
    assert row.derived["tbps"] > 0 and row.derived["intensity"] > 0
    assert t["copies"] >= 2 and t["calls_per_sample"] % t["copies"] == 0


# ---- the gate end to end ---------------------------------------------------------------------------

PACE = {"factor": 0.0}
CASES = [f"decode/b{b}-l{n}-h32x8-d128-p16-bf16" for b in (1, 16) for n in (1024, 4096, 8192)]  # of the decode suite


def _cycles_per_us() -> float:
    torch.cuda._sleep(1000)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    torch.cuda._sleep(10**7)
    e1.record()
    torch.cuda.synchronize()
    return 10**7 / (e0.elapsed_time(e1) * 1e3)


def _paced_class():
    from attnbench.kernels.torch import TorchBackend

    class Paced(TorchBackend):
        description = "torch decode, then torch.cuda._sleep for PACE['factor'] of its own median time"

        def prepare_decode(self, case, x):
            inner = super().prepare_decode(case, x)
            if not PACE["factor"]:
                return inner
            cfg = TimingConfig(max_s=0.5, graph_below_us=0)
            med = time_closures({"k": inner}, case.device, cfg)["k"].median_us
            cycles = int(PACE["factor"] * med * _cycles_per_us())

            def run():
                out = inner()
                torch.cuda._sleep(cycles)
                return out

            return run

    return Paced


def test_gate_end_to_end_on_the_decode_suite(registered, tmp_path):
    from attnbench.report import render_all
    from attnbench.report.compare import compare_runs
    from attnbench.report.comparison import write_comparison
    from attnbench.run.sweep import Execution, Selection, execute, plan

    registered("paced", _paced_class())
    runs = {}
    for name, factor in (("base", 0.0), ("again", 0.0), ("slower", 0.10)):
        PACE["factor"] = factor
        p = plan(Selection(device=DEVICE, backends=("paced",), case_ids=tuple(CASES)))
        assert len(p.cases) == 6
        execute(p, tmp_path / name, RunOptions(timing=True), how=Execution(isolate=False))  # registered in-process
        render_all(tmp_path / name)
        runs[name] = tmp_path / name
    clean = compare_runs(runs["base"], runs["again"])
    gate = compare_runs(runs["base"], runs["slower"])
    for label, cmp in (("again", clean), ("slower", gate)):
        write_comparison(cmp, tmp_path / f"compare-{label}")
        print((tmp_path / f"compare-{label}" / "compare.md").read_text())
    assert not clean.regressions, "two runs of the same kernels differ beyond noise"
    slow = [c for c in gate.changes if c.verdict == "slower"]
    # the gate must fail the run; on an H200 it flagged 4 of the 6 cases (b1-l1024 and b1-l4096
    # stayed within their thresholds), none faster
    assert gate.regressions and len(slow) >= len(CASES) // 2, gate.to_dict()["counts"]
    assert not [c for c in gate.changes if c.verdict == "faster"]
    assert all(0.05 < c.change < 0.2 for c in slow)
