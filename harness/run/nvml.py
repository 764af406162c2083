"""GPU clocks, temperature, power and throttle reasons from NVML, for the timing loop and the report.

NVML comes from `pynvml` (the nvidia-ml-py package) when it is installed, else from the driver's
own `libnvidia-ml.so.1` through a small ctypes binding of the few calls used here. Without either
(no NVIDIA driver, a CPU machine), `monitor()` returns None and timing goes on without clock data.

A snapshot is a dict: `sm_mhz`, `mem_mhz`, `sm_max_mhz`, `mem_max_mhz`, `temp_c`, `power_w`,
`power_limit_w`, `reasons` (names of the active clock-event reasons) and `reasons_mask`; a field NVML
cannot give on this GPU is None.

Throttling (`throttle_reason`): an active reason other than idle, the user's own application-clock
setting or the display clock setting; or, while the GPU is neither idle nor held at the user's own
application clocks (`nvidia-smi -lgc/-ac`), an SM clock below 75% of its maximum (nvbench's rule).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

CLOCK_SM, CLOCK_MEM = 1, 2
TEMPERATURE_GPU = 0
REASONS = {  # nvml.h nvmlClocksEventReason* bits
    0x1: "gpu idle",
    0x2: "applications clocks setting",
    0x4: "sw power cap",
    0x8: "hw slowdown",
    0x10: "sync boost",
    0x20: "sw thermal slowdown",
    0x40: "hw thermal slowdown",
    0x80: "hw power brake",
    0x100: "display clock setting",
}
IDLE, USER_CLOCKS, SW_POWER_CAP = 0x1, 0x2, 0x4
NOT_THROTTLING = 0x1 | 0x2 | 0x100  # idle, the user's own clock setting, display
MIN_CLOCK_FRACTION = 0.75
# The software power cap is reported while the SM clock still sits at its maximum (seen on an H200:
# "sw power cap" set at 1980 of 1980 MHz on every busy round); it throttles only below this fraction.
POWER_CAP_CLOCK_FRACTION = 0.97


class _CtypesNvml:
    """The pynvml calls this module uses, bound with ctypes to libnvidia-ml.so.1."""

    def __init__(self, path: str = "libnvidia-ml.so.1"):
        self.lib = ctypes.CDLL(path)
        self._call("nvmlInit_v2")

    def _call(self, name: str, *args) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} failed: NVML error {rc}")

    def _uint(self, name: str, *args) -> int:
        v = ctypes.c_uint()
        self._call(name, *args, ctypes.byref(v))
        return v.value

    def nvmlSystemGetDriverVersion(self) -> str:
        buf = ctypes.create_string_buffer(96)
        self._call("nvmlSystemGetDriverVersion", buf, ctypes.c_uint(96))
        return buf.value.decode()

    def nvmlDeviceGetHandleByIndex(self, index: int):
        h = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(h))
        return h

    def nvmlDeviceGetHandleByUUID(self, uuid: str):
        h = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByUUID", ctypes.c_char_p(uuid.encode()), ctypes.byref(h))
        return h

    def nvmlDeviceGetName(self, h) -> str:
        buf = ctypes.create_string_buffer(96)
        self._call("nvmlDeviceGetName", h, buf, ctypes.c_uint(96))
        return buf.value.decode()

    def nvmlDeviceGetClockInfo(self, h, kind: int) -> int:
        return self._uint("nvmlDeviceGetClockInfo", h, ctypes.c_uint(kind))

    def nvmlDeviceGetMaxClockInfo(self, h, kind: int) -> int:
        return self._uint("nvmlDeviceGetMaxClockInfo", h, ctypes.c_uint(kind))

    def nvmlDeviceGetTemperature(self, h, sensor: int) -> int:
        return self._uint("nvmlDeviceGetTemperature", h, ctypes.c_uint(sensor))

    def nvmlDeviceGetPowerUsage(self, h) -> int:
        return self._uint("nvmlDeviceGetPowerUsage", h)

    def nvmlDeviceGetEnforcedPowerLimit(self, h) -> int:
        return self._uint("nvmlDeviceGetEnforcedPowerLimit", h)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h) -> int:
        v = ctypes.c_ulonglong()
        name = "nvmlDeviceGetCurrentClocksEventReasons"
        if not hasattr(self.lib, name):  # drivers before 535
            name = "nvmlDeviceGetCurrentClocksThrottleReasons"
        self._call(name, h, ctypes.byref(v))
        return v.value


@functools.cache
def _library() -> Any | None:
    """pynvml, or the ctypes binding, initialised; None when NVML is not there."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        pass
    try:
        return _CtypesNvml()
    except Exception:
        return None


def driver_version() -> str | None:
    lib = _library()
    if lib is None:
        return None
    try:
        v = lib.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:
        return None


def _reasons(lib, h) -> int:
    fn = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
    return int((fn or lib.nvmlDeviceGetCurrentClocksThrottleReasons)(h))


class Monitor:
    """Snapshots of one GPU's state (see the module docstring for the fields)."""

    def __init__(self, lib, handle):
        self.lib, self.handle = lib, handle
        self.sm_max = self._try(lib.nvmlDeviceGetMaxClockInfo, handle, CLOCK_SM)
        self.mem_max = self._try(lib.nvmlDeviceGetMaxClockInfo, handle, CLOCK_MEM)
        limit = self._try(lib.nvmlDeviceGetEnforcedPowerLimit, handle)
        self.power_limit_w = limit / 1000 if limit is not None else None

    @staticmethod
    def _try(fn, *args):
        try:
            return fn(*args)
        except Exception:
            return None

    def snapshot(self) -> dict:
        lib, h = self.lib, self.handle
        power = self._try(lib.nvmlDeviceGetPowerUsage, h)
        mask = self._try(_reasons, lib, h)
        return {
            "sm_mhz": self._try(lib.nvmlDeviceGetClockInfo, h, CLOCK_SM),
            "mem_mhz": self._try(lib.nvmlDeviceGetClockInfo, h, CLOCK_MEM),
            "sm_max_mhz": self.sm_max,
            "mem_max_mhz": self.mem_max,
            "temp_c": self._try(lib.nvmlDeviceGetTemperature, h, TEMPERATURE_GPU),
            "power_w": power / 1000 if power is not None else None,
            "power_limit_w": self.power_limit_w,
            "reasons": reason_names(mask) if mask is not None else None,
            "reasons_mask": mask,
        }


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in REASONS.items() if mask & bit] + ([f"0x{mask:x}"] if mask & ~0x1FF else [])


def throttle_reason(snap: dict | None) -> str | None:
    """Why the GPU was throttled in this snapshot, or None (see the module docstring)."""
    if not snap:
        return None
    mask = snap.get("reasons_mask") or 0
    sm, top = snap.get("sm_mhz"), snap.get("sm_max_mhz")
    bad = mask & ~NOT_THROTTLING
    if bad == SW_POWER_CAP and sm and top and sm >= POWER_CAP_CLOCK_FRACTION * top:
        bad = 0  # a power cap that has not lowered the clock
    if bad:
        return ", ".join(reason_names(bad))
    if not mask & (IDLE | USER_CLOCKS) and sm and top and sm < MIN_CLOCK_FRACTION * top:
        return f"SM clock {sm} MHz < {MIN_CLOCK_FRACTION:.0%} of max {top} MHz"
    return None


def _handle(lib, device: torch.device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:  # the UUID names the same GPU whatever CUDA_VISIBLE_DEVICES says
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return lib.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    except Exception:
        return lib.nvmlDeviceGetHandleByIndex(index)


_MONITORS: dict[str, Monitor | None] = {}


def monitor(device: torch.device | str, lib: Any | None = None) -> Monitor | None:
    """A Monitor of a CUDA device (cached), or None without NVML or for a non-CUDA device."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    key = f"{device}|{id(lib)}"
    if key not in _MONITORS:
        lib = lib or _library()
        try:
            _MONITORS[key] = Monitor(lib, _handle(lib, device)) if lib is not None else None
        except Exception:
            _MONITORS[key] = None
    return _MONITORS[key]
