"""Peak copy bandwidth and dense matmul throughput of a GPU: measured once, cached, beside the spec sheet.

Measured (`measure`), with the harness's own timing function (hot L2 does not matter at these sizes):

- `copy_tbps`: a device-to-device copy of a buffer much larger than L2, counting the bytes read plus
  the bytes written (2 x size / time);
- `bf16_tflops`, `fp16_tflops`: torch.matmul of square matrices (the best of 4096, 8192, 16384),
  2 n^3 FLOPs per product; `fp32_tflops` the same in float32 without TF32.

The result is cached in `peaks.json` under the cache root (harness/cacheroot.py: `$ATTNBENCH_CACHE`, default `~/.cache/attnbench`), keyed
by device name and driver version, so a driver update measures again. `roofline()` places a timed
result against these peaks: its lower bound is max(FLOPs / peak FLOP/s, bytes / peak bandwidth), with
the FLOP and byte conventions of the op (docs/conventions.md, "FLOPs and bytes"), and `roofline_pct` = bound / time.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from attnbench.cacheroot import cache_root
from attnbench.run import nvml
from attnbench.run.timing import TimingConfig, time_closures


@dataclass(frozen=True)
class Spec:
    """Datasheet peaks: dense (no sparsity) tensor-core TFLOP/s and HBM TB/s."""

    name: str
    bf16_tflops: float
    fp16_tflops: float
    hbm_tbps: float


# Most specific pattern first; matched against torch's device name (e.g. "NVIDIA H100 80GB HBM3").
SPEC_SHEET: list[tuple[str, Spec]] = [
    (r"GB200", Spec("GB200 (per GPU)", 2500, 2500, 8.0)),
    (r"B200", Spec("B200 SXM", 2250, 2250, 8.0)),
    (r"H200 NVL", Spec("H200 NVL", 835, 835, 4.8)),
    (r"H200", Spec("H200 SXM", 989, 989, 4.8)),
    (r"H100 NVL", Spec("H100 NVL", 835, 835, 3.9)),
    (r"H100 PCIe", Spec("H100 PCIe", 756, 756, 2.0)),
    (r"H100|H800", Spec("H100 SXM", 989, 989, 3.35)),
    (r"H20\b", Spec("H20", 148, 148, 4.0)),
    (r"A100.*(SXM|HBM).*80GB|A100-SXM4-80GB", Spec("A100 SXM 80GB", 312, 312, 2.039)),
    (r"A100.*80GB.*PCIe", Spec("A100 PCIe 80GB", 312, 312, 1.935)),
    (r"A100", Spec("A100 40GB", 312, 312, 1.555)),
    (r"L40S", Spec("L40S", 362, 362, 0.864)),
    (r"\bL4\b", Spec("L4", 121, 121, 0.3)),
]

_DTYPE_KEY = {"bf16": "bf16_tflops", "fp16": "fp16_tflops", "fp32": "fp32_tflops"}
PEAK_CONFIG = TimingConfig(warmup_s=0.1, min_samples=10, max_samples=200, max_s=1.0, flush_l2=False, graph_below_us=0)


def spec_for(device_name: str) -> Spec | None:
    """The spec-sheet entry of a device name, or None for a GPU not in the table."""
    for pattern, spec in SPEC_SHEET:
        if re.search(pattern, device_name):
            return spec
    return None


def _best(device: torch.device, make) -> float:
    """Best median throughput (units/s) over the closures that `make()` yields as (closure, units)."""
    best = 0.0
    for fn, units in make():
        st = time_closures({"peak": fn}, device, PEAK_CONFIG)["peak"]
        best = max(best, units / (st.median_us * 1e-6))
    return best


def measure(device: torch.device | str) -> dict[str, float]:
    """Measured copy bandwidth (TB/s, read + write) and dense matmul TFLOP/s of a CUDA device."""
    device = torch.device(device)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    free, _ = torch.cuda.mem_get_info(device)
    size = int(min(max(1 << 30, 32 * l2), free // 8))

    def copies():
        src = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
        dst = torch.empty_like(src)
        yield (lambda: dst.copy_(src)), 2.0 * size

    def matmuls(dtype, sizes):
        def gen():
            for n in sizes:
                a = torch.randn(n, n, device=device, dtype=dtype)
                b = torch.randn(n, n, device=device, dtype=dtype)
                c = torch.empty(n, n, device=device, dtype=dtype)
                yield (lambda a=a, b=b, c=c: torch.matmul(a, b, out=c)), 2.0 * n**3
                del a, b, c

        return gen

    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        out = {
            "copy_tbps": _best(device, copies) / 1e12,
            "bf16_tflops": _best(device, matmuls(torch.bfloat16, (4096, 8192, 16384))) / 1e12,
            "fp16_tflops": _best(device, matmuls(torch.float16, (4096, 8192, 16384))) / 1e12,
            "fp32_tflops": _best(device, matmuls(torch.float32, (4096, 8192))) / 1e12,
        }
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.cuda.empty_cache()
    return out


def cache_path() -> Path:
    return cache_root() / "peaks.json"


def _driver() -> str:
    v = nvml.driver_version()
    if v:
        return v
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        m = re.search(r"Kernel Module\s+(\S+)", text)
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


def get_peaks(device: torch.device | str, refresh: bool = False, measure_fn=measure) -> dict:
    """Peaks of a CUDA device: from the cache, or measured now (and cached).

    Returns `{"device", "driver", "key", "measured": {copy_tbps, bf16_tflops, fp16_tflops, fp32_tflops},
    "spec": Spec fields or None, "measured_at", "torch"}`.
    """
    device = torch.device(device)
    name = torch.cuda.get_device_name(device)
    driver = _driver()
    key = f"{name} | driver {driver}"
    path = cache_path()
    try:
        cache = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    if refresh or key not in cache:
        spec = spec_for(name)
        cache[key] = {
            "device": name,
            "driver": driver,
            "key": key,
            "measured": measure_fn(device),
            "spec": asdict(spec) if spec else None,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "torch": torch.__version__,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=2))
        tmp.replace(path)
    return cache[key]


def roofline(flops: float, nbytes: float, seconds: float, peaks: dict | None, dtype: str) -> dict:
    """Arithmetic intensity, and (with peaks) the roofline lower bound and the share of it reached.

    `roofline_pct` = 100 x max(flops / peak_flops, bytes / peak_bw) / seconds; `limiter` says which term
    is the larger ("memory" or "compute"). Peaks are the measured ones (`get_peaks()["measured"]`).
    """
    out: dict[str, float | str] = {}
    if nbytes > 0:
        out["intensity"] = flops / nbytes
    m = (peaks or {}).get("measured") or {}
    pf, bw = m.get(_DTYPE_KEY.get(dtype, ""), 0.0), m.get("copy_tbps", 0.0)
    if seconds > 0 and pf > 0 and bw > 0 and (flops > 0 or nbytes > 0):
        t_compute, t_memory = flops / (pf * 1e12), nbytes / (bw * 1e12)
        bound = max(t_compute, t_memory)
        out |= {
            "bound_us": bound * 1e6,
            "roofline_pct": 100.0 * bound / seconds,
            "limiter": "compute" if t_compute >= t_memory else "memory",
        }
    return out
