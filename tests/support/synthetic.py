"""Synthetic result rows and run directories (no kernel runs): for report, export and compare tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

from attnbench.run.timing import summarize
from attnbench.store.results import Result, ResultWriter

PEAKS = {
    "device": "NVIDIA H100 80GB HBM3",
    "driver": "570.86",
    "key": "NVIDIA H100 80GB HBM3 | driver 570.86",
    "measured": {"copy_tbps": 2.95, "bf16_tflops": 720.0, "fp16_tflops": 730.0, "fp32_tflops": 51.0},
    "spec": {"name": "H100 SXM", "bf16_tflops": 989, "fp16_tflops": 989, "hbm_tbps": 3.35},
    "measured_at": "2026-11-20T10:00:00",
    "torch": "2.11.0",
}
ENV = {
    "device": "cuda",
    "gpu": "NVIDIA H100 80GB HBM3",
    "driver": "570.86",
    "cuda": "13.0",
    "l2_mb": 50.0,
    "libraries": {"torch": "2.11.0", "triton": "3.6.0"},
    "peaks": PEAKS,
}
SNAP = {
    "sm_mhz": 1980,
    "mem_mhz": 2619,
    "sm_max_mhz": 1980,
    "mem_max_mhz": 2619,
    "temp_c": 55,
    "power_w": 420.0,
    "power_limit_w": 700.0,
    "reasons": [],
    "reasons_mask": 0,
}


def timing(median_us: float, rel_noise: float = 0.01, n: int = 200, seed: int = 0, **extra) -> dict:
    """A timing dict as time_closures makes it, from `n` normal samples around `median_us`."""
    rng = random.Random(seed)
    samples = [median_us * 1e-6 * (1 + rng.gauss(0, rel_noise)) for _ in range(n)]
    extra.setdefault("nvml", {"before": SNAP, "after": SNAP | {"temp_c": 58}})
    converged = extra.pop("converged", True)
    st = summarize(samples, "cuda-events", True, converged, wall_s=n * median_us * 2e-6, kernel_s=sum(samples), **extra)
    return st.to_dict()


def row(case_id: str, backend: str, status: str = "pass", median_us: float | None = 100.0, **kw) -> Result:
    """A result row; decode-like parameters are parsed from ids of the form decode/b{B}-l{L}."""
    op = case_id.split("/")[0]
    params = kw.pop("params", None) or {}
    if not params and op == "decode":
        b, l = case_id.split("/")[1].split("-")[:2]
        params = {"batch": int(b[1:]), "kv_len": int(l[1:]), "heads_q": 32, "heads_kv": 8, "head_dim": 128}
    t = kw.pop("timing", None)
    if t is None and median_us is not None and status in ("pass", "fail"):
        t = timing(median_us, seed=hash((case_id, backend)) % 1000)
    metrics = kw.pop("metrics", None)
    if metrics is None and status in ("pass", "fail"):
        err = 3e-3 if status == "pass" else 0.4
        metrics = {
            "o": {
                "bound": 8e-3,
                "twin_max_abs": 3.9e-3,
                "scale": 2.0,
                "max_abs": err,
                "max_rel": err * 10,
                "rel_l2": err / 3,
                "cos": 1 - err / 100,
                "mismatch": 0.0 if status == "pass" else 0.02,
                "worst": {"token": 3, "head": 5, "dim": 17},
                "nonfinite": 0,
            },
            "lse": {
                "bound": 1e-3,
                "twin_max_abs": 2e-4,
                "scale": 9.0,
                "max_abs": 1e-4,
                "max_rel": 1e-5,
                "rel_l2": 1e-6,
                "cos": 1.0,
                "mismatch": 0.0,
                "worst": {"token": 1, "head": 2},
                "nonfinite": 0,
            },
        }
        if status == "fail":
            metrics["o"]["heat"] = [[0.01 * (h + 1) * (1 + (r % 5)) for r in range(16)] for h in range(8)]
    derived = {}
    if t:
        secs = t["median_us"] * 1e-6
        nbytes = 0.6 * 2.95e12 * secs * (0.5 if backend == "torch" else 1.0)  # 60% (torch: 30%) of the roofline
        flops = nbytes * 1.0
        derived = {
            "flops": flops,
            "bytes": nbytes,
            "tflops": flops / secs / 1e12,
            "tbps": nbytes / secs / 1e12,
            "intensity": flops / nbytes,
            "bound_us": nbytes / 2.95e12 * 1e6,
            "roofline_pct": 100 * nbytes / 2.95e12 / secs,
            "limiter": "memory",
        }
    defaults = dict(
        reason={
            "fail": "o: max abs error 0.4 > bound 0.008 at token 3 head 5 dim 17",
            "error": "RuntimeError: boom",
            "skip": f"{backend} has no sliding window",
        }.get(status, ""),
        params=params,
        dtype="bf16",
        suite="decode",
        features=["gqa", "paged"],
        metrics=metrics or {},
        timing=t,
        derived=derived,
        prepare_s=0.02 if status != "skip" else None,
        reference_s=0.5,
        check_s=0.05,
        prepare_info={"plan_s": 0.001} if status != "skip" else {},
        env={"device": "cuda"},
    )
    return Result(case_id=case_id, op=op, backend=backend, status=status, **(defaults | kw))


def timed(cid: str, backend: str, us: float, **kw):
    """A passing row with 0.1% noise and a fixed seed: its median is `us` to about 0.01%."""
    return row(cid, backend, timing=timing(us, rel_noise=0.001, seed=7), **kw)


def lse_finding(cid: str, median_us: float, outputs: str | None = "lse", failed=("lse",)):
    """An xfail row of flashinfer-fa2 whose o passes and lse fails, covered by an expectation declaring
    `outputs` (None: declaring none)."""
    r = row(cid, "flashinfer-fa2", status="fail", median_us=median_us)
    r.metrics["o"]["max_abs"] = 1e-3  # o passes
    r.metrics["o"].pop("heat", None)
    r.metrics["lse"]["max_abs"] = 0.05  # over its bound 1e-3
    r.failed = list(failed)
    r.status = "xfail"
    r.expected = {"why": "fa2 LSE from bf16 probabilities", "where": "findings.yaml:3"} | (
        {"outputs": outputs} if outputs else {}
    )
    return r


def mixed_rows() -> list[Result]:
    """Rows of every kind: pass, fail (with a heatmap), error, skip; graph mode, throttled, unconverged."""
    rows = []
    for b in (1, 16, 64):
        for l in (1024, 4096, 8192):
            cid = f"decode/b{b}-l{l}-h32x8-d128-bf16"
            base = 5.0 + b * l / 2000
            rows.append(row(cid, "torch", median_us=base * 3))
            rows.append(row(cid, "triton", median_us=base))
            rows.append(row(cid, "flashinfer", median_us=base * 0.8))
    graph = timing(8.0, mode="cuda-graph", calls_per_sample=63, copies=63, working_set_bytes=2.6e8)
    rows.append(row("decode/b1-l128-h32x8-d128-bf16", "triton", timing=graph))
    throttled = timing(40.0, n_throttled=30, throttle=["sw power cap"], converged=False)
    rows.append(row("decode/b4-l2048-h32x8-d128-bf16", "triton", timing=throttled))
    rows.append(row("decode/b4-l2048-h32x8-d128-bf16", "broken", status="fail", median_us=30.0))
    rows.append(row("decode/b4-l2048-h32x8-d128-bf16-swa128", "flashinfer", status="skip", features=["swa"]))
    rows.append(row("decode/b4-l2048-h32x8-d128-bf16-swa128", "torch", status="error", median_us=None))
    rows.append(
        row(
            "merge_state/t33-h4-d64-bf16",
            "torch",
            params={"tokens": 33, "heads": 4, "head_dim": 64},
            suite="smoke",
            features=[],
        )
    )
    return rows


def write_run(path: Path, rows: list[Result], env: dict | None = None, run: dict | None = None) -> Path:
    """A run directory as `attnbench sweep` leaves it (before rendering)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with ResultWriter(path / "results.jsonl") as w:
        for r in rows:
            w.append(r)
    (path / "env.json").write_text(json.dumps(ENV if env is None else env))
    run = run or {
        "argv": ["attnbench", "sweep", "decode", "--plugin", "my_kernels.py"],
        "device": "cuda",
        "started": "2026-11-20T10:00:00",
        "finished": "2026-11-20T10:05:00",
        "wall_s": 300.0,
        "complete": True,
    }
    (path / "run.json").write_text(json.dumps(run))
    return path


def relabel_as_gpu_clock(run: Path) -> Path:
    """Rewrite a CPU run's host-clock timings as GPU-clock ones, in place.

    Host-clock rows are correctness-only in compare and gate, and CI has no GPU: relabelled, real
    measured samples (with the host's real noise) reach the speed rule end to end.
    """
    path = Path(run) / "results.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in rows:
        if r.get("timing"):
            r["timing"]["clock"] = "cuda-events"
            r["timing"].pop("interpreter", None)
            r["env"] = (r.get("env") or {}) | {"triton_interpret": False}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Path(run)
