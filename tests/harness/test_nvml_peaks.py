"""NVML snapshots and throttle rules with a fake NVML; peaks cache, spec sheet and roofline arithmetic."""

from __future__ import annotations

import json

import pytest

from attnbench.run import nvml, peaks


class FakeNvml:
    """The pynvml calls attnbench.run.nvml uses, with settable values."""

    def __init__(self, sm=1980, mem=2619, reasons=0, fail=()):
        self.sm, self.mem, self.reasons, self.fail = sm, mem, reasons, set(fail)

    def _maybe_fail(self, name):
        if name in self.fail:
            raise RuntimeError(f"{name}: not supported")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        raise RuntimeError("no uuid on a CPU machine")

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"handle{i}"

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self.sm if kind == nvml.CLOCK_SM else self.mem

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980 if kind == nvml.CLOCK_SM else 2619

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 61

    def nvmlDeviceGetPowerUsage(self, h):
        self._maybe_fail("power")
        return 512_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.reasons


def test_snapshot_fields():
    m = nvml.monitor("cuda:0", lib=FakeNvml(reasons=0x1))
    snap = m.snapshot()
    assert snap == {
        "sm_mhz": 1980,
        "mem_mhz": 2619,
        "sm_max_mhz": 1980,
        "mem_max_mhz": 2619,
        "temp_c": 61,
        "power_w": 512.0,
        "power_limit_w": 700.0,
        "reasons": ["gpu idle"],
        "reasons_mask": 1,
    }


def test_unsupported_field_is_none_not_an_error():
    snap = nvml.Monitor(FakeNvml(fail={"power"}), "h").snapshot()
    assert snap["power_w"] is None and snap["sm_mhz"] == 1980


@pytest.mark.parametrize(
    "sm, reasons, throttled",
    [
        (1980, 0x0, None),
        (1980, 0x1, None),  # idle
        (1410, 0x2, None),  # the user's own application clocks (nvidia-smi -lgc): not throttling
        (600, 0x1, None),  # low clock while idle
        (1980, 0x4, None),  # power cap reported, clock still at max (seen on an H200): not throttled
        (1700, 0x4, "sw power cap"),  # below 97% of max
        (1980, 0x20 | 0x40, "sw thermal slowdown, hw thermal slowdown"),
        (1400, 0x0, "SM clock 1400 MHz < 75% of max 1980 MHz"),
        (1500, 0x0, None),
    ],
)
def test_throttle_rule(sm, reasons, throttled):
    snap = nvml.Monitor(FakeNvml(sm=sm, reasons=reasons), "h").snapshot()
    assert nvml.throttle_reason(snap) == throttled


def test_no_monitor_on_cpu():
    assert nvml.monitor("cpu") is None
    assert nvml.throttle_reason(None) is None


def test_spec_sheet_matches_torch_device_names():
    cases = {
        "NVIDIA H100 80GB HBM3": "H100 SXM",
        "NVIDIA H100 PCIe": "H100 PCIe",
        "NVIDIA H100 NVL": "H100 NVL",
        "NVIDIA H200": "H200 SXM",
        "NVIDIA H200 NVL": "H200 NVL",
        "NVIDIA H20": "H20",
        "NVIDIA A100-SXM4-80GB": "A100 SXM 80GB",
        "NVIDIA A100-SXM4-40GB": "A100 40GB",
        "NVIDIA A100 80GB PCIe": "A100 PCIe 80GB",
        "NVIDIA B200": "B200 SXM",
        "NVIDIA GB200": "GB200 (per GPU)",
        "NVIDIA L40S": "L40S",
        "NVIDIA L4": "L4",
    }
    for name, spec in cases.items():
        assert peaks.spec_for(name).name == spec, name
    assert peaks.spec_for("NVIDIA GeForce GTX 1080") is None


def test_peaks_are_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(peaks.torch.cuda, "get_device_name", lambda d: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(peaks, "_driver", lambda: "570.86")
    calls = []

    def fake_measure(device):
        calls.append(device)
        return {"copy_tbps": 2.9, "bf16_tflops": 700.0, "fp16_tflops": 710.0, "fp32_tflops": 50.0}

    first = peaks.get_peaks("cuda:0", measure_fn=fake_measure)
    again = peaks.get_peaks("cuda:0", measure_fn=fake_measure)
    assert len(calls) == 1 and first == again
    assert first["spec"]["name"] == "H100 SXM" and first["measured"]["copy_tbps"] == 2.9
    cached = json.loads((tmp_path / "peaks.json").read_text())
    assert list(cached) == ["NVIDIA H100 80GB HBM3 | driver 570.86"]
    monkeypatch.setattr(peaks, "_driver", lambda: "580.01")  # a new driver measures again
    peaks.get_peaks("cuda:0", measure_fn=fake_measure)
    assert len(calls) == 2
    peaks.get_peaks("cuda:0", refresh=True, measure_fn=fake_measure)
    assert len(calls) == 3


P = {"measured": {"copy_tbps": 3.0, "bf16_tflops": 800.0, "fp16_tflops": 800.0, "fp32_tflops": 50.0}}


def test_roofline_memory_bound():
    # 3 GB at 3 TB/s = 1 ms lower bound; 1 GFLOP at 800 TFLOP/s is negligible; measured 2 ms -> 50%
    r = peaks.roofline(1e9, 3e9, 2e-3, P, "bf16")
    assert r["limiter"] == "memory" and r["bound_us"] == pytest.approx(1000.0)
    assert r["roofline_pct"] == pytest.approx(50.0) and r["intensity"] == pytest.approx(1 / 3)


def test_roofline_compute_bound_uses_the_dtype_peak():
    r = peaks.roofline(8e12, 1e9, 20e-3, P, "bf16")  # 10 ms at 800 TFLOP/s
    assert r["limiter"] == "compute" and r["roofline_pct"] == pytest.approx(50.0)
    r32 = peaks.roofline(1e12, 1e9, 40e-3, P, "fp32")  # 20 ms at 50 TFLOP/s
    assert r32["roofline_pct"] == pytest.approx(50.0)


def test_roofline_without_peaks_gives_intensity_only():
    assert peaks.roofline(4e9, 1e9, 1e-3, None, "bf16") == {"intensity": 4.0}


class FakeLibNvml:
    """Stands in for libnvidia-ml.so.1 under the ctypes binding: C calls writing through pointers."""

    def __getattr__(self, name):
        values = {"nvmlDeviceGetClockInfo": 1755, "nvmlDeviceGetMaxClockInfo": 1980, "nvmlDeviceGetTemperature": 47,
                  "nvmlDeviceGetPowerUsage": 250_000, "nvmlDeviceGetEnforcedPowerLimit": 700_000,
                  "nvmlDeviceGetCurrentClocksEventReasons": 0x4}  # fmt: skip

        def call(*args):
            if name in values:
                args[-1]._obj.value = values[name]
            elif name == "nvmlSystemGetDriverVersion":
                args[0].value = b"570.86.15"
            elif name == "nvmlDeviceGetHandleByUUID":
                return 999  # NVML_ERROR_UNKNOWN: falls back to the index
            return 0

        if name.startswith("nvml"):
            return call
        raise AttributeError(name)


def test_ctypes_binding(monkeypatch):
    monkeypatch.setattr(nvml.ctypes, "CDLL", lambda path: FakeLibNvml())
    lib = nvml._CtypesNvml()
    assert lib.nvmlSystemGetDriverVersion() == "570.86.15"
    m = nvml.monitor("cuda:3", lib=lib)
    snap = m.snapshot()
    assert snap["sm_mhz"] == 1755 and snap["sm_max_mhz"] == 1980 and snap["temp_c"] == 47
    assert snap["power_w"] == 250.0 and snap["power_limit_w"] == 700.0 and snap["reasons"] == ["sw power cap"]
    assert nvml.throttle_reason(snap) == "sw power cap"


def test_without_nvml_there_is_no_monitor(monkeypatch):
    monkeypatch.setattr(nvml, "_library", lambda: None)
    monkeypatch.setattr(nvml, "_MONITORS", {})
    assert nvml.monitor("cuda:0") is None and nvml.driver_version() is None
